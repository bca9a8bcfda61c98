"""fuse_sdpa / unfuse_sdpa on BERT (eager and sdpa attention) and hand-written attention modules."""

import collections
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mase_lite.passes as passes
from mase_lite.ir.graph import MaseGraph
from mase_lite.ir.modules import ScaledDotProductAttention


class HandAttention(nn.Module):
    """Multi-head attention written with plain ops, in a few spellings of scale, kᵀ and mask."""

    def __init__(self, dim=32, heads=4, dropout=0.25, scale_op="div", key_layout="transpose", masked=True):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.drop = nn.Dropout(dropout)
        self.scale_op, self.key_layout, self.masked = scale_op, key_layout, masked

    def forward(self, x, mask):
        b, n, _ = x.shape
        split = (b, n, self.heads, self.head_dim)
        q = self.q(x).view(split).transpose(1, 2)
        v = self.v(x).view(split).transpose(1, 2)
        if self.key_layout == "transpose":
            k_t = self.k(x).view(split).transpose(1, 2).transpose(-2, -1)
        else:
            k_t = self.k(x).view(split).permute(0, 2, 3, 1)
        scores = q @ k_t
        if self.scale_op == "div":
            scores = scores / math.sqrt(self.head_dim)
        elif self.scale_op == "mul":
            scores = 0.5 * scores
        if self.masked:
            scores = scores + mask
        probs = self.drop(torch.softmax(scores, dim=-1))
        out = (probs @ v).transpose(1, 2).reshape(b, n, -1)
        return self.o(out)


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SoftmaxOverQueries(HandAttention):
    def forward(self, x, mask):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v


def additive_mask(batch=3, n=6):
    mask = torch.zeros(batch, 1, 1, n)
    mask[1, ..., 4:] = torch.finfo(torch.float32).min
    return mask


def capture(module, x=None, mask=None):
    torch.manual_seed(0)
    module.eval()
    x = torch.randn(3, 6, 32) if x is None else x
    return MaseGraph(module, example_inputs={"x": x, "mask": additive_mask() if mask is None else mask})


def ops(mg):
    return [n.meta["mase"]["op"] for n in mg.nodes]


def targets(mg):
    """The call_function targets of the graph, with their counts."""
    return collections.Counter(n.target for n in mg.nodes if n.op == "call_function")


