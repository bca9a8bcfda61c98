"""A deterministic generator of labelled movie-review sentences (1 = positive, 0 = negative).

The label follows rules a model has to learn, not single words: negation flips a clause
("was not dull" is positive), a contrast ("... but ...", "although ..., ...") or a closing verdict
("overall ...") decides over the clause before it, and neutral filler carries no signal.

Example::

    texts, labels = generate_sentiment(4, seed=0)
"""

from __future__ import annotations

import random

SUBJECTS = (
    "the movie", "this film", "the plot", "the acting", "the story", "the ending", "the soundtrack",
    "the cast", "the script", "the direction", "the dialogue", "the pacing", "the camera work",
    "the sequel", "the lead actor", "the villain", "the visual design", "the humour", "the finale",
)
POSITIVE = (
    "wonderful", "brilliant", "moving", "charming", "superb", "delightful", "gripping", "excellent",
    "beautiful", "clever", "funny", "touching", "great", "fantastic", "memorable", "stunning",
)
NEGATIVE = (
    "dull", "awful", "boring", "clumsy", "tedious", "terrible", "bland", "predictable", "messy",
    "forgettable", "weak", "painful", "lifeless", "annoying", "poor", "disappointing",
)
INTENSIFIERS = ("", "", "", "very ", "really ", "truly ", "quite ", "rather ", "incredibly ")
VERBS = ("was", "is", "felt", "seemed")
NEGATED_VERBS = ("was not", "is not", "was never", "did not seem")
FILLER = (
    "i saw it last weekend", "we watched it at home", "it runs about two hours",
    "my brother picked it", "it came out in the spring", "the theatre was half full",
    "i went with a friend", "it is based on a novel", "there are three main characters",
    "we got there a bit late", "it was on television on sunday", "the story is set in a small town",
    "i watched it twice", "most of it takes place at night", "the director also wrote it",
)
VERDICTS_POSITIVE = ("i would recommend it", "a must see", "i loved it", "worth every minute")
VERDICTS_NEGATIVE = ("i would not recommend it", "a waste of time", "i hated it", "not worth the ticket")


def _clause(rng: random.Random, positive: bool, negation_rate: float) -> str:
    """A subject-verb-adjective clause whose meaning is ``positive`` (negated with ``negation_rate``)."""
    negated = rng.random() < negation_rate
    adjective_positive = positive != negated
    adjective = rng.choice(POSITIVE if adjective_positive else NEGATIVE)
    verb = rng.choice(NEGATED_VERBS if negated else VERBS)
    return f"{rng.choice(SUBJECTS)} {verb} {rng.choice(INTENSIFIERS)}{adjective}"


def _sentence(rng: random.Random, positive: bool) -> str:
    """One review sentence whose overall sentiment is ``positive``."""
    shape = rng.random()
    if shape < 0.35:
        return _clause(rng, positive, 0.15)
    if shape < 0.55:
        clause = _clause(rng, positive, 0.15)
        filler = rng.choice(FILLER)
        return f"{filler}, and {clause}" if rng.random() < 0.5 else f"{clause}. {filler}"
    if shape < 0.70:
        return f"{_clause(rng, not positive, 0.2)} but {_clause(rng, positive, 0.2)}"
    if shape < 0.80:
        return f"although {_clause(rng, not positive, 0.2)}, {_clause(rng, positive, 0.2)}"
    if shape < 0.90:
        first = _clause(rng, rng.random() < 0.5, 0.2)
        verdict = rng.choice(VERDICTS_POSITIVE if positive else VERDICTS_NEGATIVE)
        return f"{first}. overall, {verdict}"
    return f"{rng.choice(FILLER)}. {_clause(rng, positive, 0.15)}"


def generate_sentiment(n: int, seed: int) -> tuple[list[str], list[int]]:
    """``n`` review sentences and their labels, balanced in expectation, the same for the same seed."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        positive = rng.random() < 0.5
        texts.append(_sentence(rng, positive) + ".")
        labels.append(int(positive))
    return texts, labels
