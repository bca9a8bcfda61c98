"""What the tests of the native decoding step share: a decoder's logits over a prompt and tokens, their closeness to
the layer-by-layer decoder's, and the same bits at every vector level and thread count."""

import torch

from mase_lite.runtime.decoder import Decoder
from tests.kernels.levels import every_level_and_thread_count

PROMPT, TOKENS = torch.tensor([[1, 2, 3]]), [4, 5, 6, 7, 8]


def steps(decoder):
    """The decoder's logits after the prompt and after each token."""
    decoder.reset()
    with torch.no_grad():
        return torch.stack([decoder(PROMPT)] + [decoder(torch.tensor([[t]])) for t in TOKENS])


def layer_by_layer(model):
    decoder = Decoder.of(model, 12)
    decoder.step = None
    return steps(decoder)


def assert_follows(native, reference):
    """Equal within float32 rounding, except where a float32 difference moved an activation across an int8
    rounding boundary: one code step of a block, 1/127 of its largest value, reaches the logits at about 1 %."""
    difference = (native - reference).abs()
    assert float(difference.max()) <= 0.01 * float(reference.abs().max())
    assert float(difference.median()) <= 1e-4 * float(reference.abs().max())


def assert_decodes_natively(model, monkeypatch):
    """``model``'s decoder takes the native step, head included, which follows the layer-by-layer decoder and gives
    the same bits at every level and at one and two threads."""
    decoder = Decoder.of(model, 12)
    assert decoder.step is not None and decoder.step.head
    native = steps(decoder)
    assert_follows(native, layer_by_layer(model))
    for level, threads in every_level_and_thread_count(monkeypatch, threads=(1, 2)):
        assert torch.equal(steps(decoder), native), (level, threads)
