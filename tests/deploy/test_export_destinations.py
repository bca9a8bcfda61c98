"""An export never destroys what stands at its path: a user's folder or file, a link, a FIFO or a device, the source
checkpoint or a folder holding it, the run's own files. A previous export of the same format is replaced only with
--overwrite (a step's "overwrite": true). Every refusal is one line and exit 2, and leaves everything as it was;
a full file system leaves nothing behind. Devices are private ones made in a temporary directory."""

import json
import os
import stat

import pytest
import torch
import torch.nn as nn

import mase_lite as ml
from mase_lite import UserError
from mase_lite.cli import main
from mase_lite.deploy import export
from mase_lite.ir.module_model import ModuleModel

pytest.importorskip("compressed_tensors")

MODEL = {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                            "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
                                            "max_position_embeddings": 32}}
W8 = {"weight": {"name": "mxint", "element_width": 8}}
FILE_FORMATS = ["gguf", "pt2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved quantized tiny Llama every format can hold."""
    out = tmp_path_factory.mktemp("run") / "run"
    ml.run_pipeline({"model": MODEL, "data": {"block_size": 16, "n_train": 8, "n_test": 8},
                     "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": W8}}},
                               {"pass": "save", "params": {"path": "ckpt"}}],
                     "output_dir": str(out)})
    return out / "ckpt"


def _export(checkpoint, fmt, output, *flags):
    return main(["export", str(checkpoint), "--format", fmt, "-o", str(output), *flags])


def _tree(path):
    """What stands at ``path``: every file's bytes and every link's target, by relative name."""
    if path.is_symlink() or not path.is_dir():
        return os.readlink(path) if path.is_symlink() else path.read_bytes()
    return {str(p.relative_to(path)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in path.rglob("*")}


def _one_line(capsys, *expected):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.parametrize("fmt", ["compressed-tensors", *FILE_FORMATS])
def test_a_users_folder_is_not_replaced(checkpoint, tmp_path, capsys, fmt):
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "sub" / "data.bin").write_bytes(b"\x00\x01")
    before = _tree(folder)
    assert _export(checkpoint, fmt, folder) == 2
    _one_line(capsys, f"-o: {folder} exists and is not a {fmt} export of mase_lite, so it is not replaced")
    assert _tree(folder) == before


@pytest.mark.parametrize("fmt", ["compressed-tensors", *FILE_FORMATS])
def test_a_users_file_is_not_replaced(checkpoint, tmp_path, capsys, fmt):
    file = tmp_path / "model.bin"
    file.write_bytes(b"GGUF not mine")
    assert _export(checkpoint, fmt, file) == 2
    _one_line(capsys, f"{file} exists and is not a {fmt} export of mase_lite")
    assert file.read_bytes() == b"GGUF not mine"


@pytest.mark.parametrize("where", ["itself", "its folder", "the run", "inside it"])
def test_the_source_checkpoint_is_never_written_over(checkpoint, capsys, where):
    target = {"itself": checkpoint, "its folder": checkpoint.parent, "the run": checkpoint.parent.parent,
              "inside it": checkpoint / "model.gguf"}[where]
    run_dir = checkpoint.parent
    before = _tree(run_dir)
    assert _export(checkpoint, "gguf", target, "--overwrite") == 2
    verb = {"itself": "is", "inside it": "lies inside"}.get(where, "holds")
    _one_line(capsys, f"{verb} the model's source {checkpoint}")
    assert _tree(run_dir) == before
    assert main(["export", str(run_dir), "--format", "pt2", "-o", str(checkpoint)]) == 2  # a run names it too
    _one_line(capsys, "is the model's source")


