import copy

import pytest
import torch
import torch.nn as nn
from transformers import (
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    RobertaConfig,
    RobertaForSequenceClassification,
)

from mase_lite import MaseGraph, UserError
from mase_lite.ir.capture import CaptureError, caches_off
from mase_lite.ir.ops import is_leaf_class
from tests.conftest import tiny_bert_config
from tests.ir import models
from tests.ir.models import DataDependent, Gate, GatedNet, TwiceMLP, small_cnn


def leaf_calls(model: nn.Module, run, leaf_types=()) -> int:
    """How many times leaf modules are called when ``run()`` executes the original model."""
    calls = []
    handles = [
        m.register_forward_hook(lambda *a: calls.append(1))
        for m in model.modules()
        if is_leaf_class(type(m), tuple(leaf_types)) and not isinstance(m, nn.Identity)
    ]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return len(calls)


def module_nodes(mg) -> list:
    originals = dict(mg.source_model.named_modules())
    return [n for n in mg.nodes if n.op == "call_module" and n.target in originals]


def token_batch(vocab: int, batch: int, seq: int, names, labels_shape=None, num_labels=2):
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    inputs = {
        "input_ids": torch.randint(0, vocab, (batch, seq), generator=g),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "token_type_ids": torch.randint(0, 2, (batch, seq), generator=g),
    }
    if seq > 2:
        inputs["attention_mask"][0, seq // 2 :] = 0
    inputs["labels"] = (
        torch.randint(0, vocab, labels_shape(batch, seq), generator=g)
        if labels_shape
        else torch.randint(0, num_labels, (batch,), generator=g)
    )
    return {k: v for k, v in inputs.items() if k in names}


def assert_same_outputs(a, b):
    for key in a.keys():
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key


SHAPES = [(1, 1), (2, 7), (5, 64)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "names",
    [
        ["input_ids"],
        ["input_ids", "attention_mask"],
        ["input_ids", "attention_mask", "token_type_ids", "labels"],
    ],
)
def test_bert_outputs_identical_across_shapes(attn, names):
    torch.manual_seed(0)
    model = BertForSequenceClassification._from_config(tiny_bert_config(), attn_implementation=attn).eval()
    mg = MaseGraph(model, hf_input_names=names)
    for batch, seq in SHAPES:
        inputs = token_batch(1000, batch, seq, names)
        with torch.no_grad():
            expected, got = model(**inputs), mg.model(**inputs)
        assert type(got) is type(expected)
        assert_same_outputs(expected, got)
    example = token_batch(1000, 2, 9, names)
    assert len(module_nodes(mg)) == leaf_calls(model, lambda: model(**example)) == 31


def test_bert_train_mode_bit_exact_and_eval_switches_back(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask", "labels"])
    inputs = token_batch(1000, 4, 16, ["input_ids", "attention_mask", "labels"])
    tiny_bert.train()
    mg.model.train()
    torch.manual_seed(7)
    expected = tiny_bert(**inputs)
    torch.manual_seed(7)
    got = mg.model(**inputs)
    assert_same_outputs(expected, got)
    tiny_bert.eval()
    mg.model.eval()
    with torch.no_grad():
        assert torch.equal(mg.model(**inputs).logits, mg.model(**inputs).logits)
        assert torch.equal(tiny_bert(**inputs).logits, mg.model(**inputs).logits)


def test_bert_attention_dropout_is_a_module_node_following_the_mode(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids"])
    sdpa = [n for n in mg.nodes if n.meta["mase"]["op"] == "sdpa"]
    assert len(sdpa) == 2 and all(n.op == "call_module" for n in sdpa)
    assert mg.modules[sdpa[0].target].dropout_p == pytest.approx(0.1)


def test_gpt2_with_tied_weights():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=128)
    model = GPT2LMHeadModel(config).eval()
    mg = MaseGraph(model, hf_input_names=["input_ids", "attention_mask", "labels"])
    names = ["input_ids", "attention_mask", "labels"]
    for batch, seq in [(1, 3), (4, 40)]:
        inputs = token_batch(500, batch, seq, names, labels_shape=lambda b, s: (b, s))
        with torch.no_grad(), caches_off(model):  # what the graph captures: no key/value cache
            assert_same_outputs(model(**inputs), mg.model(**inputs))
    ops = [n.meta["mase"]["op"] for n in module_nodes(mg)]
    assert ops.count("hf_conv1d") == 8 and ops.count("linear") == 1
    assert mg.model.lm_head.weight is mg.model.transformer.wte.weight
    example = token_batch(500, 2, 9, names, labels_shape=lambda b, s: (b, s))
    assert len(module_nodes(mg)) == leaf_calls(model, lambda: model(**example))


def test_roberta_small():
    torch.manual_seed(0)
    config = RobertaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=700
    )
    model = RobertaForSequenceClassification(config).eval()
    names = ["input_ids", "attention_mask", "labels"]
    mg = MaseGraph(model, hf_input_names=names)
    for batch, seq in [(2, 5), (6, 33)]:
        inputs = token_batch(700, batch, seq, names)
        inputs["input_ids"] = inputs["input_ids"].clamp(min=3)
        with torch.no_grad():
            assert_same_outputs(model(**inputs), mg.model(**inputs))


def test_cnn_batchnorm_train_and_eval():
    model = small_cnn()
    reference = copy.deepcopy(model)
    mg = MaseGraph(model, example_inputs={"x": torch.randn(4, 3, 16, 16)})
    assert [n.meta["mase"]["op"] for n in module_nodes(mg)] == [
        "conv2d", "batch_norm", "relu", "max_pool2d", "conv2d", "batch_norm", "relu",
        "adaptive_avg_pool2d", "flatten", "linear",
    ]  # fmt: skip
    x = torch.randn(6, 3, 16, 16)
    mg.model.train()
    reference.train()
    assert torch.equal(mg.model(x=x), reference(x))
    assert torch.equal(model.bn1.running_mean, reference.bn1.running_mean)
    assert int(model.bn1.num_batches_tracked) == 1
    mg.model.eval()
    reference.eval()
    for batch in (1, 9):
        x = torch.randn(batch, 3, 16, 16)
        assert torch.equal(mg.model(x=x), reference(x))


def test_module_called_twice_gets_one_node_per_call():
    torch.manual_seed(0)
    model = TwiceMLP()
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 16)})
    targets = [n.target for n in module_nodes(mg)]
    assert targets == ["inp", "act", "hidden", "act", "hidden", "act", "drop", "out"]
    assert targets.count("hidden") == 2
    x = torch.randn(5, 16)
    assert len(targets) == leaf_calls(model, lambda: model(x))
    model.eval()
    mg.model.eval()
    assert torch.equal(mg.model(x=x), model(x))


