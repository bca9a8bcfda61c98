import json

import pytest
import torch

import mase_lite as ml
from mase_lite.passes import PassError
from tests.ir.models import small_cnn


class ListData:
    """A minimal stand-in for the run's data: fixed batches, served in order."""

    def __init__(self, batches):
        self.batches = batches

    def loader(self, split, batch_size, shuffle=False, seed=0):
        return iter(self.batches)


@pytest.fixture
def bert_graph(tiny_bert):
    return ml.MaseGraph(tiny_bert, hf_input_names=["input_ids", "attention_mask"])


def test_count_parameters_ops_and_macs_by_hand(bert_graph):
    mg, info = ml.passes.count(bert_graph, {"dims": {"batch": 1, "seq": 10}})
    S, H, I = 10, 128, 512
    per_layer_linear = 4 * S * H * H + S * H * I + S * I * H
    per_layer_sdpa = 2 * S * S * (64 + 64)
    expected = 2 * (per_layer_linear + per_layer_sdpa) + H * H + H * 2
    assert info["macs"] == expected
    assert info["macs_by_op"] == {"linear": 2 * per_layer_linear + H * H + H * 2, "sdpa": 2 * per_layer_sdpa}
    assert info["parameters"] == sum(p.numel() for p in mg.model.parameters())
    assert info["ops"]["linear"] == 14 and info["ops"]["sdpa"] == 2


def test_count_conv_macs():
    mg = ml.MaseGraph(small_cnn(), example_inputs={"x": torch.randn(2, 3, 16, 16)})
    _, info = ml.passes.count(mg, {"dims": {"batch": 2}})
    conv1 = 2 * 8 * 16 * 16 * 3 * 9
    conv2 = 2 * 16 * 8 * 8 * 8 * 9
    fc = 2 * 10 * 16
    assert info["macs_by_node"] == {"conv1": conv1, "conv2": conv2, "fc": fc}


def test_count_needs_values_for_symbols(bert_graph):
    with pytest.raises(ml.UserError, match=r"needs a value for: seq"):
        ml.passes.count(bert_graph, {"dims": {"batch": 1}})


def test_avg_bits_float32_and_with_formats(bert_graph):
    _, info = ml.passes.avg_bits(bert_graph)
    assert info["weights"] == 32.0 and info["activations"] == 32.0
    query = next(n for n in bert_graph.nodes if n.name == "bert_encoder_layer_0_attention_self_query")
    query.meta["mase"]["params"]["weight"]["format"] = "bfloat16"
    _, info = ml.passes.avg_bits(bert_graph, {"dims": {"batch": 1, "seq": 4}})
    linear_weights = 2 * (4 * 128 * 128 + 2 * 128 * 512) + 128 * 128 + 2 * 128
    linear_biases = 2 * (4 * 128 + 512 + 128) + 128 + 2
    total = linear_weights + linear_biases
    assert info["weight_elements"] == total
    assert info["weights"] == pytest.approx((32 * total - 16 * 128 * 128) / total)
    assert info["per_node"]["bert_encoder_layer_0_attention_self_query"]["weights"] == pytest.approx(
        (16 * 128 * 128 + 32 * 128) / (128 * 128 + 128)
    )


def test_verify_passes_then_catches_tampering(bert_graph):
    _, info = ml.passes.verify(bert_graph)
    assert info["ok"] and info["problems"] == []
    node = next(n for n in bert_graph.nodes if n.name == "classifier")
    node.meta["mase"]["params"]["weight"]["shape"] = [3, 128]
    _, info = ml.passes.verify(bert_graph, {"strict": False})
    assert info["problems"] == ["classifier: parameter 'weight' metadata [3, 128] does not match [2, 128]"]
    with pytest.raises(PassError, match=r"verify found problems:\nclassifier: parameter 'weight'"):
        ml.passes.verify(bert_graph)


def test_metadata_pass_restores_after_edit(bert_graph):
    node = next(n for n in bert_graph.nodes if n.name == "classifier")
    del node.meta["mase"]
    _, info = ml.passes.metadata(bert_graph)
    assert node.meta["mase"]["op"] == "linear" and info["ops"]["linear"] == 14


