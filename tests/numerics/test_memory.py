"""Result allocation: huge-page advice over the whole 2 MiB pages of large CPU results only."""

import torch

from mase_lite.numerics import memory


def test_large_results_are_advised_over_their_whole_huge_pages(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_madvise", lambda: (lambda start, length, advice: calls.append((start, length)), 14))
    big = memory.empty_like_advised(torch.empty(3, 1024, 1024))      # 12 MiB
    (start, length), = calls
    begin, end = big.data_ptr(), big.data_ptr() + big.numel() * 4
    assert start % memory.HUGE_PAGE_BYTES == 0 and length % memory.HUGE_PAGE_BYTES == 0
    assert begin <= start < begin + memory.HUGE_PAGE_BYTES and end - memory.HUGE_PAGE_BYTES < start + length <= end

    calls.clear()
    small = memory.empty_like_advised(torch.empty(1024, 1024))        # 4 MiB: below ADVISE_FROM_BYTES
    assert calls == [] and small.shape == (1024, 1024)


def test_results_keep_shape_and_dtype_and_hold_what_is_written():
    like = torch.arange(6.0, dtype=torch.float64).reshape(2, 3).t()
    out = memory.empty_like_advised(like)
    assert out.shape == (3, 2) and out.dtype == torch.float64 and out.is_contiguous()
    big = memory.empty_like_advised(torch.empty(4096, 1024))
    big.fill_(1.5)
    assert big.sum().item() == 1.5 * 4096 * 1024
