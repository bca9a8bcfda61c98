"""The grammar corpus: entropy rate against brute-force enumeration, the Bayes bound against enumeration."""

import itertools
import math
import random

import pytest
import torch

from mase_lite.workloads.grammar import Arc, Grammar, default_grammar


def tiny() -> Grammar:
    """Two states; 'a'/'b' from s0, 'c'/'d'/'a' from s1 ('a' leads to different states from each)."""
    return Grammar(
        {"s0": [Arc("ab", 0.7, "s1"), Arc("d0", 0.3, "s0")], "s1": [Arc("cd", 0.6, "s0"), Arc("a1", 0.4, "s1")]},
        {"ab": {"a": 0.25, "b": 0.75}, "d0": {"e": 1.0}, "cd": {"c": 0.5, "d": 0.5}, "a1": {"f": 0.9, "a": 0.1}},
    )


def enumerate_paths(g: Grammar, n: int):
    """Every (start state, n words) with its probability, the start drawn from the stationary distribution."""
    pi = g.stationary()
    for s0 in range(len(g.states)):
        for words in itertools.product(range(len(g.lexicon)), repeat=n):
            p, s = float(pi[s0]), s0
            for w in words:
                p *= float(g.emit[s, w])
                if p == 0:
                    break
                s = int(g.after[s, w])
            if p > 0:
                yield s0, words, p


def test_a_word_leaving_a_state_by_two_arcs_is_refused():
    with pytest.raises(ValueError, match="word 'a' leaves it by two arcs"):
        Grammar({"s": [Arc("x", 0.5, "s"), Arc("y", 0.5, "s")]}, {"x": {"a": 1.0}, "y": {"a": 1.0}})
    with pytest.raises(ValueError, match="arc probabilities sum to 0.9"):
        Grammar({"s": [Arc("x", 0.9, "s")]}, {"x": {"a": 1.0}})


def test_stationary_distribution_is_left_fixed_point():
    g = tiny()
    pi, T = g.stationary(), g.transition_matrix()
    assert torch.allclose(pi @ T, pi, atol=1e-12) and abs(float(pi.sum()) - 1) < 1e-12
    # by hand: pi0 = 0.3 pi0 + 0.6 pi1 -> pi0 = 6/13
    assert float(pi[0]) == pytest.approx(6 / 13, abs=1e-12)


def test_entropy_rate_equals_brute_force_enumeration():
    """Given the start state the words fix every state, so H(S0, X1..Xn) - H(S0) = n * entropy rate exactly."""
    g = tiny()
    n = 5
    joint = -sum(p * math.log(p) for _, _, p in enumerate_paths(g, n))
    pi = g.stationary()
    h_start = -float((pi * pi.log()).sum())
    assert (joint - h_start) / n == pytest.approx(g.entropy_rate(), abs=1e-12)
    # and by hand: H(s0) = H(0.7 * [.25, .75], 0.3), H(s1) = H(0.6 * [.5, .5], 0.4 * [.9, .1])
    h = lambda ps: -sum(p * math.log(p) for p in ps)
    by_hand = 6 / 13 * h([0.175, 0.525, 0.3]) + 7 / 13 * h([0.3, 0.3, 0.36, 0.04])
    assert g.entropy_rate() == pytest.approx(by_hand, abs=1e-12)


def test_window_loss_is_the_bayes_predictor_found_by_enumeration():
    g = tiny()
    n = 4
    prob = {}
    for _, words, p in enumerate_paths(g, n):
        for t in range(1, n + 1):
            prob[words[:t]] = prob.get(words[:t], 0.0) + p
    rng = random.Random(3)
    windows = [g.word_ids(g.sample(n, rng)) for _ in range(6)]
    scored = torch.ones(6, n, dtype=torch.bool)
    scored[:, 0] = False
    scored[2, 1] = False
    total, count = g.window_loss(torch.tensor(windows), scored)
    expected = 0.0
    for i, w in enumerate(windows):
        for t in range(1, n):
            if scored[i, t]:
                expected -= math.log(prob[tuple(w[: t + 1])] / prob[tuple(w[:t])])
    assert count == 6 * (n - 1) - 1
    assert total == pytest.approx(expected, rel=1e-12)


def test_window_loss_stops_at_padding():
    g = tiny()
    w = torch.tensor([g.word_ids(["a", "c", "b"]) + [-1, -1]])
    scored = torch.tensor([[False, True, True, True, True]])
    full, n_full = g.window_loss(w[:, :3], scored[:, :3])
    padded, n_padded = g.window_loss(w, scored)
    assert (padded, n_padded) == (full, n_full) == (full, 2)


def test_default_grammar_words_agree_in_number_and_its_rate_matches_a_sample():
    g = default_grammar(seed=0)
    assert float(g.stationary().min()) > 0
    words = g.sample(20000, random.Random(1))  # 0.4 % from the rate here: the tolerance has a margin of 4
    assert set(words) <= set(g.lexicon)
    text = " ".join(words)
    assert " cats sleeps" not in text and " cat sleep " not in text and "every big dogs" not in text
    # the generator's own log loss on a long sample (filtering the state) estimates the entropy rate
    ids = torch.tensor([g.word_ids(words)])
    loss, count = g.window_loss(ids, torch.ones_like(ids, dtype=torch.bool))
    assert loss / count == pytest.approx(g.entropy_rate(), rel=0.02)
    assert default_grammar(seed=1).classes != g.classes  # the seed orders word frequencies
