"""The pt2 cases of the ``imports`` part of the reliability probe (benchmarks/robustness.py): ``.pt2`` archives someone
else made, loaded with ``mase_lite.deploy.pt2.load`` and called on an input, as a user of the export would.

A valid program of a small quantized model is rewritten: code smuggled where torch's loader runs it (pickled sample
inputs, weights and constants, custom and opaque objects, sympy expressions, node targets, guard code, AOTInductor
libraries, legacy members), each payload creating the probe's canary file; members added, renamed, repeated,
compressed or dropped; the program's JSON with values of the wrong types; and the archive's bytes damaged. Each case
must load and compute (exit 0) or be refused in one line (exit 2); the canary must never appear, and the valid
archive must compute the model's own outputs.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

from robustness_data import BYTE_DAMAGE, WEIRD

Verify = Callable[[int | None], str | None]
PROGRAM = "archive/models/model.json"
SAMPLES = "archive/data/sample_inputs/model.pt"
WEIGHTS = "archive/data/weights/model_weights_config.json"


class Shell:
    """Unpickled, it runs a shell command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _loader(path: Path, inputs: Any) -> Callable[[], int]:
    def call() -> int:
        import torch

        from mase_lite.deploy import pt2
        from mase_lite.infra.errors import UserError, describe

        try:
            model = pt2.load(path)
            with torch.no_grad():
                out = model(inputs)
            torch.save(out, path.with_suffix(".out"))
            return 0
        except UserError as err:
            print(f"mase-lite: error: {describe(err)}", file=sys.stderr)
            return 2

    return call


def _valid(work: Path) -> tuple[dict[str, bytes], Any, Any]:
    """The members of a valid program, its input and its outputs."""
    import torch
    import torch.nn as nn

    import mase_lite as ml
    from mase_lite.deploy import export
    from mase_lite.ir.module_model import ModuleModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"linear": {"weight": {"name": "mxint"}}}})
    x = torch.randn(3, 16)
    export(ModuleModel(model, example_inputs={"input": x}), "pt2", work / "valid.pt2")
    with zipfile.ZipFile(work / "valid.pt2") as z:
        members = {info.filename: z.read(info) for info in z.infolist()}
    with torch.no_grad():
        return members, x, model(x)


