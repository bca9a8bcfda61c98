"""Module mode: passes on a plain nn.Module, for models torch.export refuses."""

import json
import logging
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite.cli import main
from mase_lite.ir.module_model import ModuleModel
from mase_lite.layers.quantized import QuantizedLinear
from mase_lite.passes import PassError
from mase_lite.passes.manager import PassContext
from mase_lite.pipeline.spec import load_spec
from mase_lite.search.cache import PrefixCache
from mase_lite.search.space import captured_nodes, select
from mase_lite.search.spec import NodeSelector
from mase_lite.pipeline.spec import DataSpec
from mase_lite.workloads import prepare
from mase_lite.workloads.models import ModelSpec
from mase_lite.workloads.seeding import seed_everything
from tests.modules.models import refined

INT8 = {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4, "weight_width": 6, "weight_frac_width": 4}
MODEL = {"task": "image-classification", "factory": "tests.modules.models:refined", "kwargs": {"classes": 10}}
DATA = {"n_train": 16, "n_test": 24, "image_size": 16}
QUANTIZE = {"by": "regex", "rules": {"proj|refine": INT8}}
PRUNE = {"by": "name", "targets": ["stem", "head"], "weight": {"sparsity": 0.5}}


def spec(tmp_path, capture="auto", steps=None):
    return {
        "model": MODEL, "data": DATA, "capture": capture, "output_dir": str(tmp_path / "run"),
        "steps": steps if steps is not None else [
            {"pass": "quantize", "params": QUANTIZE},
            {"pass": "prune", "params": PRUNE},
            {"pass": "evaluate", "params": {"progress": False}},
            {"pass": "save", "params": {"path": "ckpt"}},
            {"pass": "load", "params": {"path": "ckpt"}},
            {"pass": "evaluate", "params": {"label": "reloaded", "progress": False}},
        ],
    }


def test_export_refuses_the_model():
    with pytest.raises(ml.UserError, match=r"models.py:\d+ in Refined .*if h.mean\(\) > 0"):
        ml.MaseGraph(refined(), example_inputs={"pixel_values": torch.randn(2, 3, 16, 16)})


def test_auto_falls_back_to_modules_and_equals_the_passes_by_hand(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mase_lite.pipeline.runner"):
        result = ml.run_pipeline(spec(tmp_path))
    fallback = [r.getMessage() for r in caplog.records if "module mode" in r.getMessage()]
    assert len(fallback) == 1 and "running Refined in module mode" in fallback[0]
    assert "models.py:20 in Refined (the model): if h.mean() > 0" in fallback[0]  # the line export refused
    assert result.report["capture"]["mode"] == "modules"
    assert isinstance(result.mg, ModuleModel) and [s["pass"] for s in result.mg.history] == ["quantize", "prune"]

    # the same passes by hand, on the same model and data
    seed_everything(0)
    model, data = prepare(ModelSpec.model_validate(MODEL), DataSpec.model_validate(DATA), tmp_path / "hand", 0)
    model, info = ml.passes.quantize(model, QUANTIZE)
    assert isinstance(model, nn.Module) and [r["node"] for r in info["replaced"]] == ["proj", "refine"]
    assert isinstance(model.proj, QuantizedLinear) and isinstance(model.refine, QuantizedLinear)
    model, info = ml.passes.prune(model, PRUNE)
    assert info["nodes"]["head"] == {"weight_pruned": 160, "weight_total": 320, "weight_sparsity": 0.5}
    model, info = ml.passes.evaluate(model, {"progress": False}, data=data)
    metrics = result.report["metrics"]
    assert metrics["evaluate"] == info["metrics"] == metrics["reloaded"] and info["metrics"]["n"] == 24

    loaded = result.mg.model  # the checkpoint, rebuilt with its transforms replayed
    assert loaded is not model and isinstance(loaded.refine, QuantizedLinear)
    x = torch.randn(5, 3, 16, 16)
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(pixel_values=x), model(pixel_values=x))
    assert int((loaded.head.weight == 0).sum()) == 160
    saved = json.loads((tmp_path / "run" / "ckpt" / "recipe.json").read_text())
    assert saved["capture"] == "modules" and [t["pass"] for t in saved["transforms"]] == ["quantize", "prune"]


def test_selection_by_node_name_module_path_and_regex_alike():
    def net():
        torch.manual_seed(0)
        return nn.Sequential(OrderedDict(block=nn.Sequential(nn.Linear(8, 8), nn.ReLU()), head=nn.Linear(8, 2)))

    chosen = []
    for rules in ({"block_0": INT8}, {"block.0": INT8}):
        _, info = ml.passes.quantize(net(), {"by": "name", "rules": rules})
        chosen.append([r["node"] for r in info["replaced"]])
    _, info = ml.passes.quantize(net(), {"by": "regex", "rules": {r"block\.\d": INT8}})
    chosen.append([r["node"] for r in info["replaced"]])
    _, info = ml.passes.quantize(net(), {"by": "type", "rules": {"head": None}, "default": INT8})
    chosen.append([r["node"] for r in info["replaced"]])
    assert chosen == [["block_0"], ["block_0"], ["block_0"], ["block_0"]]
    with pytest.raises(PassError, match=r"rules.nope: matches no node \(by name\); quantizable nodes: block_0, head"):
        ml.passes.quantize(net(), {"by": "name", "rules": {"nope": INT8}})


