"""Registered replacement constructors."""

import pytest
import torch
import torch.nn as nn

from mase_lite.infra.errors import UserError
from mase_lite.layers.replacements import build_replacement, register_replacement, replacement_names


def test_builtins_are_registered():
    assert {"identity", "linear", "low_rank_linear", "activation"} <= set(replacement_names())


def test_identity():
    assert isinstance(build_replacement("identity", nn.Linear(4, 4)), nn.Identity)


def test_linear_defaults_to_the_old_shape_and_bias():
    new = build_replacement("linear", nn.Linear(4, 3, bias=False))
    assert (new.in_features, new.out_features, new.bias) == (4, 3, None)
    wider = build_replacement("linear", nn.Linear(4, 3), {"out_features": 8, "bias": False})
    assert (wider.in_features, wider.out_features, wider.bias) == (4, 8, None)


def test_linear_needs_in_features():
    with pytest.raises(UserError, match="replacement 'linear' needs a module with in_features, got ReLU"):
        build_replacement("linear", nn.ReLU())


def test_low_rank_full_rank_reproduces_the_linear():
    torch.manual_seed(0)
    old = nn.Linear(5, 3)
    new = build_replacement("low_rank_linear", old, {"rank": 3})
    x = torch.randn(4, 5)
    torch.testing.assert_close(new(x), old(x), rtol=1e-5, atol=1e-5)


def test_low_rank_one_is_exact_for_a_rank_one_weight():
    old = nn.Linear(3, 2)
    with torch.no_grad():
        old.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]))
    new = build_replacement("low_rank_linear", old, {"rank": 1})
    assert new[0].weight.shape == (1, 3) and new[1].weight.shape == (2, 1)
    torch.testing.assert_close(new[1].weight @ new[0].weight, old.weight.detach())
    assert torch.equal(new[1].bias, old.bias)


@pytest.mark.parametrize("rank", [0, 4])
def test_low_rank_rank_out_of_range(rank):
    with pytest.raises(UserError, match=rf"with.params.rank: {rank} must be in \[1, 3\] for a 3x5 Linear"):
        build_replacement("low_rank_linear", nn.Linear(5, 3), {"rank": rank})


def test_activation_by_name_and_unknown_name():
    assert isinstance(build_replacement("activation", nn.GELU(), {"name": "relu"}), nn.ReLU)
    with pytest.raises(UserError, match="unknown activation 'swish'; allowed: gelu, identity, relu"):
        build_replacement("activation", nn.GELU(), {"name": "swish"})


def test_unknown_replacement_lists_the_registered_ones():
    with pytest.raises(UserError, match="unknown replacement 'conv'; registered: activation, identity"):
        build_replacement("conv", nn.Linear(2, 2))


def test_unknown_or_missing_params_name_the_allowed_keys():
    with pytest.raises(UserError, match="with.params for 'linear': .*'width'.*; allowed keys: out_features, bias"):
        build_replacement("linear", nn.Linear(2, 2), {"width": 3})
    with pytest.raises(UserError, match="with.params for 'low_rank_linear': .*rank.*; allowed keys: rank"):
        build_replacement("low_rank_linear", nn.Linear(2, 2), {})


def test_replacement_takes_the_old_dtype():
    new = build_replacement("linear", nn.Linear(4, 2, dtype=torch.float16))
    assert new.weight.dtype == torch.float16


def test_registering_a_custom_constructor_and_a_clashing_name():
    @register_replacement("test_scaled_identity")
    def scaled(old, scale: float = 2.0):
        return nn.Identity() if scale == 1.0 else nn.Linear(1, 1)

    assert isinstance(build_replacement("test_scaled_identity", nn.ReLU(), {"scale": 1.0}), nn.Identity)
    with pytest.raises(UserError, match="a replacement named 'identity' is already registered"):
        register_replacement("identity")(lambda old: nn.Identity())
