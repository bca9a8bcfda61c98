"""Codegen: the emitted package rebuilds the graph bit for bit, stands alone, compiles and exports."""

import copy
import importlib
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

import mase_lite as ml
from mase_lite.codegen import CodegenError
from tests.conftest import PATIENCE

BERT_SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
PACKED = {"by": "type", "rules": {"linear": {"name": "mxint", "element_width": 8, "storage": "packed"}}}
INTEGER = {"by": "type", "rules": {"linear": {"name": "integer", "data_in_width": 8, "data_in_frac_width": 4,
                                              "weight_width": 8, "weight_frac_width": 6}}}
# Everything but torch, safetensors and the kernel runtime (fake-quantized layers also need mase_lite.layers).
BLOCKED = ("mase_lite.ir", "mase_lite.passes", "mase_lite.codegen", "mase_lite.pipeline", "mase_lite.search",
           "mase_lite.workloads", "mase_lite.bench", "transformers")


def bert(attn_implementation: str = "sdpa") -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(**BERT_SHAPE, attn_implementation=attn_implementation)).eval()


@pytest.fixture(scope="module")
def captured():
    """Captured default and eager-attention BERTs (each test transforms its own deep copy)."""
    names = ["input_ids", "attention_mask"]
    return {kind: ml.MaseGraph(bert(kind), hf_input_names=names) for kind in ("sdpa", "eager")}


def bert_inputs(batch: int, seq: int) -> dict:
    gen = torch.Generator().manual_seed(batch * 100 + seq)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2:] = 0
    return {"input_ids": torch.randint(0, 30522, (batch, seq), generator=gen), "attention_mask": mask}


def emit_and_import(mg, tmp_path, **params):
    """Write the package under a fresh import name and import it."""
    name = f"emitted_{uuid.uuid4().hex[:8]}"
    _, info = ml.passes.codegen(mg, {"path": str(tmp_path / name), **params})
    sys.path.insert(0, str(tmp_path))
    try:
        package = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    return package, info, (tmp_path / name / "model.py").read_text()


def packed(mg):
    return ml.passes.quantize(mg, PACKED)[0]


def integer(mg):
    return ml.passes.quantize(mg, INTEGER)[0]


def pruned(mg):
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"}})
    return ml.passes.prune_finalize(mg)[0]


def fused(mg):
    mg, info = ml.passes.fuse_sdpa(mg)
    assert len(info["fused"]) == 2
    return mg


VARIANTS = {  # name: (attention, transform, a line the emitted code must hold, how many times)
    # query, key, value (BertSelfAttention), attention output (BertSelfOutput), pooler: each class once
    "float": ("sdpa", lambda mg: mg, "= nn.Linear(128, 128)", 5),
    "integer": ("sdpa", integer, "= QuantizedLinear(128, 128, config={'data_in': {'name': 'integer'", 5),
    "packed": ("sdpa", packed, "= PackedLinear(128, 128, 4, 32)", 5),
    "fused": ("eager", fused, "F.scaled_dot_product_attention(", 1),
    "pruned": ("sdpa", pruned, "= nn.Linear(128, 512)", 1),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_bert_outputs_are_bit_identical_to_the_graph(captured, tmp_path, variant):
    kind, transform, line, count = VARIANTS[variant]
    mg = transform(copy.deepcopy(captured[kind]))
    package, info, source = emit_and_import(mg, tmp_path)
    assert source.count(line) == count
    assert source.count("class BertLayer(nn.Module):") == 1 and "nn.ModuleList([BertLayer() for _ in range(2)])" in source
    model = package.load("cpu")
    assert not model.training and info["class_name"] == "BertForSequenceClassification"
    assert (info["codes"] > 0) == (variant == "integer")  # fake-quantized weights are stored as their codes
    if variant in ("float", "fused"):  # the model's module tree: a checkpoint of the model loads into it
        assert list(model.state_dict()) == list(mg.source_model.state_dict())
    mg.model.eval()
    with torch.no_grad():
        for batch, seq in ((3, 17), (2, 9)):
            inputs = bert_inputs(batch, seq)
            expected, got = mg.model(**inputs), model(**inputs)
            assert type(got).__name__ == "SequenceClassifierOutput" and got._fields == ("logits",)
            assert torch.equal(got.logits, expected.logits)


def test_stored_codes_load_bit_for_bit_where_quantizing_again_would_move_values(captured, tmp_path):
    """Asymmetric groups recompute their scales from the values: the package holds the decoded weights as the
    checkpoint load does, so its outputs are the graph's; it stores 4-bit codes, not float32."""
    fmt = {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 32}
    mg, _ = ml.passes.quantize(copy.deepcopy(captured["sdpa"]), {"by": "type", "rules": {"linear": {"weight": fmt}}})
    package, info, _ = emit_and_import(mg, tmp_path)
    assert info["codes"] == 14
    model = package.load("cpu")
    mg.model.eval()
    with torch.no_grad():
        inputs = bert_inputs(2, 9)
        assert torch.equal(model(**inputs).logits, mg.model(**inputs).logits)


def test_pruned_weights_are_stored_with_their_zeros(captured, tmp_path):
    mg = copy.deepcopy(captured["sdpa"])
    mg, _ = ml.passes.prune(mg, {"weight": {"sparsity": 0.5, "method": "l1-norm", "scope": "local"}})
    package, _, _ = emit_and_import(mg, tmp_path)  # masks not finalized: the masked weight is what is stored
    model = package.load("cpu")
    weight = model.bert.encoder.layer[0].attention.self.query.weight
    assert (weight == 0).float().mean().item() == 0.5
    inputs = bert_inputs(2, 8)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, mg.model.eval()(**inputs).logits)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 4, 1, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(4 * 2 * 2, 10)

    def forward(self, x):
        return self.fc(self.flatten(self.conv2(self.pool(self.relu(self.bn(self.conv(x)))))))


