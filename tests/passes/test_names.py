"""Names users reach: a pass never hides behind an attribute of mase_lite.passes, and dir() lists what exists."""

import pytest

import mase_lite as ml
from mase_lite.passes import PassError, register_pass
from mase_lite.passes.registry import pass_names


@pytest.mark.parametrize(("name", "taken"), [
    ("manager", "the module mase_lite.passes.manager"),
    ("register_pass", "mase_lite.passes.register_pass"),
    ("select", "the module mase_lite.passes.select"),
])
def test_a_pass_named_like_an_attribute_of_the_package_is_refused(name, taken):
    with pytest.raises(PassError) as info:
        register_pass(name, kind="analysis")(lambda mg, params: (mg, {}))
    assert str(info.value) == (
        f"pass '{name}': the name is taken by {taken} (ml.passes.{name} would reach it, not the pass); choose another name"
    )
    assert name not in pass_names()


def test_dir_lists_the_public_names_and_every_pass():
    assert set(ml.__all__) <= set(dir(ml)) and "load" in ml.__all__ and ml.load.__module__ == "mase_lite"
    assert {"quantize", "prune", "count", "register_pass"} <= set(dir(ml.passes))
