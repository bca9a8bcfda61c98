"""Property: every mutation that makes a spec wrong (an unknown key anywhere, a value of the wrong JSON
type, a negative or astronomically large number) exits 2 with a message and no traceback."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mase_lite.cli import main

BASE = {
    "name": "fuzz",
    "seed": 0,
    "data": {"n_train": 16, "n_test": 8, "max_length": 8},
    "model": {"hf_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32},
              "num_labels": 2},
    "steps": [{"pass": "count", "params": {"dims": {"batch": 2, "seq": 8}}},
              {"pass": "lora", "params": {"rank": 2, "alpha": 4.0}}],
    "output_dir": "PLACEHOLDER",
}


def _walk(node, path=()):
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _walk(child, (*path, key))


DICTS = [p for p, n in _walk(BASE) if isinstance(n, dict)]
LEAVES = [(p, n) for p, n in _walk(BASE) if not isinstance(n, (dict, list)) and p != ("output_dir",)]
WRONG = {  # values no field of that kind accepts
    str: [5, 2.5, True, [], {}],
    int: [-1, 2**70, "8", 2.5, True, [], {}],
    float: ["4", True, [], {}],
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


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_every_mutation_exits_2_without_a_traceback(mutation):
    path, change = mutation
    spec = _mutate(path, change)
    with tempfile.TemporaryDirectory() as tmp:
        spec["output_dir"] = str(Path(tmp) / "out")
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["run", str(Path(tmp) / "spec.json")])
    message = err.getvalue()
    assert code == 2, f"{path} {change}: exit {code}"
    assert message.startswith("mase-lite: error: ") and "Traceback" not in message, message


def test_the_unmutated_spec_runs(tmp_path):
    spec = {**BASE, "output_dir": str(tmp_path / "out")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["run", str(tmp_path / "spec.json")]) == 0