def test_cnn_is_bit_identical_and_readable(tmp_path):
    torch.manual_seed(0)
    cnn = CNN().eval()
    with torch.no_grad():
        cnn.bn.running_mean.normal_()
        cnn.bn.running_var.uniform_(0.5, 2.0)
    mg = ml.MaseGraph(cnn, example_inputs={"x": torch.randn(2, 3, 8, 8)})
    package, info, source = emit_and_import(mg, tmp_path, class_name="TinyCNN")
    for line in ("self.conv = nn.Conv2d(3, 8, (3, 3), padding=(1, 1), bias=False)",
                 "self.conv2 = nn.Conv2d(8, 4, (1, 1), stride=(2, 2))", "self.bn = nn.BatchNorm2d(8)",
                 "self.pool = nn.MaxPool2d(2, stride=2)", "def forward(self, x):", "class TinyCNN(nn.Module):"):
        assert line in source
    assert info["tensors"] == 10  # conv weight, BatchNorm (weight, bias, mean, var, count), conv2 and fc (2 each)
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(package.load("cpu")(x), mg.model.eval()(x=x))


BLOCKING_RUN = """
import importlib.abc, sys
BLOCKED = {blocked!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"blocked: {{name}}")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
import torch
from safetensors.torch import load_file
import {name}
model = {name}.load("cpu")
inputs = load_file({inputs!r})
expected = inputs.pop("expected")
with torch.no_grad():
    logits = model(**inputs).logits
assert torch.equal(logits, expected), "outputs differ"
print(sorted(m for m in sys.modules if m.startswith("mase_lite")))
"""


