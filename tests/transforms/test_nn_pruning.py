"""Pruning building blocks: exact masks, parametrisation, baking, activation hooks."""

import copy

import pytest
import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.layers.pruning import (
    ActivationPruner,
    WeightMask,
    activation_pruner_of,
    attach_activation_pruner,
    attach_weight_mask,
    bake_weight_mask,
    detach_activation_pruner,
    keep_mask_from_scores,
    prune_count,
    weight_mask_of,
    weight_masks,
)

W = torch.tensor([[0.1, -3.0, 2.0], [-0.5, 4.0, 0.2]])


@pytest.mark.parametrize(
    "n, sparsity, expected", [(5, 0.5, 2), (7, 0.5, 4), (10, 0.0, 0), (10, 1.0, 10), (10, 0.3, 3), (0, 0.5, 0)]
)
def test_prune_count_rounds_half_to_even(n, sparsity, expected):
    assert prune_count(n, sparsity) == expected


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_prune_count_rejects_sparsity_outside_unit_interval(bad):
    with pytest.raises(UserError, match=r"sparsity: .* outside the allowed range \[0, 1\]"):
        prune_count(10, bad)


def test_ties_prune_the_earlier_index():
    keep = keep_mask_from_scores(torch.ones(4), 2)
    assert keep.tolist() == [False, False, True, True]


def test_l1_unstructured_local_prunes_smallest_magnitudes():
    mask = weight_masks({"w": W}, 0.5, "l1-norm", "unstructured")["w"]
    assert mask.tolist() == [[False, True, True], [False, True, False]]


@pytest.mark.parametrize("granularity", ["row", "channel"])
def test_l1_structured_prunes_whole_output_rows_by_mean_magnitude(granularity):
    # row means: 5.1 / 3 = 1.7 and 4.7 / 3 = 1.567 -> the second row goes
    mask = weight_masks({"w": W}, 0.5, "l1-norm", granularity)["w"]
    assert mask.tolist() == [[True, True, True], [False, False, False]]


def test_structured_conv_prunes_output_channels():
    w = torch.zeros(4, 2, 3, 3)
    for c, scale in enumerate([3.0, 1.0, 4.0, 2.0]):
        w[c] = scale
    mask = weight_masks({"conv": w}, 0.5, "l1-norm", "channel")["conv"]
    assert mask.shape == w.shape
    assert [bool(mask[c].all()) for c in range(4)] == [True, False, True, False]
    assert [bool(mask[c].any()) for c in range(4)] == [True, False, True, False]


def test_global_scope_ranks_all_weights_together():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[0.5, 10.0]])
    masks = weight_masks({"a": a, "b": b}, 0.5, "l1-norm", "unstructured", scope="global")
    assert masks["a"].tolist() == [[False, False], [True, True]]
    assert masks["b"].tolist() == [[False, True]]


def test_random_prunes_exact_count_and_is_seeded():
    w = torch.randn(7, 11)
    first = weight_masks({"w": w}, 0.3, "random")["w"]
    again = weight_masks({"w": w}, 0.3, "random")["w"]
    other = weight_masks({"w": w}, 0.3, "random", seed=1)["w"]
    assert int((~first).sum()) == round(0.3 * 77) == 23
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_random_global_prunes_exact_total():
    weights = {"a": torch.randn(5, 5), "b": torch.randn(3, 9)}
    masks = weight_masks(weights, 0.4, "random", scope="global")
    assert sum(int((~m).sum()) for m in masks.values()) == round(0.4 * 52) == 21


@pytest.mark.parametrize("sparsity, pruned", [(0.0, 0), (1.0, 6)])
def test_sparsity_edges(sparsity, pruned):
    mask = weight_masks({"w": W}, sparsity, "l1-norm")["w"]
    assert int((~mask).sum()) == pruned


def test_nan_counts_as_largest_magnitude_and_inf_is_kept():
    w = torch.tensor([float("nan"), 0.0, -1.0, float("inf"), 2.0])
    mask = weight_masks({"w": w}, 0.6, "l1-norm")["w"]
    assert mask.tolist() == [True, False, False, True, False]


def test_rank_zero_weight():
    mask = weight_masks({"w": torch.tensor(3.0)}, 1.0, "l1-norm", "row")["w"]
    assert mask.shape == () and not bool(mask)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_masks_for_low_and_high_precision_weights(dtype):
    w = W.to(dtype)
    mask = weight_masks({"w": w}, 0.5, "l1-norm")["w"]
    assert mask.tolist() == [[False, True, True], [False, True, False]]
    masked = WeightMask(mask)(w)
    assert masked.dtype == dtype
    assert masked.tolist() == w.masked_fill(~mask, 0).tolist()


def test_weight_mask_zeroes_pruned_nan_and_blocks_their_gradient():
    w = torch.tensor([float("nan"), 1.0, float("-inf")], requires_grad=True)
    out = WeightMask(torch.tensor([False, True, False]))(w)
    assert out.tolist() == [0.0, 1.0, 0.0]
    out.sum().backward()
    assert w.grad.tolist() == [0.0, 1.0, 0.0]


