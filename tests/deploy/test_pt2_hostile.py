"""A ``.pt2`` someone else made is data: ``pt2.load`` refuses, naming the member, every archive that would make
torch's loader run code (a pickle, a sympy expression, an operator outside torch.ops, guard code, an AOTInductor
library) or that is damaged; each attack is first shown to run code through ``torch.export.load`` itself."""

import io
import json
import os
import pickle
import re
import zipfile

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export
from mase_lite.deploy import pt2
from mase_lite.ir.module_model import ModuleModel
from mase_lite.infra.trust import trusting

X = torch.randn(3, 16)


class Shell:
    """Unpickled, it runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A valid program of a quantized two-layer model: (path, its members, the outputs it computes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    model, _ = ml.passes.quantize(model, {"by": "type", "rules": {"linear": {"weight": {"name": "mxint"}}}})
    path = tmp_path_factory.mktemp("pt2") / "m.pt2"
    export(ModuleModel(model, example_inputs={"input": X}), "pt2", path)
    with torch.no_grad():
        expected = model(X)
    with zipfile.ZipFile(path) as z:
        members = {info.filename: z.read(info) for info in z.infolist()}
    return path, members, expected


def _write(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _crafted(archive, tmp_path, change):
    members = dict(archive[1])
    change(members)
    return _write(tmp_path / "crafted.pt2", members)


def _program(members, change):
    model = json.loads(members["archive/models/model.json"])
    change(model)
    members["archive/models/model.json"] = json.dumps(model).encode()


def _runs_in_torch_not_here(path, canary, refusal):
    """The archive at ``path`` runs its command through ``torch.export.load`` (the attack is real), and ``pt2.load``
    refuses it with ``refusal`` before anything runs."""
    with pytest.raises(Exception):
        torch.export.load(str(path))  # torch runs the payload, then fails on what it made
    assert canary.exists()
    canary.unlink()
    with pytest.raises(UserError, match=refusal):
        pt2.load(path)
    assert not canary.exists()


def _touch(canary):
    return f"touch {canary}"


def test_a_valid_program_loads_and_computes_the_same_outputs(archive):
    model = pt2.load(archive[0])
    assert torch.equal(model(X), archive[2])


def test_pickled_sample_inputs_run_nothing(archive, tmp_path):
    canary = tmp_path / "ran"
    path = _crafted(archive, tmp_path, lambda m: m.update({"archive/data/sample_inputs/model.pt": _torch_save(Shell(_touch(canary)))}))
    _runs_in_torch_not_here(path, canary, r"crafted.pt2: archive/data/sample_inputs/model.pt: not plain tensors .*it is not unpickled")


def test_a_pickled_constant_runs_nothing(archive, tmp_path):
    canary = tmp_path / "ran"

    def change(members):
        key = "archive/data/weights/model_weights_config.json"
        config = json.loads(members[key])
        name, payload = next(iter(config["config"].items()))
        payload["use_pickle"] = True
        members[key] = json.dumps(config).encode()
        members[f"archive/data/weights/{payload['path_name']}"] = _torch_save(Shell(_touch(canary)))

    path = _crafted(archive, tmp_path, change)
    with pytest.raises(UserError, match=r"model_weights_config.json: config\.\S+ is a pickled object, which is not loaded"):
        pt2.load(path)
    assert not canary.exists()


def test_an_opaque_object_constant_is_refused(archive, tmp_path):
    def change(members):
        key = "archive/data/constants/model_constants_config.json"
        members[key] = json.dumps({"config": {"c": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": False,
                                                    "tensor_meta": None}}}).encode()
        members["archive/data/constants/opaque_obj_0"] = pickle.dumps(Shell("true"))

    with pytest.raises(UserError, match=r"member 'archive/data/constants/opaque_obj_0' is not part of a torch.export program"):
        pt2.load(_crafted(archive, tmp_path, change))


def test_a_symbolic_expression_is_not_evaluated(archive, tmp_path):
    canary = tmp_path / "ran"
    code = f"__import__('os').system('{_touch(canary)}')"

    def change(members):
        _program(members, lambda model: _replace_expressions(model, code))

    path = _crafted(archive, tmp_path, change)
    _runs_in_torch_not_here(path, canary, r"models/model.json: graph_module\.\S+\.expr_str: .* calls something other than a "
                            r"symbolic-shape function")


def test_an_operator_outside_torch_ops_is_not_called(archive, tmp_path):
    canary = tmp_path / "ran"

    def change(model):
        node = model["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.os.system"

    path = _crafted(archive, tmp_path, lambda m: _program(m, change))
    with pytest.raises(UserError, match=r"graph_module.graph.nodes.0.target = 'torch.os.system' is not an operator of aten"):
        pt2.load(path)
    assert not canary.exists()


@pytest.mark.parametrize("guard", ["__import__('os').system('{touch}') == 0",
                                   "L['x'].size()[0] == __import__('os').system('{touch}')",
                                   "L['x'].size()[0].__class__.__init__ == 0", "L[x].size()[0] == 1"])
def test_guard_code_is_not_run(archive, tmp_path, guard):
    """torch.export writes guards relating the inputs' sizes (``L['x'].size()[0] == L['y'].size()[0]``), which load;
    anything more is refused."""
    canary = tmp_path / "ran"
    path = _crafted(archive, tmp_path, lambda m: _program(m, lambda model: model.update(
        {"guards_code": ["L['input'].size()[0] >= 2", guard.format(touch=_touch(canary))]})))
    with pytest.raises(UserError, match=r"guards_code.1 = .* holds Python code other than a relation of the inputs' "
                                        r"sizes, which is not run"):
        pt2.load(path)
    assert not canary.exists()


def test_guards_relating_the_inputs_sizes_load(archive, tmp_path):
    guards = ["L['input'].size()[0] >= 2", "((64*L['input'].size()[0]) % (16*L['input'].size()[1])) == 0"]
    path = _crafted(archive, tmp_path, lambda m: _program(m, lambda model: model.update({"guards_code": guards})))
    assert torch.equal(pt2.load(path)(X), archive[2])


@pytest.mark.parametrize("member", ["archive/data/aotinductor/model/model.so", "archive/serialized_exported_program.json",
                                    "archive/data/weights/../../x", "other/archive_format"])
def test_members_a_program_does_not_have_are_refused(archive, tmp_path, member):
    path = _crafted(archive, tmp_path, lambda m: m.update({member: b"\x7fELF"}))
    with pytest.raises(UserError, match=rf"member {re.escape(repr(member))} is not part of a torch.export program"):
        pt2.load(path)


def test_a_compressed_member_is_refused(archive, tmp_path):
    path = tmp_path / "deflated.pt2"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in archive[1].items():
            z.writestr(name, data)
    with pytest.raises(UserError, match=r"is compressed or repeated"):
        pt2.load(path)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "not json", "deep json", "wrong version"])
def test_damaged_archives_are_refused_in_one_line(archive, tmp_path, damage):
    data = archive[0].read_bytes()
    path = tmp_path / "damaged.pt2"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        raw = bytearray(data)
        for i in range(200, len(raw), 97):
            raw[i] ^= 0x5A
        path.write_bytes(bytes(raw))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        members = dict(archive[1])
        members["archive/models/model.json"] = {"not json": b"{", "deep json": b"[" * 100_000 + b"]" * 100_000,
                                                "wrong version": members["archive/models/model.json"]}[damage]
        if damage == "wrong version":
            members["archive/archive_version"] = b"99"
        _write(path, members)
    with pytest.raises(UserError) as caught:
        pt2.load(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "m.pt2"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"m.pt2: not a regular file; a torch.export program is one"):
        pt2.load(fifo)


def test_trusting_the_code_loads_as_torch_does(archive):
    with trusting():
        assert torch.equal(pt2.load(archive[0])(X), archive[2])
    assert torch.equal(pt2.load(archive[0], trust_code=True)(X), archive[2])


def _torch_save(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _replace_expressions(node, code):
    if isinstance(node, dict):
        for key in node:
            if key == "expr_str":
                node[key] = code
            else:
                _replace_expressions(node[key], code)
    elif isinstance(node, list):
        for child in node:
            _replace_expressions(child, code)