@pytest.mark.parametrize("variant", ["packed", "integer"])
def test_emitted_package_imports_neither_ir_nor_passes(captured, tmp_path, variant):
    mg = VARIANTS[variant][1](copy.deepcopy(captured["sdpa"]))
    name = f"standalone_{variant}"
    ml.passes.codegen(mg, {"path": str(tmp_path / name)})
    inputs = bert_inputs(2, 11)
    with torch.no_grad():
        inputs["expected"] = mg.model.eval()(**inputs).logits
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    blocked = BLOCKED + (("mase_lite.layers",) if variant == "packed" else ())
    script = BLOCKING_RUN.format(blocked=blocked, root=str(tmp_path), name=name,
                                 inputs=str(tmp_path / "inputs.safetensors"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = eval(run.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith(BLOCKED)]
    assert ("mase_lite.kernels.mxint8.ops" in loaded) == (variant == "packed")
    assert ("mase_lite.layers.quantized" in loaded) == (variant == "integer")


WITHOUT_MASE_LITE = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "mase_lite" or name.startswith("mase_lite."):
            raise ImportError(f"blocked: {{name}}")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
import torch
from safetensors.torch import load_file
import {name}
model = {name}.load("cpu")
inputs = load_file({inputs!r})
expected, bound = inputs.pop("expected"), inputs.pop("bound")
with torch.no_grad():
    logits = model(**inputs).logits
assert bool(((logits - expected).abs() <= bound).all()), "outputs differ beyond float32 accumulation"
print(sorted(m for m in sys.modules if m.startswith("mase_lite")), model.bert.encoder.layer[0].attention.self.query)
"""


def test_a_packed_package_runs_without_mase_lite(captured, tmp_path):
    """torch and safetensors alone: the package's own torch op decodes the same weights; its float32 sums are torch's,
    so the logits are the graph's within float32 accumulation error (1e-5 of the largest logit)."""
    mg = packed(copy.deepcopy(captured["sdpa"]))
    ml.passes.codegen(mg, {"path": str(tmp_path / "no_mase")})
    assert (tmp_path / "no_mase" / "_mxint8.py").is_file()
    inputs = bert_inputs(2, 11)
    with torch.no_grad():
        inputs["expected"] = mg.model.eval()(**inputs).logits
    inputs["bound"] = torch.tensor(1e-5) * inputs["expected"].abs().max()
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    script = WITHOUT_MASE_LITE.format(root=str(tmp_path), name="no_mase", inputs=str(tmp_path / "inputs.safetensors"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1].startswith("[] PackedLinear")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.act = nn.GELU()
        self.down = nn.Linear(96, 32)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.fixture
def packed_mlp_package(tmp_path):
    torch.manual_seed(0)
    mg = packed(ml.MaseGraph(MLP().eval(), example_inputs={"x": torch.randn(4, 64)}))
    package, info, source = emit_and_import(mg, tmp_path)
    assert info["packed_linears"] == 2 and "self.up = PackedLinear(64, 96, 2, 32)" in source
    return mg, package.load("cpu")


def test_emitted_model_under_torch_compile(packed_mlp_package):
    """One graph, no breaks. aot_eager keeps eager numerics (bit-exact); inductor fuses the float ops
    around the kernel op (GELU, bias), so its outputs match to float32 rounding."""
    mg, model = packed_mlp_package
    x = torch.randn(6, 64)
    with torch.no_grad():
        expected = mg.model.eval()(x=x)
        assert torch.equal(torch.compile(model, backend="aot_eager", fullgraph=True)(x), expected)
        torch.testing.assert_close(torch.compile(model, backend="inductor", fullgraph=True)(x), expected,
                                   rtol=1e-5, atol=1e-6)


def test_emitted_model_under_torch_export(captured, tmp_path):
    mg = packed(copy.deepcopy(captured["sdpa"]))
    package, _, _ = emit_and_import(mg, tmp_path)
    model = package.load("cpu")
    inputs = bert_inputs(3, 12)
    exported = torch.export.export(model, (), inputs, strict=False)
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "mase_lite.mxint8_linear.default" in targets
    again = bert_inputs(3, 12)
    with torch.no_grad():
        assert torch.equal(exported.module()(**again).logits, mg.model.eval()(**again).logits)


class Doubler(nn.Module):
    """Doubles its input; torch.fx cannot take ``len`` of a traced value."""

    def forward(self, x):
        return 2 * x[: len(x)]


class WithCustomLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.twice = Doubler()

    def forward(self, x):
        return self.twice(self.fc(x))


def test_a_module_codegen_cannot_build_is_named_and_nothing_is_written(tmp_path):
    mg = ml.MaseGraph(WithCustomLeaf(), example_inputs={"x": torch.randn(2, 8)}, leaf_modules=(Doubler,))
    with pytest.raises(CodegenError, match=r"module 'twice': torch.fx cannot trace its Doubler.forward"):
        ml.passes.codegen(mg, {"path": str(tmp_path / "out" / "pkg")})
    assert not (tmp_path / "out" / "pkg").exists()


def test_lora_layers_must_be_merged_first(tmp_path):
    torch.manual_seed(0)
    mg = ml.MaseGraph(MLP(), example_inputs={"x": torch.randn(4, 64)})
    mg, _ = ml.passes.lora(mg, {"r": 4})
    with pytest.raises(CodegenError, match=r"module 'up': a LoRA layer \(LoRALinear\); merge it first with the lora_merge pass"):
        ml.passes.codegen(mg, {"path": str(tmp_path / "pkg")})


def test_package_name_must_be_an_identifier(tmp_path):
    mg = ml.MaseGraph(MLP(), example_inputs={"x": torch.randn(4, 64)})
    with pytest.raises(CodegenError, match=r"package name 'my-model' is not a Python identifier"):
        ml.passes.codegen(mg, {"path": str(tmp_path / "my-model")})


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x, scale):
        return self.norm(x + self.fc(x) * scale)


class Stack(nn.Module):
    """Three identical blocks, each given the stack's own buffer."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.scale)
        return x


def test_identical_blocks_are_one_class_run_as_a_loop(tmp_path):
    torch.manual_seed(0)
    stack = Stack().eval()
    mg = ml.MaseGraph(stack, example_inputs={"x": torch.randn(2, 5, 8)})
    package, _, source = emit_and_import(mg, tmp_path)
    assert source.count("class Block(nn.Module):") == 1
    assert "self.blocks = nn.ModuleList([Block() for _ in range(3)])" in source
    assert "    for block in self.blocks:\n            x = block(x, self.scale)\n" in source
    model = package.load("cpu")
    assert list(model.state_dict()) == list(stack.state_dict())
    x = torch.randn(4, 3, 8)
    with torch.no_grad():
        assert torch.equal(model(x), mg.model.eval()(x=x))
