"""LoRALinear: unchanged output at insertion, frozen base, kept bias, gradients, merge."""

import pytest
import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.layers.lora import LoRALinear
from mase_lite.layers.pruning import attach_weight_mask, weight_mask_of


def make(rank=4, alpha=8.0, dropout=0.0, bias=True, dtype=torch.float32):
    torch.manual_seed(0)
    base = nn.Linear(6, 5, bias=bias, dtype=dtype)
    return base, LoRALinear(base, rank=rank, alpha=alpha, dropout=dropout)


@pytest.mark.parametrize("bias", [True, False])
def test_output_is_unchanged_at_insertion(bias):
    base, lora = make(bias=bias, dropout=0.5)
    x = torch.randn(3, 2, 6)
    expected = base(x)
    lora.train()
    assert torch.equal(lora(x), expected)
    assert lora.lora_B.abs().sum() == 0


def test_base_is_frozen_bias_kept_and_only_adapters_train():
    base, lora = make()
    weight, bias = base.weight, base.bias
    assert lora.base is base and base.bias is bias
    trainable = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert trainable == {"lora_A", "lora_B"}
    assert not weight.requires_grad and not bias.requires_grad
    assert lora.lora_A.shape == (4, 6) and lora.lora_B.shape == (5, 4)
    assert lora.scaling == 2.0


def test_gradient_reaches_adapters_only_and_matches_hand_derivation():
    base, lora = make(rank=2, alpha=2.0)
    x = torch.randn(4, 6)
    lora(x).sum().backward()
    assert base.weight.grad is None and base.bias.grad is None
    # L = sum(x A^T B^T) * s  ->  dL/dB[o, r] = s * sum_n (x A^T)[n, r]; dL/dA = 0 while B = 0
    expected_b = (x @ lora.lora_A.detach().T).sum(0).expand(5, 2) * lora.scaling
    torch.testing.assert_close(lora.lora_B.grad, expected_b)
    assert torch.count_nonzero(lora.lora_A.grad) == 0

    with torch.no_grad():
        lora.lora_B.fill_(1.0)
    lora.zero_grad()
    lora(x).sum().backward()
    # dL/dA[r, i] = s * sum_o B[o, r] * sum_n x[n, i] = s * 5 * sum_n x[n, i]
    torch.testing.assert_close(lora.lora_A.grad, (lora.scaling * 5 * x.sum(0)).expand(2, 6))


def test_update_follows_the_formula_and_dropout_acts_in_train_mode_only():
    base, lora = make(rank=3, alpha=6.0, dropout=0.9)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(8, 6)
    lora.eval()
    expected = base(x) + 2.0 * (x @ lora.lora_A.T @ lora.lora_B.T)
    torch.testing.assert_close(lora(x), expected)
    lora.train()
    assert not torch.allclose(lora(x), expected)


@pytest.mark.parametrize("bias", [True, False])
def test_merge_gives_a_plain_linear_with_the_same_output(bias):
    base, lora = make(bias=bias)
    with torch.no_grad():
        lora.lora_B.normal_()
    lora.eval()
    x = torch.randn(7, 6)
    merged = lora.merged()
    assert type(merged) is nn.Linear
    torch.testing.assert_close(merged(x), lora(x), rtol=1e-5, atol=1e-5)
    assert merged.weight.requires_grad  # trainable as the base was before it was wrapped
    if bias:
        assert torch.equal(merged.bias, base.bias) and merged.bias is not base.bias and merged.bias.requires_grad
    else:
        assert merged.bias is None


def test_merge_keeps_a_base_frozen_before_wrapping_frozen():
    base = nn.Linear(6, 5)
    base.weight.requires_grad_(False)
    merged = LoRALinear(base, rank=2).merged()
    assert (merged.weight.requires_grad, merged.bias.requires_grad) == (False, True)


def masked_lora():
    torch.manual_seed(0)
    base = nn.Linear(6, 5)
    keep = torch.rand(5, 6) > 0.5
    attach_weight_mask(base, keep)
    lora = LoRALinear(base, rank=2, alpha=4.0)
    with torch.no_grad():
        lora.lora_B.normal_()
    return lora, keep


def base_weight(lora):
    return lora.base.parametrizations.weight.original


def test_a_pruned_base_masks_the_update_too():
    lora, keep = masked_lora()
    x = torch.randn(3, 6)
    dense_update = 2.0 * (lora.lora_B @ lora.lora_A)
    expected = x @ (torch.where(keep, base_weight(lora) + dense_update, 0.0)).T + lora.base.bias
    torch.testing.assert_close(lora(x), expected)
    lora(x).sum().backward()
    assert torch.count_nonzero(lora.lora_B.grad) > 0 and lora.base.parametrizations.weight.original.grad is None


def test_merge_of_a_pruned_base_keeps_the_mask_and_the_function():
    lora, keep = masked_lora()
    x = torch.randn(4, 6)
    merged = lora.merged()
    mask = weight_mask_of(merged)
    assert mask is not None and torch.equal(mask.mask, keep) and mask is not weight_mask_of(lora.base)
    assert torch.count_nonzero(merged.parametrizations.weight.original[~keep]) == 0
    torch.testing.assert_close(merged(x), lora(x), rtol=1e-6, atol=1e-6)
    original = merged.parametrizations.weight.original
    assert original.requires_grad
    merged(x).sum().backward()  # later training keeps the pruned weights at zero
    assert torch.count_nonzero(original.grad[~keep]) == 0 and torch.count_nonzero(original.grad[keep]) > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_adapters_and_merge_keep_dtype(dtype):
    base, lora = make(dtype=dtype)
    assert lora.lora_A.dtype == dtype and lora.lora_B.dtype == dtype
    assert lora.merged().weight.dtype == dtype
    x = torch.randn(2, 6, dtype=dtype)
    assert torch.equal(lora(x), base(x))


def test_seeded_generator_makes_a_reproducible():
    base = nn.Linear(6, 5)
    a = LoRALinear(base, rank=2, generator=torch.Generator().manual_seed(7))
    b = LoRALinear(nn.Linear(6, 5), rank=2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.lora_A, b.lora_A)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"rank": 0}, r"rank: 0 must be a positive integer"), ({"dropout": 1.0}, r"dropout: 1.0 must be in \[0, 1\)")],
)
def test_bad_arguments_are_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        LoRALinear(nn.Linear(2, 2), **kwargs)


def test_only_linears_are_wrapped():
    with pytest.raises(UserError, match="LoRA wraps nn.Linear modules, got Conv1d"):
        LoRALinear(nn.Conv1d(2, 2, 1))
