"""Property: every mutation that makes a search spec wrong (an unknown key anywhere, a value of the wrong JSON
type, a negative, astronomically large or non-finite number) exits 2 with a message and no traceback, before
any trial: its output directory is never created. The base pipeline is the tiny one the search tests use;
mutations of pipeline specs are the pipeline fuzz's (test_spec_fuzz.py)."""

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mase_lite.cli import main
from tests.search.conftest import TINY_PIPELINE, WIDTH

BASE = {
    "pipeline": TINY_PIPELINE,
    "space": [
        {"path": WIDTH, "type": "choice", "values": [4, 8]},
        {"path": "steps.quantize.params.rules.linear.data_in_width", "type": "int", "low": 4, "high": 8, "step": 4,
         "also": [{"path": "steps.quantize.params.rules.linear.data_in_frac_width", "scale": 0.5}]},
    ],
    "objectives": [{"metric": "ptq.loss", "direction": "minimize"}],
    "constraints": [{"metric": "avg_bits.weights", "max": 8.0}],
    "sampler": {"name": "tpe", "seed": 0, "n_startup_trials": 1},
    "n_trials": 2,
    "timeout": 60.0,
    "plots": [{"x": WIDTH, "y": ["ptq.loss"], "file": "p.png", "log_x": False}],
    "heartbeat_interval": 1,
    "grace_period": 2,
    "storage_retry": 5.0,
    "cache": True,
    "output_dir": "PLACEHOLDER",
}
HUGE = "<an integer of 5001 digits>"  # written into the JSON text as such (json.dumps refuses it)
OPAQUE = {("pipeline",), ("output_dir",)}  # the pipeline is the pipeline fuzz's; values would run trials


def _walk(node, path=()):
    yield path, node
    if path in OPAQUE or (len(path) == 3 and path[0] == "space" and path[2] == "values"):
        return
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _walk(child, (*path, key))


NODES = list(_walk(BASE))
DICTS = [p for p, n in NODES if isinstance(n, dict) and p not in OPAQUE]
LEAVES = [(p, n) for p, n in NODES if not isinstance(n, (dict, list)) and p not in OPAQUE]
WRONG = {  # values no field of that kind accepts
    str: [5, 2.5, True, [], {}, None],
    bool: [0, "true", [], {}, None],
    int: [-1, 2**70, HUGE, "8", 2.5, True, [], {}],
    float: ["4", True, [], {}, math.nan, -math.inf],
}


def _mutate(path, change):
    spec = json.loads(json.dumps(BASE))
    target = spec
    for key in path[:-1] if change[0] == "set" else path:
        target = target[key]
    if change[0] == "set":
        target[path[-1]] = change[1]
    else:
        target["zz_unknown"] = 1
    return spec


mutations = st.one_of(
    st.sampled_from(DICTS).map(lambda p: (p, ("add",))),
    st.sampled_from(LEAVES).flatmap(lambda leaf: st.sampled_from(WRONG[type(leaf[1])]).map(lambda v: (leaf[0], ("set", v)))),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_every_mutation_exits_2_before_any_trial(mutation):
    path, change = mutation
    spec = _mutate(path, change)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "search"
        spec["output_dir"] = str(out)
        (Path(tmp) / "spec.json").write_text(json.dumps(spec).replace(json.dumps(HUGE), "1" + "0" * 5000))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["search", str(Path(tmp) / "spec.json")])
        exists = out.exists()
    message = err.getvalue()
    assert code == 2, f"{path} {change}: exit {code}"
    assert message.startswith("mase-lite: error: ") and "Traceback" not in message, message
    assert not exists, f"{path} {change}: {out} was created"


def test_the_unmutated_spec_passes_the_checks():
    from mase_lite.search.engine import prepare_studies
    from mase_lite.search.spec import load_search_spec

    assert len(prepare_studies(load_search_spec({**BASE, "output_dir": "unused"}))) == 1
