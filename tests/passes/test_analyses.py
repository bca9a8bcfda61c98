"""Analysis results live as long as the fact they stand for: a metadata refresh keeps them, a transform
that invalidates the fact removes them from the graph and from every node (nothing stale, nothing lost)."""

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite.passes import PassResult, register_pass
from mase_lite.passes.registry import PassError


class Data:
    """Two batches of a tiny classification set."""

    seed = 0

    def loader(self, split, batch_size, shuffle=False, seed=0):
        g = torch.Generator().manual_seed(1)
        return [{"input": torch.randn(4, 8, generator=g)} for _ in range(2)]


@register_pass("test_reads_profile", kind="analysis", requires=("profile",))
def needs_profile(mg, params):
    """Reads the statistics the profile pass left."""
    return PassResult({"nodes": sorted(n.name for n in mg.nodes if n.meta["mase"].get("profile"))})


def graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    return ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})


def test_a_metadata_refresh_keeps_the_statistics_a_held_fact_stands_for():
    mg = graph()
    mg, _ = ml.passes.profile(mg, {"num_batches": 2, "targets": ["linear"]}, data=Data())
    stats = {n.name: n.meta["mase"]["profile"] for n in mg.nodes if "profile" in n.meta["mase"]}
    assert set(stats) == {"0", "2"} and mg.analyses["profile"] == stats
    mg, _ = ml.passes.metadata(mg)
    mg.refresh_metadata()
    assert "profile" in mg.facts
    _, info = ml.passes.test_reads_profile(mg)
    assert info["nodes"] == ["0", "2"]
    assert {n.name: n.meta["mase"]["profile"] for n in mg.nodes if "profile" in n.meta["mase"]} == stats


def test_a_transform_that_invalidates_the_fact_removes_its_results_everywhere():
    mg = graph()
    mg, _ = ml.passes.profile(mg, {"num_batches": 1, "targets": ["linear"]}, data=Data())
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"name": "integer", "width": 8, "frac_width": 4}}})
    assert "profile" not in mg.facts and "profile" not in mg.analyses
    assert not any("profile" in n.meta["mase"] for n in mg.nodes)
    with pytest.raises(PassError, match="needs 'profile', which the graph does not hold .* run one of: profile"):
        ml.passes.test_reads_profile(mg)