def _saved(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _program(change: Callable[[dict], Any]) -> Callable[[dict[str, bytes]], None]:
    def apply(members: dict[str, bytes]) -> None:
        program = json.loads(members[PROGRAM])
        change(program)
        members[PROGRAM] = json.dumps(program).encode()
    return apply


def _each_expression(node: Any, text: str) -> None:
    if isinstance(node, dict):
        for key in node:
            if key == "expr_str":
                node[key] = text
            else:
                _each_expression(node[key], text)
    elif isinstance(node, list):
        for child in node:
            _each_expression(child, text)


def _pickled_weight(payload: bytes) -> Callable[[dict[str, bytes]], None]:
    def apply(members: dict[str, bytes]) -> None:
        config = json.loads(members[WEIGHTS])
        _, entry = next(iter(config["config"].items()))
        entry["use_pickle"] = True
        members[WEIGHTS] = json.dumps(config).encode()
        members[f"archive/data/weights/{entry['path_name']}"] = payload
    return apply


def _constant(path_name: str, payload: bytes) -> Callable[[dict[str, bytes]], None]:
    def apply(members: dict[str, bytes]) -> None:
        key = "archive/data/constants/model_constants_config.json"
        members[key] = json.dumps({"config": {"c": {"path_name": path_name, "is_param": False, "use_pickle": False,
                                                    "tensor_meta": None}}}).encode()
        members[f"archive/data/constants/{path_name}"] = payload
    return apply


def _attacks(canary: Path) -> list[tuple[str, Callable[[dict[str, bytes]], None]]]:
    touch = f"touch {canary}"
    code = [f"__import__('os').system('{touch}')", f"Symbol('s0').__class__.__init__.__globals__['os'].system('{touch}')",
            "exec(\"import os; os.system('" + touch + "')\")", f"(lambda: __import__('os').system('{touch}'))()",
            f"[c for c in ().__class__.__base__.__subclasses__()]", "s0.__class__", "Symbol('s0; import os')"]
    targets = ["torch.os.system", "torch.sys.exit", "builtins.eval", "_operator.call", "_operator.methodcaller",
               "torch._C._jit_pass_lint", "torch.ops.aten.nonexistent.default", "#ext.op", "torch.load", "os.system",
               "torch.ops.higher_order.cond", "math.exp"]
    attacks: list[tuple[str, Callable[[dict[str, bytes]], None]]] = [
        ("sample inputs: a pickle running a command", lambda m: m.update({SAMPLES: _saved(Shell(touch))})),
        ("sample inputs: a plain pickle running a command", lambda m: m.update({SAMPLES: pickle.dumps(Shell(touch))})),
        ("sample inputs: a list of commands", lambda m: m.update({SAMPLES: _saved(((Shell(touch),), {}))})),
        ("a weight: a pickle running a command", _pickled_weight(_saved(Shell(touch)))),
        ("a weight: a plain pickle", _pickled_weight(pickle.dumps(Shell(touch)))),
        ("a constant: an opaque object", _constant("opaque_obj_0", pickle.dumps(Shell(touch)))),
        ("a constant: a custom object", _constant("custom_obj_0", pickle.dumps(Shell(touch)))),
        ("a constant: a pickled tensor", _constant("tensor_0", _saved(Shell(touch)))),
        ("guard code", _program(lambda p: p.update({"guards_code": [f"__import__('os').system('{touch}') == 0"]}))),
        ("an AOTInductor library", lambda m: m.update({"archive/data/aotinductor/model/model.so": b"\x7fELF"})),
        ("legacy members", lambda m: m.update({"archive/serialized_exported_program.json": b"{}",
                                               "archive/serialized_state_dict.pt": _saved(Shell(touch))})),
        ("an executorch member", lambda m: m.update({"archive/data/executorch/model.pte": b"x"})),
        ("a range constraint named with code", _program(lambda p: p.update(
            {"range_constraints": {f"__import__('os').system('{touch}')": {"min_val": 2, "max_val": None}}}))),
    ]
    attacks += [(f"expressions: {text[:40]}", _program(lambda p, t=text: _each_expression(p, t))) for text in code]
    attacks += [(f"node target {name}", _program(lambda p, n=name: p["graph_module"]["graph"]["nodes"][0].update(
        {"target": n}))) for name in targets]
    return attacks


def _structural() -> list[tuple[str, Callable[[dict[str, bytes]], None]]]:
    def drop(name: str) -> Callable[[dict[str, bytes]], None]:
        return lambda m: m.pop(name, None)

    return [
        ("no program", drop(PROGRAM)), ("no sample inputs", drop(SAMPLES)), ("no weights config", drop(WEIGHTS)),
        ("no archive_format", drop("archive/archive_format")), ("no version", drop("archive/archive_version")),
        ("archive_format wrong", lambda m: m.update({"archive/archive_format": b"zip"})),
        ("version 99", lambda m: m.update({"archive/archive_version": b"99"})),
        ("a member outside the root", lambda m: m.update({"other/x": b"1"})),
        ("a traversal name", lambda m: m.update({"archive/data/weights/../../../etc/x": b"1"})),
        ("an absolute name", lambda m: m.update({"/etc/x": b"1"})),
        ("an extra text file", lambda m: m.update({"archive/extra/notes.txt": b"hello"})),
        ("a second program", lambda m: m.update({"archive/models/other.json": m[PROGRAM]})),
        ("sample inputs of numbers", lambda m: m.update({SAMPLES: _saved(((1, 2.0), {}))})),
        ("sample inputs of a string", lambda m: m.update({SAMPLES: _saved("x")})),
        ("a weight file dropped", lambda m: m.pop(next(k for k in m if "/weights/weight_" in k))),
        ("a weight file emptied", lambda m: m.update({next(k for k in m if "/weights/weight_" in k): b""})),
        ("a weight file 3 bytes", lambda m: m.update({next(k for k in m if "/weights/weight_" in k): b"abc"})),
        ("the program emptied", lambda m: m.update({PROGRAM: b""})),
        ("the program deeply nested", lambda m: m.update({PROGRAM: b"[" * 200_000 + b"]" * 200_000})),
        ("the program a huge integer", lambda m: m.update({PROGRAM: b"9" * 100_000})),
        ("the program not UTF-8", lambda m: m.update({PROGRAM: b"\xff\xfe{}"})),
    ]


def _json_mutations(program: dict, rng: random.Random, n: int) -> list[tuple[str, Callable[[dict[str, bytes]], None]]]:
    """``n`` seeded replacements of one value of the program's JSON by a value of another type or size."""
    paths: list[tuple] = []
    stack: list[tuple[Any, tuple]] = [(program, ())]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, (*at, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*at, i)) for i, v in enumerate(node))
        paths.append(at)
    found = []
    for _ in range(n):
        at = rng.choice(paths[1:])
        value = rng.choice([v for v in WEIRD if not (isinstance(v, int) and v > 2**64)] + ["torch.os.system", 2**63, [[[[]]]]])

        def apply(m: dict[str, bytes], at: tuple = at, value: Any = value) -> None:
            program = json.loads(m[PROGRAM])
            node = program
            for key in at[:-1]:
                node = node[key]
            node[at[-1]] = value
            m[PROGRAM] = json.dumps(program).encode()

        found.append((f"program {'.'.join(map(str, at))[:60]} = {json.dumps(value)[:30]}", apply))
    return found