def test_user_leaf_module_with_two_inputs():
    torch.manual_seed(0)
    model = GatedNet()
    mg = MaseGraph(model, example_inputs={"x": torch.randn(3, 8), "y": torch.randn(3, 8)}, leaf_modules=[Gate])
    gate = [n for n in mg.nodes if n.target == "gate"]
    assert len(gate) == 1 and [a.target for a in gate[0].args] == ["left", "right"]
    assert gate[0].meta["mase"]["op"] == "gate" and gate[0].meta["mase"]["module"] == "Gate"
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(mg.model(x=x, y=y), model(x, y))


def test_training_through_graph_updates_original_parameters(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask", "labels"])
    weight = tiny_bert.classifier.weight
    assert mg.model.classifier.weight is weight
    before = weight.detach().clone()
    opt = torch.optim.SGD(mg.model.parameters(), lr=0.5)
    mg.model.train()
    loss = mg.model(**token_batch(1000, 4, 8, ["input_ids", "attention_mask", "labels"])).loss
    loss.backward()
    opt.step()
    assert not torch.equal(before, weight.detach())
    assert weight.grad is not None


def test_parameters_are_the_models_own(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids"])
    own = {id(p) for p in tiny_bert.parameters()}
    assert {id(p) for p in mg.model.parameters()} == own
    assert mg.model.bert is tiny_bert.bert


def test_unknown_input_name(tiny_bert):
    with pytest.raises(UserError, match=r"takes no input 'pixel_mask'; it accepts: input_ids, attention_mask"):
        MaseGraph(tiny_bert, hf_input_names=["input_ids", "pixel_mask"])


def test_unknown_example_input_name():
    with pytest.raises(UserError, match=r"example_inputs: TwiceMLP.forward takes no input 'y'; it accepts: x"):
        MaseGraph(TwiceMLP(), example_inputs={"y": torch.randn(2, 16)})


def test_call_with_inputs_not_captured(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])
    ids = torch.randint(0, 100, (2, 5))
    with pytest.raises(UserError, match=r"captured with inputs \(input_ids, attention_mask\); missing: input_ids"):
        mg.model(attention_mask=torch.ones_like(ids))
    with pytest.raises(UserError, match=r"not captured: labels"):
        mg.model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(2, dtype=torch.long))


def test_a_graph_captured_for_training_is_called_for_inference_with_ids_alone(tiny_bert):
    """Captured with a mask and labels (as a run trains it), called as a runtime calls it: every token attended,
    no labels, so no loss; the logits are the model's, and with the mask and labels given the loss is too."""
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask", "labels"])
    ids = torch.randint(0, 100, (3, 6))
    out = mg.model(input_ids=ids)
    assert list(out.keys()) == ["logits"]
    assert torch.equal(out.logits, tiny_bert(input_ids=ids).logits)
    labels = torch.tensor([0, 1, 1])
    full = mg.model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    assert torch.equal(full.loss, tiny_bert(input_ids=ids, labels=labels).loss)


def test_export_failure_names_module_line_and_keeps_torchs_reason():
    with pytest.raises(CaptureError) as err:
        MaseGraph(DataDependent(), example_inputs={"x": torch.randn(3, 4)})
    line = DataDependent.forward.__code__.co_firstlineno + 2
    lines = str(err.value).splitlines()
    assert lines[0].startswith(
        "torch.export could not capture DataDependent: GuardOnDataDependentSymNode: Could not guard on data-dependent"
    )
    assert lines[1].startswith(f"  at {models.__file__}:{line} in DataDependent (the model): if h.sum() > 0:")
    assert any(ln.startswith("  Caused by: ") for ln in lines)
    assert any(ln.startswith("  torch suggests: consider using data-dependent friendly APIs") for ln in lines)


def test_plain_module_needs_example_inputs():
    with pytest.raises(UserError, match="not a transformers model: pass example_inputs"):
        MaseGraph(TwiceMLP())


def test_to_device_retargets_device_constants(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])
    consts = [
        a for n in mg.nodes for a in list(n.args) + list(n.kwargs.values()) if isinstance(a, torch.device)
    ]
    assert consts and all(c.type == "cpu" for c in consts)
    mg.to("meta")
    consts = [
        a for n in mg.nodes for a in list(n.args) + list(n.kwargs.values()) if isinstance(a, torch.device)
    ]
    assert consts and all(c.type == "meta" for c in consts)
    assert all(p.device.type == "meta" for p in mg.model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_cuda_runs_on_gpu(tiny_bert):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"]).to("cuda")
    inputs = {k: v.cuda() for k, v in token_batch(1000, 2, 9, ["input_ids", "attention_mask"]).items()}
    with torch.no_grad():
        assert mg.model(**inputs).logits.device.type == "cuda"
