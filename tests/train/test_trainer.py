import math

import pytest
import torch
import torch.nn as nn
from transformers.modeling_outputs import SequenceClassifierOutput

from mase_lite.infra.errors import UserError
from mase_lite.workloads import evaluate_model, fit, prepare
from mase_lite.workloads.trainer import _Optimiser, split_trainable


def learning_rates(schedule: str, total: int = 10, warmup: int = 2) -> list[float]:
    """The learning rate of each of ``total`` steps of a ``fit`` optimiser with base lr 1."""
    p = nn.Parameter(torch.zeros(2, 2))
    opt = _Optimiser({"p": p}, 1.0, 0.0, total, warmup, schedule, None, None)
    rates = []
    for _ in range(total + 1):
        rates.append(opt.optimizer.param_groups[0]["lr"])
        opt.step((p * 0).sum())
    return rates


def test_schedules_warm_up_from_zero_then_decay_to_zero():
    # warm-up: step / warmup; then linear (total - step) / (total - warmup), or half a cosine period
    assert learning_rates("linear") == pytest.approx([0.0, 0.5] + [(10 - s) / 8 for s in range(2, 11)])
    assert learning_rates("cosine") == pytest.approx(
        [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 11)]
    )
    assert learning_rates("constant") == pytest.approx([0.0, 0.5] + [1.0] * 9)
    assert learning_rates("linear", total=4, warmup=0) == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_seed_everything_repeats_python_numpy_and_torch():
    import random

    import numpy as np

    from mase_lite.workloads import seed_everything

    draws = []
    for _ in range(2):
        seed_everything(3)
        draws.append((random.random(), float(np.random.rand()), torch.rand(1).item()))
    assert draws[0] == draws[1]


@pytest.fixture
def tiny(tmp_path, tiny_model_spec, tiny_data_spec):
    return prepare(tiny_model_spec, tiny_data_spec, tmp_path, seed=0)


def test_training_lowers_the_loss_and_reports_steps(tiny):
    model, data = tiny
    before = evaluate_model(model, data, split="train", progress=False)["loss"]
    info = fit(model, data, epochs=3, lr=3e-3, batch_size=16, progress=False)
    assert info["steps"] == 3 * 6 and info["samples"] == 3 * 96 and info["epochs"] == 3
    assert info["trainable_parameters"] == sum(p.numel() for p in model.parameters())
    assert info["mixed_precision"] == "off" and info["seconds"] > 0
    assert evaluate_model(model, data, split="train", progress=False)["loss"] < before


def test_max_steps_stops_early(tiny):
    model, data = tiny
    assert fit(model, data, epochs=5, max_steps=4, batch_size=16, progress=False)["steps"] == 4


def test_frozen_parameters_stay_put_and_get_their_flag_back(tiny):
    model, data = tiny
    model.classifier.bias.requires_grad_(False)
    embeddings = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("bert.embeddings.")}
    bias = model.classifier.bias.detach().clone()
    query = model.bert.encoder.layer[0].attention.self.query.weight.detach().clone()
    info = fit(model, data, max_steps=3, batch_size=16, freeze=[r"bert.embeddings.*"], progress=False)
    for name, p in model.named_parameters():
        if name in embeddings:
            assert torch.equal(p, embeddings[name]), name
    assert torch.equal(model.classifier.bias, bias) and not model.classifier.bias.requires_grad
    assert not torch.equal(model.bert.encoder.layer[0].attention.self.query.weight, query)
    assert all(p.requires_grad for n, p in model.named_parameters() if n != "classifier.bias")
    assert info["frozen_parameters"] == sum(p.numel() for p in embeddings.values())
    assert not model.training


def test_freeze_patterns_must_be_valid_and_match(tiny):
    model, _ = tiny
    with pytest.raises(UserError, match=r"freeze: 'bert\(' is not a valid regex \(missing \)"):
        split_trainable(model, ["bert("])
    with pytest.raises(UserError, match=r"freeze: 'encoder.*' matches no parameter name \(names look like: bert.embeddings"):
        split_trainable(model, ["encoder.*"])
    with pytest.raises(UserError, match="no trainable parameters"):
        split_trainable(model, [".*"])


def test_same_seed_same_weights_and_metrics(tmp_path, tiny_model_spec, tiny_data_spec):
    runs = []
    for name in ("a", "b", "c"):
        model, data = prepare(tiny_model_spec, tiny_data_spec, tmp_path / name, seed=0 if name != "c" else 1)
        info = fit(model, data, max_steps=5, batch_size=16, seed=0 if name != "c" else 1, progress=False)
        runs.append((info["loss"], evaluate_model(model, data, progress=False), model.state_dict()))
    (loss_a, metrics_a, state_a), (loss_b, metrics_b, state_b), (loss_c, _, state_c) = runs
    assert loss_a == loss_b and metrics_a == metrics_b
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert loss_c != loss_a


class NanModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, input_ids, attention_mask, labels):
        logits = self.scale * torch.full((len(input_ids), 2), math.nan)
        return SequenceClassifierOutput(loss=logits.sum(), logits=logits)


def test_a_diverging_loss_is_a_clear_error(tiny):
    _, data = tiny
    with pytest.raises(UserError, match=r"training diverged: the loss is nan at step 0; lower lr \(now 0.001\)"):
        fit(NanModel(), data, progress=False)


def test_mixed_precision_on_cpu_is_refused(tiny):
    model, data = tiny
    with pytest.raises(UserError, match=r"mixed_precision = 'bf16' needs a CUDA model; the model is on cpu"):
        fit(model, data, mixed_precision="bf16", progress=False)


class LogitsOnly(nn.Module):
    """A classifier returning bare logits (no loss): the trainer computes cross-entropy itself."""

    def __init__(self, vocab: int):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, 2, mode="sum")

    def forward(self, input_ids, attention_mask):
        return self.embed(input_ids, per_sample_weights=attention_mask.float())


def test_models_without_labels_input_train_on_cross_entropy(tiny):
    _, data = tiny
    model = LogitsOnly(data.vocab_size)
    before = model.embed.weight.detach().clone()
    info = fit(model, data, input_names=["input_ids", "attention_mask"], max_steps=2, batch_size=8, progress=False)
    assert info["steps"] == 2 and math.isfinite(info["loss"]) and not torch.equal(model.embed.weight, before)
    with pytest.raises(UserError, match=r"takes input\(s\) token_type_ids that the data does not provide"):
        fit(model, data, input_names=["input_ids", "token_type_ids"], progress=False)


def test_a_run_neither_depends_on_nor_disturbs_the_global_generator(tmp_path, tiny_model_spec, tiny_data_spec):
    states = []
    for name, draws in (("a", 0), ("b", 1000)):
        model, data = prepare(tiny_model_spec, tiny_data_spec, tmp_path / name, seed=0)
        torch.rand(draws)
        before = torch.get_rng_state()
        fit(model, data, max_steps=3, batch_size=16, progress=False)
        assert torch.equal(torch.get_rng_state(), before)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_precision_on_cuda_keeps_float32_weights(tiny):
    model, data = tiny
    model.cuda()
    info = fit(model, data, max_steps=3, batch_size=16, progress=False)
    assert info["mixed_precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    assert fit(model, data, max_steps=2, mixed_precision="fp16", progress=False)["mixed_precision"] == "fp16"
    assert math.isfinite(info["loss"]) and all(p.dtype == torch.float32 for p in model.parameters())
