"""pt2 export: a fresh process that imports mase_lite.deploy.pt2 (and nothing of the run) loads the program of a
graph captured for training and computes the tool's logits bit for bit from the inference inputs, with quantized
activations and packed MXINT8 layers in it; a model torch.export cannot trace is refused in one line."""

import subprocess
import sys

import pytest
import safetensors.torch
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export
from mase_lite.ir.module_model import ModuleModel
from tests.conftest import PATIENCE

FRESH = """
import sys, torch, safetensors.torch
import mase_lite.deploy.pt2 as pt2
model = pt2.load(sys.argv[1])
expected = safetensors.torch.load_file(sys.argv[2])
out = model(expected["input_ids"], expected["attention_mask"])
print(torch.equal(out, expected["logits"]), type(model).__name__)
"""


def test_a_fresh_process_computes_the_tools_logits(tmp_path):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)).eval()
    mg = ml.MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])  # a training capture
    mg, _ = ml.passes.quantize(mg, {"by": "regex", "rules": {
        ".*q_proj": {"weight": {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group",
                                "group_size": 32}},
        ".*o_proj": {"weight": {"name": "mxint", "element_width": 8}, "data_in": {"name": "scaled_integer", "width": 8}},
        ".*up_proj": {"name": "mxint", "element_width": 8, "storage": "packed"}}})
    info = export(mg, "pt2", tmp_path / "m.pt2")
    assert info["inputs"] == ["input_ids", "attention_mask"] and info["outputs"] == ["logits"]
    ids, mask = torch.randint(0, 96, (3, 9)), torch.ones(3, 9, dtype=torch.long)  # batch and sequence are free
    mask[0, :2] = 0
    with torch.no_grad():
        logits = mg.model(input_ids=ids, attention_mask=mask).logits
    safetensors.torch.save_file({"input_ids": ids, "attention_mask": mask, "logits": logits}, tmp_path / "x.safetensors")
    done = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path / "m.pt2"), str(tmp_path / "x.safetensors")],
                          capture_output=True, text=True, timeout=PATIENCE)
    assert done.stdout.split() == ["True", "GraphModule"], done.stderr[-2000:]


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        return h.relu() if h.mean() > 0 else h  # a branch on a value: torch.export refuses it


def test_a_model_torch_export_refuses_is_refused_in_one_line(tmp_path):
    model, _ = ml.passes.quantize(Branching(), {"by": "type", "rules": {"linear": {"weight": {"name": "mxint"}}}})
    with pytest.raises(UserError, match=r"^pt2: torch.export cannot trace this model: ") as caught:
        export(ModuleModel(model, example_inputs={"x": torch.randn(2, 8)}), "pt2", tmp_path / "m.pt2")
    assert "\n" not in str(caught.value) and not (tmp_path / "m.pt2").exists()
