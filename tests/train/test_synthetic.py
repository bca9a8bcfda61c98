import random

from mase_lite.workloads.synthetic import NEGATED_VERBS, NEGATIVE, POSITIVE, VERBS, _clause, generate_sentiment


def test_same_seed_same_sentences_other_seed_others():
    assert generate_sentiment(50, 3) == generate_sentiment(50, 3)
    assert generate_sentiment(50, 3)[0] != generate_sentiment(50, 4)[0]


def test_prefix_of_a_longer_stream_is_the_shorter_stream():
    texts, labels = generate_sentiment(30, 0)
    more_texts, more_labels = generate_sentiment(60, 0)
    assert (more_texts[:30], more_labels[:30]) == (texts, labels)


def test_zero_rows():
    assert generate_sentiment(0, 0) == ([], [])


def test_labels_balanced_and_every_kind_of_sentence_present():
    texts, labels = generate_sentiment(2000, 0)
    assert set(labels) == {0, 1}
    assert 900 < sum(labels) < 1100
    assert all(t.endswith(".") for t in texts)
    for cue in (" but ", "although ", "overall, ", "was not ", "i watched it twice"):
        assert sum(cue in t for t in texts) > 10, cue


def _words(clause: str) -> tuple[str, str]:
    """(verb phrase, adjective) of a generated clause."""
    adjective = clause.split()[-1]
    verb = next(v for v in NEGATED_VERBS + VERBS if f" {v} " in f" {clause} ")
    return verb, adjective


def test_negation_flips_the_adjective_and_plain_clauses_keep_it():
    rng = random.Random(0)
    for positive in (True, False):
        for _ in range(20):
            verb, adjective = _words(_clause(rng, positive, negation_rate=0.0))
            assert verb in VERBS and adjective in (POSITIVE if positive else NEGATIVE)
            verb, adjective = _words(_clause(rng, positive, negation_rate=1.0))
            assert verb in NEGATED_VERBS and adjective in (NEGATIVE if positive else POSITIVE)


def test_contrast_is_decided_by_the_clause_after_but():
    texts, labels = generate_sentiment(3000, 1)
    checked = 0
    for text, label in zip(texts, labels):
        if " but " not in text or any(v in text for v in NEGATED_VERBS):
            continue
        first, second = text.rstrip(".").split(" but ")
        assert (first.split()[-1] in POSITIVE) != bool(label)
        assert (second.split()[-1] in POSITIVE) == bool(label)
        checked += 1
    assert checked > 100
