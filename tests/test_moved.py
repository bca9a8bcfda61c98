"""The modules' names before the layout of 2026-11 keep working: each old name is the moved module itself, warns once
(a FutureWarning naming the new path), and the public names that did not move import without a warning."""

import json
import subprocess
import sys

from mase_lite.infra.moved import MOVED
from tests.conftest import PATIENCE

EVERY_OLD_NAME = """
import importlib, json, pickle, sys, warnings
import mase_lite
from mase_lite.infra.moved import MOVED
found = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        importlib.import_module(old)
    found[old] = {"same": module is importlib.import_module(new), "spec": module.__spec__.name,
                  "first": [f"{w.category.__name__}: {w.message}" for w in first], "again": len(again)}
# a pickle written before the move names the old module
found["pickle"] = pickle.loads(b"cmase_lite.nn.quantized\\nQuantizedLinear\\n.") is sys.modules["mase_lite.layers.quantized"].QuantizedLinear
print(json.dumps(found))
"""

UNMOVED = """
import warnings
warnings.simplefilter("error")
import mase_lite as ml
from mase_lite import MaseGraph, UserError
import mase_lite.deploy.pt2
from mase_lite.kernels.mxint8 import pack_linears as mxint8_packing
from mase_lite.kernels.packed4 import pack_linears as packed4_packing
print(callable(ml.passes.quantize), MaseGraph.__name__, UserError.__module__)
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_old_name_is_its_moved_module_and_warns_once():
    found = json.loads(_run(EVERY_OLD_NAME))
    assert found.pop("pickle") is True
    assert set(found) == set(MOVED)
    for old, seen in found.items():
        assert seen == {"same": True, "spec": MOVED[old], "again": 0,
                        "first": [f"FutureWarning: {old} moved to {MOVED[old]}; import it from there"]}, old


def test_the_old_packages_resolve_their_modules():
    assert MOVED["mase_lite.train.generation"] == "mase_lite.runtime.generation"
    assert MOVED["mase_lite.train.tasks"] == "mase_lite.workloads.tasks"
    assert MOVED["mase_lite.nn.gptq"] == "mase_lite.algorithms.gptq"
    out = _run("import warnings; warnings.simplefilter('ignore')\n"
               "from mase_lite.train import prepare, fit\nimport mase_lite.nn as nn\nimport mase_lite.nn.lora as lora\n"
               "from mase_lite.workloads import prepare as new\nprint(prepare is new, nn.__path__, lora.__name__)")
    assert out.split() == ["True", "[]", "mase_lite.layers.lora"]


def test_the_public_names_that_stay_import_without_a_warning():
    assert _run(UNMOVED).split() == ["True", "MaseGraph", "mase_lite.infra.errors"]