def test_links_fifos_and_devices_are_refused(checkpoint, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "link.gguf").symlink_to(victim)
    os.mkfifo(tmp_path / "fifo.gguf")
    nodes = {"link.gguf": "a link", "fifo.gguf": "a FIFO"}
    try:
        os.mknod(tmp_path / "null.gguf", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private /dev/null
        nodes["null.gguf"] = "a character device"
    except PermissionError:
        pass  # not root: the FIFO and the link stand for the non-regular files
    for name, kind in nodes.items():
        assert _export(checkpoint, "gguf", tmp_path / name, "--overwrite") == 2
        _one_line(capsys, f"{tmp_path / name} is {kind}; an export writes only new files or its own previous export")
    assert victim.read_text() == "keep" and (tmp_path / "link.gguf").is_symlink()
    assert stat.S_ISFIFO((tmp_path / "fifo.gguf").lstat().st_mode)
    if "null.gguf" in nodes:
        assert stat.S_ISCHR((tmp_path / "null.gguf").lstat().st_mode)


@pytest.mark.parametrize("fmt", ["compressed-tensors", *FILE_FORMATS])
def test_a_previous_export_is_replaced_only_with_overwrite(checkpoint, tmp_path, capsys, fmt):
    out = tmp_path / "out"
    assert _export(checkpoint, fmt, out) == 0
    first = _tree(out)
    capsys.readouterr()
    assert _export(checkpoint, fmt, out) == 2
    _one_line(capsys, f"{out} holds a previous {fmt} export; replace it with --overwrite")
    assert _tree(out) == first
    assert _export(checkpoint, fmt, out, "--overwrite") == 0
    other = "pt2" if fmt != "pt2" else "gguf"
    capsys.readouterr()
    assert _export(checkpoint, other, out, "--overwrite") == 2  # another format's export is not its own
    _one_line(capsys, f"exists and is not a {other} export of mase_lite")


@pytest.mark.parametrize("name", ["a\0b.gguf", "x" * 300 + ".gguf", "notes.txt/model.gguf"])
def test_impossible_names_are_refused_in_one_line(checkpoint, tmp_path, capsys, name):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    assert _export(checkpoint, "gguf", f"{tmp_path}/{name}") == 2
    _one_line(capsys, "-o: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_full_file_system_leaves_nothing_behind(checkpoint, tmpfs, capsys):
    disk = tmpfs("small", size="12k")
    for fmt in ("pt2", "gguf", "compressed-tensors"):
        assert _export(checkpoint, fmt, disk / f"m.{fmt}") == 2
        _one_line(capsys, f"{disk / f'm.{fmt}'}", "No space left on device", f"free on {disk}")
        assert list(disk.iterdir()) == []


STEP = {"model": MODEL, "data": {"block_size": 16, "n_train": 8, "n_test": 8}}


def _step_run(tmp_path, path, **params):
    spec = {**STEP, "output_dir": str(tmp_path / "run"),
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": W8}}},
                      {"pass": "save", "params": {"path": "ckpt"}},
                      {"pass": "export", "params": {"format": "pt2", "path": path, **params}}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return main(["run", str(tmp_path / "spec.json")])


@pytest.mark.parametrize("path, message", [
    (".", "is the run's output_dir itself"), ("sub/..", "is the run's output_dir itself"),
    ("..", "lies outside the run's output_dir; a relative path names a place inside the run"),
    ("../x.pt2", "lies outside the run's output_dir"), ("report.json", "is the run's own report.json"),
    ("ckpt", "exists and is not a pt2 export of mase_lite"), ("/", "exists and is not a pt2 export"),
    ("a\0b", "holds a NUL byte"), ("y" * 300, "is too long")])
def test_the_export_step_refuses_paths_it_must_not_write(tmp_path, capsys, path, message):
    (tmp_path / "x.pt2").write_text("beside the run")
    assert _step_run(tmp_path, path) == 2
    err = _one_line(capsys, message)
    assert "steps.2" in err
    assert (tmp_path / "x.pt2").read_text() == "beside the run"
    if path in ("ckpt", "report.json"):
        report = json.loads((tmp_path / "run" / "report.json").read_text())
        assert report["status"] == "failed" and (tmp_path / "run" / "ckpt" / "recipe.json").is_file()


def test_an_absolute_step_path_replaces_its_own_previous_export_with_overwrite(tmp_path, capsys):
    target = tmp_path / "shared" / "m.pt2"
    assert _step_run(tmp_path, str(target)) == 0
    first = target.read_bytes()
    capsys.readouterr()
    assert _step_run(tmp_path, str(target)) == 2
    _one_line(capsys, "holds a previous pt2 export; replace it with --overwrite (a step's \"overwrite\": true)")
    assert target.read_bytes() == first
    assert _step_run(tmp_path, str(target), overwrite=True) == 0


def test_the_api_refuses_the_same_way(tmp_path):
    model, _ = ml.passes.quantize(nn.Sequential(nn.Linear(8, 4)), {"by": "type", "rules": {"linear": W8}})
    mm = ModuleModel(model, example_inputs={"input": torch.randn(2, 8)})
    (tmp_path / "keep.pt2").write_text("mine")
    with pytest.raises(UserError, match=r"^path: .*keep.pt2 exists and is not a pt2 export of mase_lite"):
        export(mm, "pt2", tmp_path / "keep.pt2")
    export(mm, "pt2", tmp_path / "new.pt2")
    export(mm, "pt2", tmp_path / "new.pt2", overwrite=True)
    assert (tmp_path / "keep.pt2").read_text() == "mine"