def test_attached_mask_is_a_buffer_in_the_state_dict_and_keeps_the_parameter():
    fc = nn.Linear(3, 2)
    weight = fc.weight
    with torch.no_grad():
        fc.weight.copy_(W)
    keep = weight_masks({"w": fc.weight}, 0.5)["w"]
    attach_weight_mask(fc, keep)
    assert isinstance(fc, nn.Linear)
    assert fc.parametrizations.weight.original is weight
    assert set(fc.state_dict()) == {"bias", "parametrizations.weight.original", "parametrizations.weight.0.mask"}
    assert fc.weight.tolist() == [[0.0, -3.0, 2.0], [0.0, 4.0, 0.0]]
    x = torch.randn(4, 3)
    fc(x).sum().backward()
    assert weight.grad[~keep].abs().sum() == 0
    assert weight.grad[keep].abs().sum() > 0


def test_second_mask_narrows_the_first():
    fc = nn.Linear(2, 2)
    attach_weight_mask(fc, torch.tensor([[True, True], [False, True]]))
    attach_weight_mask(fc, torch.tensor([[True, False], [True, True]]))
    assert len(fc.parametrizations.weight) == 1
    assert weight_mask_of(fc).mask.tolist() == [[True, False], [False, True]]


def test_mask_shape_mismatch_is_a_user_error():
    with pytest.raises(UserError, match=r"mask shape \(3,\) does not match weight shape \(2, 3\)"):
        attach_weight_mask(nn.Linear(3, 2), torch.ones(3, dtype=torch.bool))


def test_bake_writes_zeros_into_the_same_parameter_and_removes_the_mask():
    fc = nn.Linear(3, 2)
    weight = fc.weight
    with torch.no_grad():
        fc.weight.copy_(W)
    attach_weight_mask(fc, weight_masks({"w": W}, 0.5)["w"])
    assert bake_weight_mask(fc) is True
    assert type(fc) is nn.Linear
    assert fc.weight is weight
    assert fc.weight.tolist() == [[0.0, -3.0, 2.0], [0.0, 4.0, 0.0]]
    assert set(fc.state_dict()) == {"weight", "bias"}
    assert bake_weight_mask(fc) is False


def test_activation_l1_prunes_per_sample_with_ties_to_earlier_index():
    pruner = ActivationPruner(0.5, "l1-norm")
    x = torch.tensor([[1.0, -5.0, 2.0, 0.5], [3.0, 3.0, 3.0, 3.0]])
    assert pruner.prune(x).tolist() == [[0.0, -5.0, 2.0, 0.0], [0.0, 0.0, 3.0, 3.0]]


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 4), (2, 3, 4, 5)])
def test_activation_pruning_any_rank_exact_counts(shape):
    x = torch.randn(shape) + 10.0
    for method in ("l1-norm", "random"):
        out = ActivationPruner(0.5, method).prune(x)
        per_sample = 1 if x.dim() <= 1 else x.shape[0]
        n = x.numel() // per_sample
        assert out.shape == x.shape
        assert int((out == 0).sum()) == per_sample * round(0.5 * n)


def test_activation_pruning_keeps_dtype_and_gradient_of_kept_elements():
    x = torch.tensor([[1.0, -4.0, 0.25, 2.0]], dtype=torch.bfloat16, requires_grad=True)
    out = ActivationPruner(0.5, "l1-norm").prune(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.float().tolist() == [[0.0, 1.0, 0.0, 1.0]]


def test_activation_hook_counts_and_detaches_cleanly():
    fc = nn.Linear(4, 3)
    x = torch.tensor([[1.0, -5.0, 2.0, 0.5], [3.0, 1.0, 3.0, 3.0]])
    reference = fc(x)
    pruner = attach_activation_pruner(fc, ActivationPruner(0.25, "l1-norm"))
    assert activation_pruner_of(fc) is pruner
    pruned = fc(x)
    expected = fc.weight.new_tensor([[1.0, -5.0, 2.0, 0.0], [3.0, 0.0, 3.0, 3.0]])
    torch.testing.assert_close(pruned, nn.functional.linear(expected, fc.weight, fc.bias))
    assert (pruner.zeros, pruner.total) == (2, 8)
    assert pruner.achieved == 0.25
    assert detach_activation_pruner(fc) is True
    assert activation_pruner_of(fc) is None and len(fc._forward_pre_hooks) == 0
    assert torch.equal(fc(x), reference)
    assert detach_activation_pruner(fc) is False
    assert set(fc.state_dict()) == {"weight", "bias"}


def test_attaching_twice_replaces_the_hook():
    fc = nn.Linear(4, 3)
    attach_activation_pruner(fc, ActivationPruner(0.5))
    attach_activation_pruner(fc, ActivationPruner(0.25))
    assert len(fc._forward_pre_hooks) == 1
    assert activation_pruner_of(fc).sparsity == 0.25


def test_detach_works_on_a_deep_copy_and_leaves_the_original_pruned():
    fc = nn.Linear(4, 3)
    attach_activation_pruner(fc, ActivationPruner(0.5))
    clone = copy.deepcopy(fc)
    assert detach_activation_pruner(clone) is True
    assert len(clone._forward_pre_hooks) == 0
    assert len(fc._forward_pre_hooks) == 1 and activation_pruner_of(fc) is not None


def test_random_activation_pruning_is_seeded_and_resettable():
    x = torch.randn(3, 10)
    a, b = ActivationPruner(0.5, "random", seed=3), ActivationPruner(0.5, "random", seed=3)
    assert torch.equal(a.prune(x), b.prune(x))
    a(nn.Identity(), (x,))
    assert a.achieved == 0.5
    a.reset()
    assert a.achieved is None
