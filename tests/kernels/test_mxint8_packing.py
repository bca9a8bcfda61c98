"""pack_linears: one layer at a time, float weights released, resident memory returned (measured in a
fresh process); outputs those of the packed layers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mase_lite.kernels.mxint8 import MXInt8Linear, pack_linears
from tests.conftest import PATIENCE

RSS_SCRIPT = """
import json, os, torch
from mase_lite.kernels.mxint8 import pack_linears

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

torch.manual_seed(0)
torch.set_num_threads(1)
import mase_lite as ml  # before the first measure: its imports are not the model's memory
base = rss()
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 512) if i % 2 else torch.nn.Linear(512, 1024) for i in range(24)])
floats = sum(p.numel() * 4 for p in model.parameters())
with_float = rss()
if {by_pass}:
    model, _ = ml.passes.quantize(model, {{"default": {{"name": "mxint", "element_width": 8, "storage": "packed"}}}})
else:
    pack_linears(model)
packed = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
print(json.dumps(dict(base=base, with_float=with_float, after=rss(), peak=peak(), floats=floats, packed=packed)))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="resident memory is read from /proc (Linux)")
def test_packing_returns_the_float_weights_memory():
    run = subprocess.run([sys.executable, "-c", RSS_SCRIPT.format(by_pass=False)], capture_output=True, text=True,
                         timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(run.stdout.strip().splitlines()[-1])
    assert m["floats"] == 24 * 1024 * 512 * 4 + (12 * 1024 + 12 * 512) * 4 and m["packed"] < 0.27 * m["floats"]
    grown = m["with_float"] - m["base"]
    assert grown >= 0.9 * m["floats"]  # the float weights were resident (pages written by their init)
    # after packing: the packed bytes plus a margin of a quarter of the float weights (allocator slack)
    assert m["after"] - m["base"] <= m["packed"] + 0.25 * m["floats"], m
    # one layer at a time: the float model and packed layers never coexist in full
    assert m["peak"] - m["base"] <= m["floats"] + 0.6 * m["packed"], m


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="resident memory is read from /proc (Linux)")
def test_the_quantize_pass_with_packed_storage_returns_the_float_weights_memory():
    """The pass hands the freed float weights back once every packed layer is in; it decides every
    replacement first and keeps the float layers until all are in (it puts them back if one fails), so its
    peak is the float model plus the packed one."""
    run = subprocess.run([sys.executable, "-c", RSS_SCRIPT.format(by_pass=True)], capture_output=True, text=True,
                         timeout=PATIENCE)
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(run.stdout.strip().splitlines()[-1])
    assert m["packed"] < 0.27 * m["floats"] and m["with_float"] - m["base"] >= 0.9 * m["floats"]
    assert m["after"] - m["base"] <= m["packed"] + 0.25 * m["floats"], m


def test_packed_layers_compute_what_the_packed_linear_does():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))
    expected = [MXInt8Linear.from_linear(model[0], 16, "ceil"), MXInt8Linear.from_linear(model[2], 16, "ceil")]
    first = model[0]
    assert pack_linears(model, block_size=16, scale_rule="ceil") == 2
    assert isinstance(model[0], MXInt8Linear) and model[0].block_size == 16 and model[2].scale_rule == "ceil"
    assert torch.equal(model[0].codes, expected[0].codes) and torch.equal(model[2].scales, expected[1].scales)
    assert first.weight.grad is None and model[0] is not first
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(model(x), expected[1](torch.nn.functional.gelu(expected[0](x))))


def test_skip_keeps_layers_by_name_prefix():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)))
    assert pack_linears(model, skip=("1.1",)) == 2
    assert [type(m).__name__ for m in (model[0], model[1][0], model[1][1])] == ["MXInt8Linear", "MXInt8Linear", "Linear"]
