"""Selection that fits language models: the output head by name-free type, GPT-2's Conv1D quantized like a
Linear, integer operands refused with the node's name, and a quantize pass that is all or nothing."""

import importlib

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite.layers.quantized import QuantizedHFConv1D, QuantizedLinear
from mase_lite.passes.registry import PassError
from mase_lite.numerics import quantize

INT8 = {"name": "integer", "width": 8, "frac_width": 6}
INPUTS = ["input_ids", "attention_mask", "labels"]


@pytest.fixture
def gpt2():  # a fresh model each test: quantizing changes the model in place
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)).eval()


def batch(vocab=100):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 9), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def test_gpt2_conv1d_layers_are_quantized_like_linear(gpt2):
    mg = ml.MaseGraph(gpt2, hf_input_names=INPUTS)
    mg, info = ml.passes.quantize(mg, {"by": "type", "rules": {"head": None, "linear": {"weight": INT8}}})
    targets = sorted(r["target"] for r in info["replaced"])
    assert len(targets) == 8 and all(".c_" in t for t in targets) and "lm_head" not in targets
    layer = mg.modules["transformer.h.0.attn.c_attn"]
    assert isinstance(layer, QuantizedHFConv1D)
    x = torch.randn(2, 5, 32)
    expected = torch.addmm(layer.bias, x.reshape(-1, 32), quantize(layer.weight.t(), INT8).t()).view(2, 5, 96)
    assert torch.equal(layer(x), expected)
    with torch.no_grad():
        assert mg.model(**batch()).loss.isfinite()


def test_head_is_the_layer_feeding_the_output():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                         vocab_size=100)).eval()
    mg = ml.MaseGraph(llama, hf_input_names=INPUTS)
    mg, info = ml.passes.quantize(mg, {"by": "type", "rules": {"head": None, "linear": {"weight": INT8}}})
    assert info["skipped"] == ["lm_head"] and info["count"] == 7
    assert type(mg.modules["lm_head"]) is torch.nn.Linear and isinstance(mg.modules["model.layers.0.mlp.down_proj"], QuantizedLinear)


class Indexed(torch.nn.Module):
    def forward(self, x, ids):
        return x * 2 + (ids + 1)


def test_integer_operands_are_left_and_listed_and_a_rule_of_only_them_is_refused():
    """``ids + 1`` has integer operands only; ``x * 2 + (ids + 1)`` a float and an integer one: a rule for every add
    quantizes the float operand and lists the integer ones; a rule that selects only ``ids + 1`` is refused."""
    mg = ml.MaseGraph(Indexed(), example_inputs={"x": torch.randn(3, 4), "ids": torch.arange(12).view(3, 4)})
    fmt = {"name": "integer", "width": 8, "frac_width": 4}
    with pytest.raises(PassError, match=r"rules.add: node 'add': its data_in_0 \(ids\) is a tensor of int64 values"):
        ml.passes.quantize(mg, {"by": "name", "rules": {"add": fmt}})
    mg, info = ml.passes.quantize(mg, {"by": "type", "rules": {"add": fmt}})
    assert info["integer_operands"] == [{"node": "add", "operand": "data_in_0"}, {"node": "add_1", "operand": "data_in_1"}]
    assert [r["node"] for r in info["replaced"]] == ["add_1"] and info["replaced"][0]["formats"] == {"data_in_0": fmt | {"signed": True, "floor": False}}
    x, ids = torch.tensor([[0.3, -1.1, 2.0, 0.05]]), torch.tensor([[1, 2, 3, 4]])
    assert mg.model(x=x, ids=ids).tolist() == [[2.625, 0.8125, 8.0, 5.125]]


def test_a_failure_halfway_leaves_every_module_and_node_as_before(gpt2, monkeypatch):
    mg = ml.MaseGraph(gpt2, hf_input_names=INPUTS)
    before = {n: type(m) for n, m in gpt2.named_modules()}
    with torch.no_grad():
        expected = mg.model(**batch()).logits
    quantize_module = importlib.import_module(ml.passes.get_pass("quantize").module)
    calls = []
    real = quantize_module._apply

    def fail_third(mg, planned):
        calls.append(planned)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        real(mg, planned)

    monkeypatch.setattr(quantize_module, "_apply", fail_third)  # the module that registered the pass
    with pytest.raises(PassError, match="quantizing failed, the graph is as before: RuntimeError: disk on fire"):
        ml.passes.quantize(mg, {"by": "type", "rules": {"linear": {"weight": INT8}}})
    assert {n: type(m) for n, m in gpt2.named_modules()} == before
    assert [n.op for n in mg.nodes].count("call_module") == sum(1 for n in mg.nodes if n.op == "call_module")
    with torch.no_grad():
        assert torch.equal(mg.model(**batch()).logits, expected)
