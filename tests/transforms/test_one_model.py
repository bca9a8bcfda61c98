"""One model behind a graph: a replacement at the root (a Llama's lm_head, a Sequential's layers) is seen by the
model the graph was captured from, so a pass that runs the model (gptq) sees it, and packing through the quantize
pass frees the float weights in graph mode as in module mode."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mase_lite as ml
from tests.conftest import PATIENCE


class Batches:
    """Calibration data as the gptq pass asks for it: ``loader(split, batch_size, shuffle)`` of input dicts."""

    def __init__(self, make):
        self.make = make

    def loader(self, split, batch_size, shuffle=False):
        return (self.make(batch_size) for _ in range(64))


def test_quantizing_every_linear_of_a_llama_then_gptq_reaches_the_head(tmp_path):
    result = ml.run_pipeline({
        "model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "num_key_value_heads": 1,
                                                     "intermediate_size": 64, "max_position_embeddings": 32}},
        "data": {"block_size": 16, "n_train": 16, "n_test": 8},
        "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"linear": {"weight": {
                      "name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}}}}},
                  {"pass": "gptq", "params": {"num_batches": 2, "batch_size": 4}}],
        "output_dir": str(tmp_path / "run")})
    mg = result.mg
    assert mg.source_model.lm_head is mg.model.lm_head and type(mg.model.lm_head).__name__ == "QuantizedLinear"
    assert "lm_head" in result.report["steps"][1]["info"]["layers"]


def test_a_sequential_quantized_at_its_root_runs_gptq():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(4, 32)})
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": {"name": "mxint", "element_width": 4}}}})
    assert mg.source_model[0] is mg.model.get_submodule("0") and mg.source_model[2] is mg.model.get_submodule("2")
    data = Batches(lambda n: {"input": torch.randn(n, 32)})
    mg, info = ml.passes.gptq(mg, {"num_batches": 4, "batch_size": 8, "rounding_error": True}, data=data)
    assert sorted(info["layers"]) == ["0", "2"] and info["error"] <= info["rtn_error"]


RSS = """
import json, os, torch
import mase_lite as ml

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 512) if i % 2 else torch.nn.Linear(512, 1024) for i in range(24)])
mg = ml.MaseGraph(model, example_inputs={"input": torch.randn(2, 512)})
floats = sum(p.numel() * 4 for p in model.parameters())
base = rss() - floats
del model
mg, _ = ml.passes.quantize(mg, {"default": {"name": "mxint", "element_width": 8, "storage": "packed"}})
print(json.dumps(dict(after=rss() - base, floats=floats)))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="resident memory is read from /proc (Linux)")
def test_packing_a_captured_graph_through_the_pass_frees_the_float_weights():
    """The float layers were the model's children too; once both hold the packed ones, nothing keeps them: the
    resident weights fall to the packed bytes plus allocator slack, under 0.45 of the float model's."""
    run = subprocess.run([sys.executable, "-c", RSS], capture_output=True, text=True, timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(run.stdout.strip().splitlines()[-1])
    assert m["after"] <= 0.45 * m["floats"], m
