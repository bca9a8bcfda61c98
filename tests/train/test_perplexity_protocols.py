"""Perplexity by the protocols papers and llama.cpp report, against hand counts: a model that is uniform over the
vocabulary with one token of context and sure-ish of the next token (logit L on it) with two or more, on the stream
0, 1, ..., so that each protocol's figure is (uniform tokens · log V + peaked tokens · -log q) / tokens."""

import math

import pytest
import torch

from mase_lite.workloads.perplexity import chunks, sliding

V, L = 10, 3.0
Q = math.exp(L) / (math.exp(L) + V - 1)  # the peaked probability of the true next token


def model(seen: list | None = None):
    def logits(ids: torch.Tensor) -> torch.Tensor:
        if seen is not None:
            seen.append(ids.clone())
        out = torch.zeros(*ids.shape, V)
        nxt = (ids + 1) % V
        out[:, 1:].scatter_(-1, nxt[:, 1:, None], L)  # position 0 (one token of context) stays uniform
        return out
    return logits


def expected(uniform: int, peaked: int) -> dict:
    loss = (uniform * math.log(V) - peaked * math.log(Q)) / (uniform + peaked)
    return {"loss": pytest.approx(loss, rel=1e-12), "perplexity": pytest.approx(math.exp(loss), rel=1e-12),
            "tokens": uniform + peaked}


STREAM = torch.arange(12) % V


def test_sliding_scores_each_token_once_with_the_context_left_by_the_stride():
    # windows [0,4) [2,6) [4,8) [6,10) [8,12): token 1 from one token, tokens 2..11 from two or more
    assert sliding(model(), STREAM, context=4, stride=2) == expected(1, 10)
    # stride = context: the plain split; tokens 0, 4, 8 open a window (not scored), 1, 5, 9 have one token before them
    assert sliding(model(), STREAM, context=4, stride=4) == expected(3, 6)
    # a last window shorter than the context: [0,5) [3,8) [6,11) [9,12)
    assert sliding(model(), STREAM, context=5, stride=3) == expected(1, 10)


def test_chunks_score_the_second_half_of_each_whole_chunk_as_llama_cpp():
    seen = []
    # 13 tokens, chunks of 4: three chunks (the 13th token dropped), each scoring position 2's prediction of token 3
    assert chunks(model(seen), torch.arange(13) % V, context=4, batch=2) == expected(0, 3)
    assert [s.shape[0] for s in seen] == [2, 1] and torch.equal(torch.cat(seen)[:, 0], torch.tensor([0, 4, 8]))
    seen.clear()
    assert chunks(model(seen), STREAM, context=6, bos=7) == expected(0, 4)  # 2 chunks of 6: positions 3, 4 each
    assert torch.cat(seen)[:, 0].tolist() == [7, 7] and torch.cat(seen)[:, 1].tolist() == [1, 7]


@pytest.mark.parametrize("call, message", [
    (lambda: sliding(model(), STREAM, context=4, stride=5), r"stride \(5\) <= context \(4\)"),
    (lambda: chunks(model(), STREAM, context=5), r"even context of at least 4 \(5\)"),
    (lambda: chunks(model(), STREAM, context=16), r"one whole chunk \(12 tokens\)"),
])
def test_impossible_sizes_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