def pt2_cases(seed: int, work: Path, canary: Path, per_damage: int = 5) -> list[tuple[str, str, Path, Callable[[], int], Verify]]:
    """Foreign ``.pt2`` archives (see the module's docstring): about 120 cases for ``per_damage=5``."""
    import torch

    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    members, x, expected = _valid(work)
    cases = []

    def add(source: str, what: str, data: bytes, valid: bool = False) -> None:
        directory = Path(tempfile.mkdtemp(prefix="pt2-", dir=work))
        path = directory / "model.pt2"
        path.write_bytes(data)

        def verify(code: int | None, path: Path = path) -> str | None:
            if code not in (0, 2):
                return f"exit {code}"
            if valid and (code != 0 or not torch.equal(torch.load(path.with_suffix(".out")), expected)):
                return "the valid archive did not compute the model's outputs"
            return None

        cases.append((source, what, directory, _loader(path, x), verify))

    def archive(change: Callable[[dict[str, bytes]], None], compression: int = zipfile.ZIP_STORED,
                repeated: tuple[str, ...] = ()) -> bytes:
        changed = dict(members)
        change(changed)
        buffer = io.BytesIO()
        with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", compression) as z:
            warnings.simplefilter("ignore")  # zipfile's note on a repeated name
            for name, data in [*changed.items(), *((name, b"{}") for name in repeated)]:
                z.writestr(name, data)
        return buffer.getvalue()

    valid = (work / "valid.pt2").read_bytes()
    add("pt2", "the valid archive", valid, valid=True)
    add("pt2", "the valid archive, rewritten by Python's zipfile", archive(lambda m: None), valid=True)
    for what, change in _attacks(canary):
        add("pt2 attack", what, archive(change))
    for what, change in _structural():
        add("pt2 structure", what, archive(change))
    add("pt2 structure", "members compressed", archive(lambda m: None, zipfile.ZIP_DEFLATED))
    add("pt2 structure", "the program repeated", archive(lambda m: None, repeated=(PROGRAM,)))
    for what, change in _json_mutations(json.loads(members[PROGRAM]), rng, 8 * per_damage):
        add("pt2 program", what, archive(change))
    for damage, fn in BYTE_DAMAGE.items():
        for _ in range(per_damage):
            add("pt2 bytes", damage, fn(valid, rng))
    return cases