def test_module_mode_equals_graph_mode_on_an_exportable_model():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 4)))
    twin = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 4)))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(3, 8)
    mg = ml.MaseGraph(twin, example_inputs={"input": x})
    steps = [("quantize", {"default": INT8}), ("prune", {"weight": {"sparsity": 0.25}}), ("sparsity", {}),
             ("lora", {"by": "name", "targets": ["fc2"], "rank": 2}), ("report_trainable", {}), ("lora_merge", {}),
             ("prune_finalize", {}), ("sparsity", {})]
    for name, params in steps:
        model, module_info = getattr(ml.passes, name)(model, params)
        mg, graph_info = getattr(ml.passes, name)(mg, params)
        assert module_info == graph_info, name
    with torch.no_grad():
        assert torch.equal(model(x), mg.model(input=x))
    # avg_bits sizes activations by a run on the examples: the same figures as the graph's
    bits = ml.passes.avg_bits(ModuleModel(model, example_inputs={"input": x}), {"dims": {"batch": 3}})[1]
    assert bits["metrics"] == ml.passes.avg_bits(mg, {"dims": {"batch": 3}})[1]["metrics"] == {
        "weights": (6 * (16 * 8 + 4 * 16) + 32 * (16 + 4)) / (16 * 8 + 4 * 16 + 16 + 4), "activations": 8.0}  # biases stay float32


def test_replace_checks_the_fit_on_the_example_inputs():
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(8, 16), act=nn.ReLU(), fc2=nn.Linear(16, 4)))
    mm = ModuleModel(model, example_inputs={"input": torch.randn(3, 8)})
    with pytest.raises(PassError, match=r"does not fit node 'fc1': for input shape \[3, 8\] float32 the node returns "
                                        r"shape \[3, 16\] float32 but the replacement returns shape \[3, 8\] float32"):
        ml.passes.replace(mm, {"by": "name", "targets": ["fc1"], "with": "identity"})
    mm, info = ml.passes.replace(mm, {"by": "name", "targets": ["act"], "with": "identity"})
    assert info == {"replaced": {"act": "Identity"}} and isinstance(model.act, nn.Identity)


def test_the_pass_list_says_which_passes_run_on_modules(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "quantize (transform, also module mode): " in out and "evaluate (analysis, also module mode): " in out
    assert "fuse_sdpa (transform): " in out and "count (analysis): " in out


def test_a_pass_that_needs_the_graph_names_itself(tmp_path, capsys):
    with pytest.raises(PassError, match=r"pass 'fuse_sdpa' needs the captured data-flow graph, which module mode"):
        ml.passes.fuse_sdpa(refined())
    path = tmp_path / "spec.json"
    for capture, step in (("modules", "count"), ("auto", "draw")):
        path.write_text(json.dumps(spec(tmp_path, capture, [{"pass": "quantize", "params": QUANTIZE}, {"pass": step}])))
        assert main(["run", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"steps.1 ({step}): needs the captured data-flow graph, which module mode (a plain nn.Module, or " in err
        assert "Traceback" not in err
    assert "models.py:20 in Refined (the model)" in err  # auto says why it fell back


def test_a_per_layer_search_space_expands_over_the_leaf_modules():
    nodes = captured_nodes({"model": MODEL, "capture": "modules"})
    assert [n.name for n in nodes] == ["stem", "pool", "proj", "refine", "head"]
    assert select(nodes, NodeSelector(op="linear", square=True)) == ["proj", "refine"]


def test_a_search_in_module_mode_uses_the_prefix_cache(tmp_path):
    pipeline = spec(tmp_path, "modules", [
        {"pass": "train", "params": {"max_steps": 2, "batch_size": 8, "progress": False}},
        {"pass": "quantize", "params": QUANTIZE},
        {"pass": "evaluate", "params": {"label": "ptq", "progress": False}},
    ])
    del pipeline["output_dir"]
    width = "steps.quantize.params.rules.proj|refine.weight_width"
    search = {"pipeline": pipeline, "space": [{"path": width, "type": "choice", "values": [4, 8]}],
              "objectives": [{"metric": "ptq.loss"}], "sampler": {"name": "grid", "seed": 0}, "n_trials": 2,
              "output_dir": str(tmp_path / "search")}
    trials = ml.run_search(search).report["studies"][0]["trials"]
    assert sorted(t["params"][width] for t in trials) == [4, 8] and all(t["state"] == "COMPLETE" for t in trials)
    steps = [json.loads((tmp_path / "search" / "trials" / str(t["number"]) / "report.json").read_text())["steps"]
             for t in trials]
    assert sorted([s.get("cached", False) for s in run] for run in steps) == [[False] * 3, [True, False, False]]
    assert len(list((tmp_path / "search" / "cache").iterdir())) == 1
    # another worker restores the state from disk: the trained module, in module mode
    trial = json.loads((tmp_path / "search" / "trials" / str(trials[0]["number"]) / "report.json").read_text())
    restored = PrefixCache(tmp_path / "search" / "cache", 1).restore(load_spec(trial["spec"]), PassContext(output_dir=tmp_path))
    assert restored is not None and isinstance(restored[1], ModuleModel) and restored[2][0]["pass"] == "train"
    assert isinstance(restored[1].model.refine, nn.Linear) and restored[1].input_names == ("pixel_values",)
