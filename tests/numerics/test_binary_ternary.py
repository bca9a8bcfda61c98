"""binary, binary_scaling, binary_residual_sign and ternary: levels, ranks, statistics, training."""

import math

import pytest
import torch

from mase_lite.numerics import quantize, residual_level_means, residual_sign

INF, NAN = math.inf, math.nan
X = torch.tensor([-2.0, -0.5, 0.0, 0.3, INF, -INF, NAN])


def _same(y, expected):
    expected = torch.tensor(expected)
    return torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.nan_to_num(9.0), expected.nan_to_num(9.0))


def test_binary_bipolar_table():
    assert _same(quantize(X, "binary"), [-1.0, -1.0, 1.0, 1.0, 1.0, -1.0, NAN])


def test_binary_zero_one_table():
    assert _same(quantize(X, "binary", bipolar=False), [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, NAN])


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 3, 4), (2, 1, 3, 5), (1, 2, 1, 3, 2)])
@pytest.mark.parametrize("fmt, params", [("binary", {"bipolar": False}), ("ternary", {}), ("binary", {"stochastic": True})])
def test_zero_one_binary_and_ternary_take_any_rank(shape, fmt, params):
    x = torch.randn(shape)
    y = quantize(x, fmt, **params)
    assert y.shape == x.shape


def test_stochastic_binary_is_unbiased_inside_minus_one_one():
    torch.manual_seed(0)
    x = torch.tensor([-3.0, -0.5, 0.5, 3.0]).repeat(20000, 1)
    y = quantize(x, "binary", stochastic=True)
    mean = y.mean(dim=0)
    assert mean[0].item() == -1.0 and mean[3].item() == 1.0
    assert mean[1].item() == pytest.approx(-0.5, abs=0.03) and mean[2].item() == pytest.approx(0.5, abs=0.03)
    zero_one = quantize(x, "binary", stochastic=True, bipolar=False)
    assert set(zero_one.unique().tolist()) == {0.0, 1.0}
    assert zero_one.mean(dim=0)[2].item() == pytest.approx(0.75, abs=0.03)


def test_binary_scaling_uses_the_mean_magnitude_of_each_output_row():
    w = torch.tensor([[0.5, -1.5], [2.0, 0.0]])
    assert quantize(w, "binary_scaling").tolist() == [[1.0, -1.0], [1.0, 1.0]]
    conv = torch.tensor([[[[1.0, -3.0]], [[0.0, 4.0]]], [[[0.5, 0.5]], [[-0.5, -0.5]]]])  # (2, 2, 1, 2)
    assert quantize(conv, "binary_scaling").flatten().tolist() == [2.0, -2.0, 2.0, 2.0, 0.5, 0.5, -0.5, -0.5]
    assert quantize(torch.tensor([1.0, -2.0, 3.0]), "binary_scaling").tolist() == [2.0, -2.0, 2.0]
    assert quantize(torch.tensor(-3.0), "binary_scaling").item() == -3.0


def test_binary_scaling_ignores_non_finite_values_in_alpha():
    y = quantize(torch.tensor([[1.0, -3.0, INF, NAN]]), "binary_scaling")
    assert y[0, :3].tolist() == [2.0, -2.0, 2.0] and math.isnan(y[0, 3].item())


def test_residual_sign_table():
    # mean_0 = 2.5, b_0 = [1, 1, 1, -1], residual [-1.5, -0.5, 0.5, -1.5]; mean_1 = 1, b_1 = [-1, -1, 1, -1]
    x = torch.tensor([1.0, 2.0, 3.0, -4.0])
    assert residual_level_means(x, 2).tolist() == [2.5, 1.0]
    assert quantize(x, "binary_residual_sign", levels=2).tolist() == [1.5, 1.5, 3.5, -3.5]
    assert quantize(x, "binary_residual_sign", levels=1).tolist() == [2.5, 2.5, 2.5, -2.5]


def test_residual_sign_with_given_means_and_its_gradients():
    means = torch.nn.Parameter(torch.tensor([1.0, 0.5]))
    x = torch.tensor([0.8, -2.0, 0.0], requires_grad=True)
    y = residual_sign(x, means)
    assert y.tolist() == [0.5, -1.5, 0.5]  # signs: [+,-], [-,-], [+,-]
    y.backward(torch.tensor([1.0, 2.0, 3.0]))
    assert x.grad.tolist() == [1.0, 2.0, 3.0]
    assert means.grad.tolist() == [1 * 1 - 2 * 1 + 3 * 1, -1 - 2 - 3]


def test_residual_sign_clipped_gradient_stops_beyond_the_reach():
    means = torch.nn.Parameter(torch.tensor([1.0, 0.5]))
    x = torch.tensor([1.4, -1.6, 2.0], requires_grad=True)
    residual_sign(x, means, ste="clipped").sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 0.0]


def test_residual_sign_trains_in_a_linear():
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = x @ torch.randn(16, 4)
    weight = torch.nn.Parameter(torch.randn(4, 16) * 0.1)
    means = torch.nn.Parameter(residual_level_means(weight.detach(), 2))
    start_means = means.detach().clone()
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.mse_loss(x @ residual_sign(weight, means).t(), y)
        weight.grad = means.grad = None
        loss.backward()
        assert means.grad.abs().sum() > 0
        with torch.no_grad():
            weight -= 0.05 * weight.grad
            means -= 0.002 * means.grad  # a mean collects the gradient of every element
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert not torch.equal(means.detach(), start_means)


def test_ternary_table():
    x = torch.tensor([0.1, -0.9, 0.5, 0.0, 0.3, INF, NAN])
    y = quantize(x, "ternary", threshold=0.3)
    # above 0.3: -0.9, 0.5 (0.3 itself is not above); alpha = 0.7; Inf -> alpha
    assert _same(y, [0.0, -0.7, 0.7, 0.0, 0.0, 0.7, NAN])
    unscaled = quantize(x, "ternary", threshold=0.3, scaling=False)
    assert _same(unscaled, [0.0, -1.0, 1.0, 0.0, 0.0, 1.0, NAN])


def test_ternary_automatic_threshold_is_three_quarters_of_the_mean_magnitude():
    x = torch.tensor([1.0, -2.0, 0.5, 0.0])  # mean |x| 0.875 -> threshold 0.65625
    assert quantize(x, "ternary").tolist() == [1.5, -1.5, 0.0, 0.0]
    assert quantize(x, "ternary", threshold=None, scaling=False).tolist() == [1.0, -1.0, 0.0, 0.0]
    # mean |x| 4 -> threshold exactly 3: elements equal to it become zero
    assert quantize(torch.tensor([5.0, 3.0, -5.0, -3.0]), "ternary").tolist() == [5.0, 0.0, -5.0, 0.0]


def test_ternary_zero_threshold_keeps_zero_and_all_below_threshold_is_zero():
    assert quantize(torch.tensor([0.0, 0.5, -0.25]), "ternary", threshold=0.0).tolist() == [0.0, 0.375, -0.375]
    assert quantize(torch.tensor([0.1, -0.2]), "ternary", threshold=5.0).tolist() == [0.0, 0.0]
