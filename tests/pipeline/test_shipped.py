"""Every shipped pipeline runs end to end (on a smaller slice of its data, to stay fast)."""

import json
from pathlib import Path

import pytest

import mase_lite as ml

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def shrunk(name: str, tmp_path) -> dict:
    spec = json.loads((PIPELINES / name).read_text())
    spec["data"] = {**(spec.get("data") or {}), "n_train": 256, "n_test": 64}
    spec["output_dir"] = str(tmp_path / name)
    return spec


def test_quickstart(tmp_path):
    result = ml.run_pipeline(shrunk("quickstart.json", tmp_path))
    out = tmp_path / "quickstart.json"
    assert result.report["status"] == "ok"
    assert {"graph.svg", "graph_report.md", "graph_report.json", "report.json"} <= {p.name for p in out.iterdir()}
    steps = {s["pass"]: s["info"] for s in result.report["steps"]}
    assert steps["verify"]["ok"] and steps["count"]["macs"] > 0 and steps["avg_bits"]["weights"] == 32.0
    assert len(steps["profile"]["nodes"]) == 16


def test_qat_int8(tmp_path):
    result = ml.run_pipeline(shrunk("qat_int8.json", tmp_path))
    metrics = result.report["metrics"]
    assert set(metrics) == {"fp32", "ptq", "qat", "avg_bits"}
    steps = {s["pass"]: s["info"] for s in result.report["steps"]}
    assert steps["quantize"]["count"] == 14
    assert steps["avg_bits"]["weights"] == pytest.approx(8.0)
    loaded = ml.load(tmp_path / "qat_int8.json" / "checkpoint")
    assert [n.meta["mase"]["module"] for n in loaded.nodes if n.meta["mase"]["op"] == "linear"] == ["QuantizedLinear"] * 14


def test_prune_l1(tmp_path):
    result = ml.run_pipeline(shrunk("prune_l1.json", tmp_path))
    assert set(result.report["metrics"]) == {"dense", "pruned", "pruned-finetuned", "sparsity"}
    sparsity = [s["info"] for s in result.report["steps"] if s["pass"] == "sparsity"]
    assert all(info["weight_sparsity"] == pytest.approx(0.5, abs=1e-3) for info in sparsity)


def test_lora(tmp_path):
    result = ml.run_pipeline(shrunk("lora.json", tmp_path))
    assert result.report["status"] == "ok" and len(result.report["metrics"]) >= 2
    assert not any(n.meta["mase"]["module"] == "LoRALinear" for n in result.mg.nodes if n.op == "call_module")
