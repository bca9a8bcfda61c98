"""Passes return a typed PassResult; the manager owns the one recompile and metadata refresh per transform."""

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from pydantic import BaseModel

import mase_lite as ml
from mase_lite.ir import meta as meta_mod
from mase_lite.passes import PassResult, register_pass
from mase_lite.passes.manager import PassContractError
from tests.search.conftest import TINY_MODEL

INT8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 8, "weight_frac_width": 4}


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), drop=nn.Dropout(0.1), fc2=nn.Linear(16, 2)))
    return ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 8)})


class CountOpParams(BaseModel):  # the extend guide's plug-in (docs/guides/extend.md), as a user writes it
    op: str = "dropout"


@register_pass("test_count_op", kind="analysis", params=CountOpParams, metrics=("count",))
def count_op(mg, params):
    """Count the nodes of one op."""
    nodes = [n.name for n in mg.nodes if n.meta["mase"]["op"] == params.op]
    return PassResult({"nodes": nodes}, metrics={"count": len(nodes)})


@register_pass("test_old_form", kind="analysis")
def old_form(mg, params):
    """The earlier ``(mg, info)`` form, which the contract no longer takes."""
    return mg, {"seen": len(mg.nodes), "metrics": {"nodes": len(mg.nodes)}}


@register_pass("test_fresh_graph", kind="transform", replay=False)
def fresh_graph(mg, params):
    """Hands back another graph, and says so."""
    return PassResult({"swapped": True}, graph=mlp())


@register_pass("test_returns_junk", kind="analysis")
def returns_junk(mg, params):
    """Breaks the contract."""
    return {"count": 1}


@pytest.mark.parametrize("name, params", [
    ("quantize", {"default": INT8}), ("prune", {"weight": {"sparsity": 0.5}}), ("prune_finalize", {}),
    ("lora", {"rank": 2}), ("replace", {"by": "name", "targets": ["act"], "with": "identity"}),
    ("remove_dropout", {}), ("dead_code", {"delete_unused_modules": True}), ("fold_batchnorm", {}),
])
def test_a_transform_refreshes_metadata_once(name, params, monkeypatch):
    mg = mlp()
    calls = []
    refresh = meta_mod.refresh
    monkeypatch.setattr(meta_mod, "refresh", lambda g: calls.append(g) or refresh(g))
    mg, _ = getattr(ml.passes, name)(mg, params)
    assert calls == [mg]
    assert ml.passes.verify(mg)[1]["ok"]


def test_the_public_call_unpacks_to_graph_and_info_and_carries_the_result():
    mg = mlp()
    outcome = ml.passes.test_count_op(mg, {"op": "linear"})
    graph, info = outcome
    assert graph is mg and info == {"nodes": ["fc1", "fc2"], "metrics": {"count": 2}}
    assert outcome.result == PassResult({"nodes": ["fc1", "fc2"]}, metrics={"count": 2})
    with pytest.raises(PassContractError, match=r"pass 'test_old_form' returned tuple; a pass returns a PassResult "
                                                r"\(the older \(graph, info\) form: return PassResult\(info, metrics=...\) instead\)"):
        ml.passes.test_old_form(mg)


def test_a_pass_that_returns_another_graph_says_so():
    mg = mlp()
    new, info = ml.passes.test_fresh_graph(mg)
    assert new is not mg and info == {"swapped": True} and new.facts == {"graph", "metadata"}
    with pytest.raises(PassContractError, match=r"pass 'test_returns_junk' returned dict; a pass returns a PassResult"):
        ml.passes.test_returns_junk(mg)


def test_a_plugin_metric_is_a_search_objective(tmp_path):
    pipeline = {"model": TINY_MODEL, "data": None, "inputs": ["input_ids", "attention_mask"],
                "steps": [{"pass": "test_count_op", "params": {"op": "dropout"}}]}
    search = {"pipeline": pipeline, "space": [{"path": "steps.0.params.op", "type": "choice", "values": ["dropout", "linear"]}],
              "objectives": [{"metric": "test_count_op.count", "direction": "maximize"}],
              "sampler": {"name": "grid", "seed": 0}, "n_trials": 2, "output_dir": str(tmp_path / "search")}
    report = ml.run_search(search).report
    counts = {t["params"]["steps.0.params.op"]: t["metrics"]["test_count_op.count"] for t in report["studies"][0]["trials"]}
    # Linears: the layer's 6, the pooler, the classifier; dropouts: embeddings, attention output, layer output, classifier
    assert counts == {"dropout": 4, "linear": 8}
    assert report["studies"][0]["best"]["params"] == {"steps.0.params.op": "linear"}


def test_quantizing_a_copied_graph_leaves_the_original_metadata_alone():
    import copy

    mg = mlp()
    twin, _ = ml.passes.quantize(copy.deepcopy(mg), {"default": INT8})
    assert twin.nodes[1].meta["mase"]["params"]["weight"]["format"]["name"] == "integer"
    assert mg.nodes[1].meta["mase"]["params"]["weight"]["format"] == "float32"
    assert mg.nodes[1].meta["mase"]["module"] == "Linear"
