import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from mase_lite import MaseGraph, UserError
from mase_lite.infra.trust import trusting
from tests.ir.models import small_cnn


def test_bert_round_trip_through_dotted_path(tiny_bert, tmp_path):
    names = ["input_ids", "attention_mask", "labels"]
    mg = MaseGraph(tiny_bert, hf_input_names=names)
    with torch.no_grad():
        tiny_bert.classifier.weight.add_(1.0)
    target = tmp_path / "run.v1.2" / "model.ckpt"
    mg.save(target)
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "recipe.json"]
    recipe = json.loads((target / "recipe.json").read_text())
    assert recipe["model"]["hf_class"] == "BertForSequenceClassification"
    assert recipe["hf_input_names"] == names
    loaded = MaseGraph.load(target)
    assert loaded.input_names == mg.input_names
    batch = {
        "input_ids": torch.randint(0, 1000, (3, 11)),
        "attention_mask": torch.ones(3, 11, dtype=torch.long),
        "labels": torch.tensor([0, 1, 1]),
    }
    with torch.no_grad():
        assert torch.equal(loaded.model(**batch).logits, mg.model(**batch).logits)
    assert [n.name for n in loaded.nodes] == [n.name for n in mg.nodes]


def test_gpt2_tied_weights_survive(tmp_path):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).eval()
    mg = MaseGraph(model, hf_input_names=["input_ids"])
    mg.save(tmp_path / "gpt2")
    loaded = MaseGraph.load(tmp_path / "gpt2")
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, mg.model(input_ids=ids).logits)


def test_factory_recipe_and_missing_recipe(tmp_path):
    model = small_cnn(classes=5).eval()
    x = torch.randn(2, 3, 16, 16)
    plain = MaseGraph(model, example_inputs={"x": x})
    plain.save(tmp_path / "plain")
    with pytest.raises(UserError, match=r"no recipe to rebuild the model was saved; pass the model"):
        MaseGraph.load(tmp_path / "plain")
    again = MaseGraph.load(tmp_path / "plain", model=small_cnn(classes=5))
    assert torch.equal(again.model(x=x), plain.model(x=x))
    factory = MaseGraph(model, example_inputs={"x": x}, recipe={"factory": "tests.ir.models:small_cnn", "kwargs": {"classes": 5}})
    factory.save(tmp_path / "factory")
    with pytest.raises(UserError, match=r"'tests.ir.models:small_cnn' is not a registered model factory.*--trust-code"):
        MaseGraph.load(tmp_path / "factory")
    with trusting():
        assert torch.equal(MaseGraph.load(tmp_path / "factory").model(x=x), plain.model(x=x))


def test_shape_mismatch_names_the_tensor(tmp_path):
    MaseGraph(small_cnn(classes=5), example_inputs={"x": torch.randn(2, 3, 8, 8)}).save(tmp_path / "c")
    with pytest.raises(UserError, match=r"tensor 'fc.weight' has shape \[5, 16\] in the checkpoint but \[7, 16\] in the model"):
        MaseGraph.load(tmp_path / "c", model=small_cnn(classes=7))


def test_corrupt_checkpoint(tmp_path):
    MaseGraph(small_cnn(), example_inputs={"x": torch.randn(2, 3, 8, 8)}).save(tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(UserError, match=r"is not a readable safetensors checkpoint"):
        MaseGraph.load(tmp_path / "c", model=small_cnn())


def test_not_a_saved_graph(tmp_path):
    with pytest.raises(UserError, match=r"is not a saved MaseGraph: recipe.json is missing"):
        MaseGraph.load(tmp_path)


def test_save_replaces_atomically_and_leaves_no_temporaries(tmp_path):
    mg = MaseGraph(small_cnn(), example_inputs={"x": torch.randn(2, 3, 8, 8)})
    mg.save(tmp_path / "c")
    mg.save(tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_saved_on_gpu_loads_on_cpu(tiny_bert, tmp_path):
    mg = MaseGraph(tiny_bert, hf_input_names=["input_ids"]).to("cuda")
    mg.save(tmp_path / "g")
    loaded = MaseGraph.load(tmp_path / "g")
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())


def test_example_input_specs_make_tensors_and_name_a_bad_dtype():
    from mase_lite.ir.serialize import example_inputs_from_specs

    made = example_inputs_from_specs({"x": {"shape": [2, 3], "dtype": "float16"}, "ids": {"shape": [2], "dtype": "int64"}})
    assert made["x"].dtype == torch.float16 and list(made["x"].shape) == [2, 3]
    assert torch.equal(made["ids"], torch.zeros(2, dtype=torch.int64))
    with pytest.raises(UserError, match=r"example_inputs.x.dtype: 'float33' is not a torch dtype"):
        example_inputs_from_specs({"x": {"shape": [2], "dtype": "float33"}})


def test_a_refused_checkpoint_leaves_the_model_untouched(tmp_path):
    """Every tensor is checked before any is written: a bad last tensor changes nothing."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    MaseGraph(small_cnn(classes=5), example_inputs={"x": torch.randn(2, 3, 8, 8)}).save(tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    state = load_file(str(weights))
    last = list(small_cnn(classes=5).state_dict())[-1]
    save_file({**state, last: torch.zeros(3)}, str(weights))
    target = small_cnn(classes=5)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(UserError, match=rf"tensor '{last}' has shape \[3\] in the checkpoint"):
        MaseGraph.load(tmp_path / "c", model=target)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_tied_weights_are_saved_once_and_a_checkpoint_without_either_name_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, n_positions=64)).eval()
    MaseGraph(model, hf_input_names=["input_ids"]).save(tmp_path / "gpt2")
    weights = tmp_path / "gpt2" / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        tied = {"lm_head.weight", "transformer.wte.weight"} & set(f.keys())
    assert len(tied) == 1  # one copy of the shared matrix
    state = load_file(str(weights))
    save_file({k: v for k, v in state.items() if k not in tied}, str(weights))
    with pytest.raises(UserError, match=r"checkpoint lacks tensors the model needs: (lm_head|transformer\.wte)\.weight"):
        MaseGraph.load(tmp_path / "gpt2")
