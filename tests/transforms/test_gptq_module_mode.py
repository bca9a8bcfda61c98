"""gptq runs on modules alone (it only runs the model's modules): in module mode, with no capture, it gives the
weights and the perplexity graph mode gives, bit for bit."""

import torch

import mase_lite as ml


def spec(capture, tmp_path):
    return {"seed": 0, "capture": capture,
            "model": {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                                                         "num_attention_heads": 2, "num_key_value_heads": 1,
                                                         "intermediate_size": 64, "max_position_embeddings": 32}},
            "data": {"block_size": 16, "n_train": 16, "n_test": 8},
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": {"weight": {
                          "name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 16}}}}},
                      {"pass": "gptq", "params": {"num_batches": 2, "batch_size": 4}},
                      {"pass": "evaluate", "params": {"progress": False}}],
            "output_dir": str(tmp_path / capture)}


def test_module_mode_equals_graph_mode(tmp_path):
    graph, modules = (ml.run_pipeline(spec(c, tmp_path)) for c in ("graph", "modules"))
    assert modules.report["capture"]["mode"] == "modules"
    assert modules.report["metrics"]["evaluate"]["perplexity"] == graph.report["metrics"]["evaluate"]["perplexity"]
    for name, param in graph.mg.source_model.named_parameters():
        assert torch.equal(param, modules.mg.model.get_parameter(name)), name