def test_bert_eager_attention_is_fused_with_equal_outputs(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    assert ops(bert).count("softmax") == 2 and "sdpa" not in ops(bert)
    bert, info = passes.fuse_sdpa(bert)
    assert info["fused"] == [
        {"node": f"bert_encoder_layer_{i}_attention_self_sdpa", "scale": 0.125, "dropout_p": 0.1, "masked": True}
        for i in (0, 1)
    ]
    assert ops(bert).count("sdpa") == 2 and "softmax" not in ops(bert) and "matmul" not in ops(bert)
    torch.testing.assert_close(bert.model(**bert_inputs).logits, reference, rtol=1e-5, atol=1e-5)
    fused = next(n for n in bert.nodes if n.meta["mase"]["op"] == "sdpa")
    assert fused.meta["mase"]["results"][0]["shape"] == ["batch", 2, "seq", 64]
    bert.model.graph.lint()


def test_fused_dropout_follows_train_and_eval_mode(bert, bert_inputs):
    bert, _ = passes.fuse_sdpa(bert)
    sdpa = bert.modules["bert_encoder_layer_0_attention_self_sdpa"]
    assert isinstance(sdpa, ScaledDotProductAttention) and sdpa.dropout_p == 0.1 and not sdpa.training
    eval_out = bert.model(**bert_inputs).logits
    bert.model.train()
    assert sdpa.training
    torch.manual_seed(0)
    first = bert.model(**bert_inputs).logits
    second = bert.model(**bert_inputs).logits
    assert not torch.equal(first, second) and not torch.equal(first, eval_out)
    bert.model.eval()
    assert torch.equal(bert.model(**bert_inputs).logits, eval_out)


def test_attention_dropout_alone_is_kept_in_train_mode(bert, bert_inputs):
    """With every other dropout removed, train-mode randomness comes from the fused attention only."""
    bert, _ = passes.fuse_sdpa(bert)
    bert, info = passes.remove_dropout(bert)
    assert len(info["removed"]) == 6 and "dropout" not in ops(bert)
    bert.model.train()
    assert not torch.equal(bert.model(**bert_inputs).logits, bert.model(**bert_inputs).logits)
    bert.modules["bert_encoder_layer_0_attention_self_sdpa"].dropout_p = 0.0
    bert.modules["bert_encoder_layer_1_attention_self_sdpa"].dropout_p = 0.0
    assert torch.equal(bert.model(**bert_inputs).logits, bert.model(**bert_inputs).logits)


@pytest.mark.parametrize(
    "scale_op, key_layout, masked, scale",
    [
        ("div", "transpose", True, 1 / math.sqrt(8)),
        ("mul", "permute", True, 0.5),
        ("none", "transpose", False, 1.0),
        ("div", "permute", False, 1 / math.sqrt(8)),
    ],
)
def test_hand_written_attention_spellings(scale_op, key_layout, masked, scale):
    mg = capture(HandAttention(scale_op=scale_op, key_layout=key_layout, masked=masked))
    x, mask = torch.randn(5, 6, 32), additive_mask(5)
    reference = mg.model(x=x, mask=mask)
    mg, info = passes.fuse_sdpa(mg)
    assert info["fused"] == [{"node": "sdpa", "scale": pytest.approx(scale), "dropout_p": 0.25, "masked": masked}]
    assert "softmax" not in ops(mg) and mg.modules["sdpa"].dropout_p == 0.25
    torch.testing.assert_close(mg.model(x=x, mask=mask), reference, rtol=1e-5, atol=1e-5)


def test_softmax_over_another_dim_is_not_attention():
    mg = capture(SoftmaxOverQueries())
    mg, info = passes.fuse_sdpa(mg)
    assert info == {"fused": []} and "softmax" in ops(mg)


def test_unfuse_bert_sdpa_with_bool_mask(bert_sdpa, bert_inputs):
    inputs = {k: v for k, v in bert_inputs.items() if k != "labels"}
    reference = bert_sdpa.model(**inputs).logits
    targets_before = targets(bert_sdpa)
    bert_sdpa, info = passes.unfuse_sdpa(bert_sdpa)
    assert info == {
        "unfused": ["bert_encoder_layer_0_attention_self_sdpa", "bert_encoder_layer_1_attention_self_sdpa"],
        "kept": [],
    }
    assert "sdpa" not in ops(bert_sdpa) and ops(bert_sdpa).count("softmax") == 2
    assert ops(bert_sdpa).count("masked_fill") == 2
    dropouts = [m for name, m in bert_sdpa.modules.items() if name.endswith("attn_dropout")]
    assert len(dropouts) == 2 and {d.p for d in dropouts} == {0.1} and not any(d.training for d in dropouts)
    torch.testing.assert_close(bert_sdpa.model(**inputs).logits, reference, rtol=1e-5, atol=1e-5)
    bert_sdpa, info = passes.fuse_sdpa(bert_sdpa)  # the masked_fill(not mask, -inf) is matched: the bool mask is back
    assert [f["node"] for f in info["fused"]] == [
        "bert_encoder_layer_0_attention_self_sdpa", "bert_encoder_layer_1_attention_self_sdpa"]
    assert targets(bert_sdpa) == targets_before  # the negation unfuse wrote is gone again
    torch.testing.assert_close(bert_sdpa.model(**inputs).logits, reference, rtol=1e-5, atol=1e-5)


def test_unfuse_then_fuse_round_trip_on_eager_bert(bert, bert_inputs):
    reference = bert.model(**bert_inputs).logits
    bert, _ = passes.fuse_sdpa(bert)
    bert, info = passes.unfuse_sdpa(bert)
    assert len(info["unfused"]) == 2 and "sdpa" not in ops(bert)
    torch.testing.assert_close(bert.model(**bert_inputs).logits, reference, rtol=0, atol=0)
    bert, info = passes.fuse_sdpa(bert)
    assert len(info["fused"]) == 2
    torch.testing.assert_close(bert.model(**bert_inputs).logits, reference, rtol=1e-5, atol=1e-5)


def test_unfuse_leaves_causal_attention_fused(caplog):
    q = torch.randn(2, 3, 5, 8)
    mg = MaseGraph(CausalAttention(), example_inputs={"q": q, "k": q.clone(), "v": q.clone()})
    mg, info = passes.unfuse_sdpa(mg)
    assert info["unfused"] == [] and len(info["kept"]) == 1
    assert "leaving" in caplog.text


def test_fuse_in_float64():
    module = HandAttention().double()
    mg = capture(module, x=torch.randn(3, 6, 32, dtype=torch.float64), mask=additive_mask().double())
    x, mask = torch.randn(2, 6, 32, dtype=torch.float64), additive_mask(2).double()
    reference = mg.model(x=x, mask=mask)
    mg, info = passes.fuse_sdpa(mg)
    assert len(info["fused"]) == 1
    torch.testing.assert_close(mg.model(x=x, mask=mask), reference, rtol=1e-12, atol=1e-12)


class MaskedFillAttention(HandAttention):
    """Attention masked with ``masked_fill`` on a bool mask (True = attend), spelled a few ways."""

    def __init__(self, where="not", fill=float("-inf"), dropout=0.0):
        super().__init__(dropout=dropout)
        self.where, self.fill = where, fill

    def forward(self, x, mask):
        b, n, _ = x.shape
        q, k, v = (f(x).view(b, n, self.heads, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        fill = torch.finfo(scores.dtype).min if self.fill == "lowest" else self.fill
        where = {"not": lambda: ~mask, "eq0": lambda: mask == 0, "logical_not": lambda: torch.logical_not(mask)}
        scores = scores.masked_fill(where[self.where](), fill)
        probs = self.drop(torch.softmax(scores, dim=-1))
        return self.o((probs @ v).transpose(1, 2).reshape(b, n, -1))


aten = torch.ops.aten


def bool_mask(batch=3, n=6, full_row=False):
    """Key-padding mask (True = attend): sample 1 masks its last two keys; ``full_row`` masks all of sample 0."""
    mask = torch.ones(batch, 1, 1, n, dtype=torch.bool)
    mask[1, ..., 4:] = False
    if full_row:
        mask[0] = False
    return mask


def capture_bool(module, dtype=torch.float32):
    torch.manual_seed(0)
    module = module.to(dtype).eval()
    return MaseGraph(module, example_inputs={"x": torch.randn(3, 6, 32, dtype=dtype), "mask": bool_mask()})


@pytest.mark.parametrize("where", ["not", "eq0", "logical_not"])
@pytest.mark.parametrize("fill", [float("-inf"), "lowest"])
def test_masked_fill_attention_is_fused(where, fill):
    mg = capture_bool(MaskedFillAttention(where, fill, dropout=0.25))
    x, mask = torch.randn(4, 6, 32), bool_mask(4)
    reference = mg.model(x=x, mask=mask)
    negation = {"not": aten.bitwise_not.default, "eq0": aten.eq.Scalar, "logical_not": aten.logical_not.default}[where]
    assert targets(mg)[negation] == 1
    mg, info = passes.fuse_sdpa(mg)
    assert info["fused"] == [{"node": "sdpa", "scale": pytest.approx(8 ** -0.5), "dropout_p": 0.25, "masked": True}]
    fused = next(n for n in mg.nodes if n.meta["mase"]["op"] == "sdpa")
    attn_mask = fused.kwargs["attn_mask"]
    if fill == "lowest":  # a float mask added like BERT's: zeros, and the lowest number where keys are masked
        assert [n.target for n in (attn_mask, attn_mask.args[0])] == [aten.masked_fill.Scalar, aten.zeros_like.default]
        assert attn_mask.args[1].target == negation and attn_mask.args[2] == torch.finfo(torch.float32).min
    elif where == "eq0":
        assert attn_mask.target == aten.logical_not.default and attn_mask.args[0].target == aten.eq.Scalar
    else:  # ~mask filled with -inf: the negation is dropped and the user's mask goes in as it is
        assert attn_mask.op == "placeholder" and attn_mask.target == "mask" and targets(mg)[negation] == 0
    assert "softmax" not in ops(mg) and targets(mg)[aten.masked_fill.Scalar] == (fill == "lowest")
    mg.model.graph.lint()
    torch.testing.assert_close(mg.model(x=x, mask=mask), reference, rtol=1e-5, atol=1e-5)


def test_masked_fill_with_the_lowest_number_keeps_fully_masked_rows():
    """A row whose keys are all masked averages every value (softmax of equal scores), fused or not."""
    mg = capture_bool(MaskedFillAttention("not", "lowest"), dtype=torch.float64)
    x, mask = torch.randn(3, 6, 32, dtype=torch.float64), bool_mask(full_row=True)
    reference = mg.model(x=x, mask=mask)
    mg, info = passes.fuse_sdpa(mg)
    assert len(info["fused"]) == 1
    torch.testing.assert_close(mg.model(x=x, mask=mask), reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fill", [-1e9, 0.0, -10000.0])
def test_other_masked_fill_values_are_left_alone(fill):
    mg = capture_bool(MaskedFillAttention("not", fill))
    x, mask = torch.randn(3, 6, 32), bool_mask(full_row=True)
    reference = mg.model(x=x, mask=mask)
    before = ops(mg)
    mg, info = passes.fuse_sdpa(mg)
    assert info == {"fused": []} and ops(mg) == before and "masked_fill" in before
    assert torch.equal(mg.model(x=x, mask=mask), reference)
