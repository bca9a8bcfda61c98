"""Every vector level of the CPU kernels and every thread count a bit-exactness test runs at, and the check that a
layer gives the same bits at all of them."""

import torch

from mase_lite.kernels import cpu


def every_level_and_thread_count(monkeypatch, threads=(1, 2, 3)):
    """Yield ``(level, count)`` with the kernels' level and torch's thread count set to each in turn; torch's thread
    count is restored after, also where the caller's check fails."""
    previous = torch.get_num_threads()
    try:
        for level in cpu.available_levels():
            monkeypatch.setenv(cpu.LEVEL_ENV, level)
            for count in threads:
                torch.set_num_threads(count)
                yield level, count
    finally:
        torch.set_num_threads(previous)


def bits32(t):
    """``t``'s float32 bits (NaNs compare by their bits)."""
    return t.float().contiguous().view(torch.int32)


def assert_same_bits_everywhere(layer, in_features, monkeypatch):
    """``layer`` (int8 activations) gives the same bits at every level and thread count, a row alone the bits it gives
    in a batch of 9, and an infinity in x only its own row's outputs NaN."""
    x = torch.randn(9, in_features) * 4
    x[2, 100] = float("inf")  # its block's outputs are NaN
    first = None
    for level, threads in every_level_and_thread_count(monkeypatch):
        with torch.no_grad():
            out = torch.cat([layer(x), layer(x[4:5])])
        first = out if first is None else first
        assert torch.equal(bits32(out), bits32(first)), (level, threads)
    assert torch.equal(bits32(first[4]), bits32(first[9]))  # a row alone gives the bits it gives in a batch
    assert bool(first[2].isnan().all()) and not bool(first[[0, 1, 3]].isnan().any())