def test_report_writes_markdown_and_json(bert_graph, tmp_path, capsys):
    _, info = ml.passes.report(bert_graph, {"path": "nodes"}, output_dir=tmp_path)
    rows = json.loads((tmp_path / "nodes.json").read_text())
    assert info["rows"] == len(rows) == 31 + 2 + 2 + 1
    query = next(r for r in rows if r["name"] == "bert_encoder_layer_0_attention_self_query")
    assert query == {
        "name": "bert_encoder_layer_0_attention_self_query",
        "op": "linear",
        "module": "Linear",
        "inputs": "batch×seq×128",
        "output": "batch×seq×128",
        "format": "float32",
    }
    md = (tmp_path / "nodes.md").read_text().splitlines()
    assert md[0] == "| name | op | module | inputs | output | format |" and len(md) == len(rows) + 2
    assert "bert_encoder_layer_0_attention_self_query" in capsys.readouterr().out


def _batches(n, batch=4, seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, 1000, (batch, seq), generator=g),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch,), generator=g),
        }
        for _ in range(n)
    ]


def test_profile_statistics_equal_direct_torch(bert_graph, tiny_bert):
    batches = _batches(3)
    params = {"by": "name", "targets": ["bert_encoder_layer_0_intermediate_dense"], "num_batches": 3, "quantiles": [0.1, 0.5, 0.9]}
    _, info = ml.passes.profile(bert_graph, params, data=ListData(batches))
    outs = []
    hook = tiny_bert.bert.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, i, o: outs.append(o.detach()))
    with torch.no_grad():
        for b in batches:
            tiny_bert(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    hook.remove()
    values = torch.cat([o.flatten() for o in outs]).double()
    got = info["nodes"]["bert_encoder_layer_0_intermediate_dense"]["data_out"]
    assert got["count"] == values.numel() == 3 * 4 * 12 * 512
    assert got["min"] == values.min().item() and got["max"] == values.max().item()
    assert got["mean"] == pytest.approx(values.mean().item(), rel=1e-12)
    assert got["variance"] == pytest.approx(values.var(unbiased=False).item(), rel=1e-10)
    assert got["abs_mean"] == pytest.approx(values.abs().mean().item(), rel=1e-12)
    q = torch.quantile(values, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    assert [got["quantiles"][k] for k in ("0.1", "0.5", "0.9")] == q.tolist()
    assert got["exact_quantiles"] is True
    w = tiny_bert.bert.encoder.layer[0].intermediate.dense.weight.detach().double()
    weight = info["nodes"]["bert_encoder_layer_0_intermediate_dense"]["weight"]
    assert weight["max"] == w.max().item() and weight["variance"] == pytest.approx(w.var(unbiased=False).item())
    node = next(n for n in bert_graph.nodes if n.name == "bert_encoder_layer_0_intermediate_dense")
    assert node.meta["mase"]["profile"]["data_out"]["count"] == got["count"]


def test_profile_selects_by_op_and_regex(bert_graph):
    data = ListData(_batches(1))
    _, info = ml.passes.profile(bert_graph, {"num_batches": 1}, data=data)
    assert len(info["nodes"]) == 14 + 2
    _, info = ml.passes.profile(bert_graph, {"by": "regex", "targets": [r".*layer_1.*dense"], "num_batches": 1}, data=data)
    assert sorted(info["nodes"]) == [
        "bert_encoder_layer_1_attention_output_dense",
        "bert_encoder_layer_1_intermediate_dense",
        "bert_encoder_layer_1_output_dense",
    ]


def test_profile_without_data(bert_graph):
    with pytest.raises(PassError, match=r"pass 'profile' needs 'data', which this call lacks: give it data \(ml.passes.profile\(mg, params, data=...\)\) or run it in a pipeline with a `data` section"):
        ml.passes.profile(bert_graph)


def test_selection_matching_nothing(bert_graph):
    data = ListData(_batches(1))
    with pytest.raises(PassError, match=r"pass 'profile': selection by type with targets \['conv2d'\] matches no node; available: "):
        ml.passes.profile(bert_graph, {"targets": ["conv2d"]}, data=data)
    _, info = ml.passes.profile(bert_graph, {"targets": ["conv2d"], "allow_empty": True}, data=data)
    assert info["nodes"] == {}
