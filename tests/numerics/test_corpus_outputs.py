"""Every float-like quantizer against outputs recorded before its fast rewrite, bit for bit.

``data/quantizer_corpus.safetensors`` holds a corpus (zeros of both signs, float32 subnormals,
powers of two and their neighbours, ties at many mantissa positions, the float32/float16 limits,
±Inf, NaN, random bit patterns, rows at scales 2**-140 .. 2**120; ranks 0 to 4, odd lengths;
float32, float16 and bfloat16) and, in its metadata, 152 format configs with a SHA-256 digest per
config and input of: the quantized values, the values with ``ste="clipped"`` and that estimator's
gradient. The digests were written by the straightforward implementation of commit ca569ad (the
audit fixes included), before the quantizers were rewritten for speed. NaN payloads are not part
of the contract (every NaN is hashed as one bit pattern); every other bit is.

One rule changed since: an ``integer`` code 0 is +0.0 (a two's complement code has no sign of zero, so
fake quantization and stored codes agree bit for bit), where the recorded outputs kept the sign of the
rounded code (-0.0 for an input that rounds to zero from below, +0.0 for one clamped to a zero bound).
For integer formats each zero must now be +0.0, and it is given that sign back before hashing, so every
other bit is still checked against the recording.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mase_lite.numerics import chunks, quantize

CORPUS = Path(__file__).parent / "data" / "quantizer_corpus.safetensors"


def _load():
    with safe_open(CORPUS, "pt") as f:
        meta = f.metadata()
        inputs = {k: f.get_tensor(k) for k in f.keys()}
    return inputs, json.loads(meta["configs"]), json.loads(meta["digests"])


INPUTS, CONFIGS, DIGESTS = _load()


def recorded_zero_signs(fmt: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y`` as the recording had it: integer zeros (each +0.0 now) with the sign of the rounded code."""
    if fmt["name"] != "integer":
        return y
    zeros = y == 0
    assert not (zeros & y.signbit()).any(), "an integer code 0 is +0.0"
    scaled = x.float() * 2.0 ** fmt["frac_width"]
    code = scaled.floor() if fmt.get("floor") else scaled.round()
    return torch.where(zeros & (code == 0) & code.signbit(), -y, y)


def digest(fmt: dict, x: torch.Tensor) -> str:
    y = recorded_zero_signs(fmt, x, quantize(x, fmt))
    xg = x.clone().requires_grad_(True)
    yc = quantize(xg, fmt, ste="clipped")
    yc.backward(torch.ones_like(yc))
    yc = recorded_zero_signs(fmt, x, yc.detach())
    h = hashlib.sha256()
    for t in (y, yc, xg.grad):
        t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def test_corpus_covers_every_rewritten_format():
    names = {c["name"] for c in CONFIGS}
    assert names == {"integer", "minifloat_ieee", "minifloat_denorm", "log", "block_fp", "block_minifloat",
                     "block_log", "mxint", "mxfp"}
    assert {x.dtype for x in INPUTS.values()} == {torch.float32, torch.float16, torch.bfloat16}
    assert {x.dim() for x in INPUTS.values()} == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=[
    "-".join(str(v) for v in c.values()) for c in CONFIGS])
def test_outputs_match_the_recorded_ones(index):
    fmt, expected = CONFIGS[index], DIGESTS[index]
    changed = [name for name, x in INPUTS.items() if digest(fmt, x) != expected[name]]
    assert not changed, f"{fmt}: outputs changed on inputs {changed}"


@pytest.mark.parametrize("chunk_elements", [16, 100])
def test_outputs_do_not_depend_on_the_chunk_size(monkeypatch, chunk_elements):
    # the quantizers run over chunks of rows (elements); tiny chunks split every corpus input
    # into many, and the last one is partial
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", chunk_elements)
    changed = [(fmt, name) for fmt, expected in zip(CONFIGS, DIGESTS) for name, x in INPUTS.items()
               if digest(fmt, x) != expected[name]]
    assert not changed
