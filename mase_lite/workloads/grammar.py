"""A seeded probabilistic grammar whose entropy per token is known exactly: the default language corpus.

The grammar is a unifilar probabilistic automaton over words: from each state, each word leads to
exactly one next state (word classes leaving a state never share a word). Sentences agree in number
across any run of adjectives ("every small red cat sleeps", "some red cats sleep"), take objects,
prepositional phrases and adverbs, and join with conjunctions. Because the state after a word is a
function of the state before it, the entropy rate is exact: ``H = sum_s pi(s) H(word | s)`` with
``pi`` the stationary distribution over states. A model that sees a window of text can do no better
than the Bayes predictor that filters the state from the same window (:meth:`Grammar.window_loss`),
whose perplexity on a split is the best reachable one.

Example::

    >>> g = default_grammar(seed=0)
    >>> words = g.sample(12, random.Random(0))
    >>> len(words), all(w in g.lexicon for w in words)
    (12, True)
    >>> 1.0 < math.exp(g.entropy_rate()) < len(g.lexicon)
    True
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Arc:
    """From a state: a word class taken with ``prob``, leading to ``target``."""

    word_class: str
    prob: float
    target: str


class Grammar:
    """States with arcs over word classes; each class has its own words and word probabilities.

    Args:
        states: ``{state: [Arc, ...]}``; each state's arc probabilities sum to 1.
        classes: ``{word class: {word: probability}}``; each class's probabilities sum to 1.
    """

    def __init__(self, states: dict[str, list[Arc]], classes: dict[str, dict[str, float]]):
        self.states = list(states)
        self.arcs = states
        self.classes = classes
        self.lexicon = sorted({w for words in classes.values() for w in words})
        self._index = {w: i for i, w in enumerate(self.lexicon)}
        state_index = {s: i for i, s in enumerate(self.states)}
        S, W = len(self.states), len(self.lexicon)
        emit = torch.zeros(S, W, dtype=torch.float64)  # P(word | state)
        after = torch.full((S, W), -1, dtype=torch.long)  # the state a word leads to
        for s, arcs in states.items():
            i = state_index[s]
            if abs(sum(a.prob for a in arcs) - 1) > 1e-9:
                raise ValueError(f"grammar state {s!r}: arc probabilities sum to {sum(a.prob for a in arcs)}")
            for arc in arcs:
                for word, p in classes[arc.word_class].items():
                    j = self._index[word]
                    if after[i, j] >= 0:
                        raise ValueError(f"grammar state {s!r}: word {word!r} leaves it by two arcs (not unifilar)")
                    emit[i, j] = arc.prob * p
                    after[i, j] = state_index[arc.target]
        for name, words in classes.items():
            if abs(sum(words.values()) - 1) > 1e-9:
                raise ValueError(f"word class {name!r}: probabilities sum to {sum(words.values())}")
        self.emit, self.after = emit, after

    def transition_matrix(self) -> torch.Tensor:
        """``T[s, t]``: the probability that state ``s`` moves to state ``t`` (float64)."""
        S = len(self.states)
        T = torch.zeros(S, S, dtype=torch.float64)
        for s in range(S):
            ok = self.after[s] >= 0
            T[s].index_add_(0, self.after[s][ok], self.emit[s][ok])
        return T

    def stationary(self) -> torch.Tensor:
        """The stationary distribution over states: the left eigenvector of ``T`` for eigenvalue 1."""
        T = self.transition_matrix()
        S = len(self.states)
        # solve pi (T - I) = 0 with sum(pi) = 1 as a least-squares system (exact for an irreducible chain)
        A = torch.cat([(T - torch.eye(S, dtype=torch.float64)).T, torch.ones(1, S, dtype=torch.float64)])
        b = torch.zeros(S + 1, dtype=torch.float64)
        b[-1] = 1
        return torch.linalg.lstsq(A, b.unsqueeze(1)).solution.squeeze(1)

    def state_entropy(self) -> torch.Tensor:
        """``H(word | state)`` in nats for every state."""
        p = self.emit
        return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(1)

    def entropy_rate(self) -> float:
        """The entropy per token of the stationary process, in nats: ``sum_s pi(s) H(word | s)``."""
        return float(self.stationary() @ self.state_entropy())

    def sample(self, n: int, rng: random.Random) -> list[str]:
        """``n`` words of the stationary process (the first state drawn from the stationary distribution)."""
        pi = self.stationary().tolist()
        state = rng.choices(range(len(self.states)), weights=pi)[0]
        rows = [(self.emit[s] > 0).nonzero().squeeze(1).tolist() for s in range(len(self.states))]
        weights = [self.emit[s, rows[s]].tolist() for s in range(len(self.states))]
        words = []
        for _ in range(n):
            j = rng.choices(rows[state], weights=weights[state])[0]
            words.append(self.lexicon[j])
            state = int(self.after[state, j])
        return words

    def word_ids(self, words: Sequence[str]) -> list[int]:
        """The lexicon index of each word."""
        return [self._index[w] for w in words]

    def window_loss(self, windows: torch.Tensor, scored: torch.Tensor) -> tuple[float, int]:
        """``(sum of -log p, count)`` of the Bayes-optimal predictor over ``scored`` positions.

        ``windows`` holds lexicon indices ``[n, length]`` (``-1`` past a window's end); the predictor
        knows the grammar and only the window's earlier words, starting from the stationary
        distribution, exactly as a model reading the same window.
        """
        n, length = windows.shape
        S = len(self.states)
        belief = self.stationary().expand(n, S).clone()
        total, count = 0.0, 0
        for t in range(length):
            x = windows[:, t]
            live = x >= 0
            if not live.any():
                break
            xs = x.clamp(min=0)
            joint = belief * self.emit[:, xs].T  # [n, S]: P(state, word)
            p = joint.sum(1)
            use = scored[:, t] & live
            if use.any():
                total -= float(p[use].log().sum())
                count += int(use.sum())
            nxt = self.after[:, xs].T.clamp(min=0)  # [n, S]
            new = torch.zeros_like(belief)
            new.scatter_add_(1, nxt, joint)
            new = new / p.clamp(min=1e-300).unsqueeze(1)
            belief = torch.where(live.unsqueeze(1), new, belief)
        return total, count


def _zipf(words: Sequence[str], rng: random.Random, exponent: float = 1.0) -> dict[str, float]:
    """Zipf probabilities over ``words`` in a seeded random rank order."""
    ranked = list(words)
    rng.shuffle(ranked)
    weights = [1.0 / (r + 1) ** exponent for r in range(len(ranked))]
    total = sum(weights)
    return {w: x / total for w, x in zip(ranked, weights)}


NOUNS = (
    ("cat", "cats"), ("dog", "dogs"), ("bird", "birds"), ("child", "children"), ("farmer", "farmers"),
    ("teacher", "teachers"), ("horse", "horses"), ("friend", "friends"), ("robot", "robots"), ("king", "kings"),
    ("student", "students"), ("baker", "bakers"), ("sailor", "sailors"), ("doctor", "doctors"), ("fox", "foxes"),
    ("mouse", "mice"), ("wolf", "wolves"), ("girl", "girls"), ("boy", "boys"), ("queen", "queens"),
    ("box", "boxes"), ("apple", "apples"), ("book", "books"), ("ship", "ships"), ("tree", "trees"),
)
TRANSITIVE = (
    ("sees", "see"), ("likes", "like"), ("finds", "find"), ("takes", "take"), ("follows", "follow"),
    ("helps", "help"), ("watches", "watch"), ("visits", "visit"), ("carries", "carry"), ("paints", "paint"),
    ("remembers", "remember"), ("chases", "chase"), ("greets", "greet"), ("builds", "build"),
)
INTRANSITIVE = (
    ("sleeps", "sleep"), ("runs", "run"), ("waits", "wait"), ("sings", "sing"), ("laughs", "laugh"),
    ("dances", "dance"), ("falls", "fall"), ("swims", "swim"), ("works", "work"), ("smiles", "smile"),
)
ADJECTIVES = (
    "big", "small", "red", "green", "old", "young", "happy", "quiet", "clever", "brave", "tired", "strange",
    "tall", "kind", "lazy", "bright", "dark", "gentle", "wild", "proud",
)
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar")
ADVERBS = ("quickly", "again", "often", "today", "slowly", "outside", "together", "happily")
PREPOSITIONS = ("near", "behind", "under", "with", "beside", "above", "without")


def default_grammar(seed: int = 0) -> Grammar:
    """The default corpus's grammar: English-like clauses with number agreement; ``seed`` orders word frequencies."""
    rng = random.Random(seed)
    classes = {
        "det_sg": _zipf(("a", "every", "one", "this", "each", "that", "the"), rng),
        "det_pl": _zipf(("some", "many", "these", "two", "three", "those", "all"), rng),
        "noun_sg": _zipf([s for s, _ in NOUNS], rng),
        "noun_pl": _zipf([p for _, p in NOUNS], rng),
        "vt_sg": _zipf([s for s, _ in TRANSITIVE], rng),
        "vt_pl": _zipf([p for _, p in TRANSITIVE], rng),
        "vi_sg": _zipf([s for s, _ in INTRANSITIVE], rng),
        "vi_pl": _zipf([p for _, p in INTRANSITIVE], rng),
        "is": {"is": 1.0},
        "are": {"are": 1.0},
        "adj": _zipf(ADJECTIVES, rng),
        "name": _zipf(NAMES, rng),
        "pron_pl": _zipf(("we", "they"), rng),
        "adv": _zipf(ADVERBS, rng),
        "prep": _zipf(PREPOSITIONS, rng),
        "conj": _zipf(("and", "but"), rng),
        "period": {".": 1.0},
    }
    A = Arc
    states = {
        "start": [A("det_sg", 0.35, "np_sg"), A("det_pl", 0.3, "np_pl"), A("name", 0.2, "vp_sg"), A("pron_pl", 0.15, "vp_pl")],
        "np_sg": [A("adj", 0.3, "np_sg"), A("noun_sg", 0.7, "vp_sg")],
        "np_pl": [A("adj", 0.3, "np_pl"), A("noun_pl", 0.7, "vp_pl")],
        "vp_sg": [A("vt_sg", 0.5, "object"), A("vi_sg", 0.3, "end"), A("is", 0.2, "predicate")],
        "vp_pl": [A("vt_pl", 0.5, "object"), A("vi_pl", 0.3, "end"), A("are", 0.2, "predicate")],
        "predicate": [A("adj", 1.0, "end")],
        "object": [A("det_sg", 0.5, "obj_sg"), A("det_pl", 0.35, "obj_pl"), A("name", 0.15, "end")],
        "obj_sg": [A("adj", 0.3, "obj_sg"), A("noun_sg", 0.7, "end")],
        "obj_pl": [A("adj", 0.3, "obj_pl"), A("noun_pl", 0.7, "end")],
        "end": [A("period", 0.6, "start"), A("prep", 0.2, "pp"), A("adv", 0.1, "closing"), A("conj", 0.1, "start")],
        "pp": [A("det_sg", 0.6, "pp_sg"), A("det_pl", 0.4, "pp_pl")],
        "pp_sg": [A("adj", 0.2, "pp_sg"), A("noun_sg", 0.8, "closing")],
        "pp_pl": [A("adj", 0.2, "pp_pl"), A("noun_pl", 0.8, "closing")],
        "closing": [A("period", 0.85, "start"), A("conj", 0.15, "start")],
    }
    return Grammar(states, classes)
