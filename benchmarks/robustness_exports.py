"""The ``exports`` part of the reliability probe (benchmarks/robustness.py): ``mase-lite export`` and a pipeline's
export step aimed at every kind of destination, for each format.

Destinations: new paths, folders and files of the user's (empty or not), links to files and folders and dangling
ones, a FIFO, a socket and a character device (a private one made with ``mknod`` in the case's directory, never the
machine's), the source checkpoint, the folders holding it and places inside it, a previous export of the same format
(with and without ``--overwrite``) and of another, names with a NUL byte or too long, a path through a file, ``.``,
``..`` and ``/``, a read-only file system, a full one (a small tmpfs) and a file-size limit. Each case runs the CLI in a
forked process in its own directory and checks the outcome: exit 0 and the export written where it is right, else
exit 2 with one line; in both, nothing else in the directory written, changed or removed.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

FORMATS = ["compressed-tensors", "gguf", "onnx", "pt2"]
MODEL = {"task": "causal-lm", "hf_config": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                                            "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
                                            "max_position_embeddings": 32}}
DATA = {"block_size": 16, "n_train": 8, "n_test": 8}
W8 = {"weight": {"name": "mxint", "element_width": 8}}
Verify = Callable[[int | None], str | None]


def _main(argv: list[str], limit_bytes: int | None = None) -> Callable[[], int]:
    def call() -> int:
        from mase_lite.cli import main

        if limit_bytes is not None:  # a file-size limit: writes past it fail with EFBIG instead of a signal
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        return main(argv)

    return call


def _world(directory: Path) -> dict[str, tuple]:
    """What stands in ``directory``: each entry's kind and content (bytes, a link's target), never reading a FIFO."""
    seen = {}
    for path in sorted(directory.rglob("*")):
        mode = path.lstat().st_mode
        name = path.relative_to(directory).as_posix()
        if stat.S_ISLNK(mode):
            seen[name] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode):
            seen[name] = ("file", path.read_bytes())
        else:
            seen[name] = (stat.S_IFMT(mode),)
    return seen


def _mount(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    if done:
        atexit.register(subprocess.run, ["umount", "-l", str(path)], capture_output=True)
    return done


def _checkpoint(work: Path) -> Path:
    import mase_lite as ml

    ml.run_pipeline({"model": MODEL, "data": DATA, "output_dir": str(work / "source"),
                     "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": W8}}},
                               {"pass": "save", "params": {"path": "ckpt"}}]})
    return work / "source" / "ckpt"


def _exporter(fmt: str):
    from mase_lite.deploy import target_module

    return target_module(fmt)


def export_cases(seed: int, work: Path, canary: Path) -> list[tuple[str, str, Path, Callable[[], int], Verify]]:
    """Every destination kind for every format, and the export step's paths (``seed``: unused, the cases are fixed)."""
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = _checkpoint(work)
    root = os.geteuid() == 0
    cases = []

    def case(fmt: str, what: str, make: Callable[[Path], str | None], expect: int, *flags: str,
             limit_bytes: int | None = None) -> None:
        directory = Path(tempfile.mkdtemp(prefix="export-", dir=work))  # where the CLI runs
        world = directory / "world"  # the user's files, compared before and after
        world.mkdir()
        output = make(world)
        if output is None:  # this machine cannot make the destination (not root)
            return
        before = _world(world)
        target = Path(output) if os.path.isabs(output) or "\0" in output else directory / output

        def verify(code: int | None) -> str | None:
            if code != expect:
                return f"exit {code}, expected {expect}"
            after = _world(world)
            if expect == 0:
                if not _exporter(fmt).is_export(target):
                    return f"exit 0 but {target} is not a {fmt} export"
                written = {k for k in after if (world / k) == target or target in (world / k).parents
                           or (world / k) in target.parents}  # the export, and the folders made for it
                after = {k: v for k, v in after.items() if k not in written}
                before_rest = {k: v for k, v in before.items() if k not in written}
                return None if after == before_rest else "files beside the export changed"
            return None if after == before else "a refused export changed the directory"

        argv = ["export", str(checkpoint), "--format", fmt, "-o", output, *flags]
        cases.append((f"export {fmt}", what, directory, _main(argv, limit_bytes), verify))

    def previous(fmt: str) -> Callable[[Path], str]:
        def make(world: Path) -> str:
            import contextlib
            import io

            from mase_lite.cli import main

            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["-q", "export", str(checkpoint), "--format", fmt, "-o", str(world / "out")]) == 0
            return str(world / "out")
        return make

    for fmt in FORMATS:
        other = "pt2" if fmt != "pt2" else "gguf"
        case(fmt, "a new path", lambda w: str(w / "model.out"), 0)
        case(fmt, "a new path in new folders", lambda w: str(w / "a" / "b" / "model.out"), 0)
        case(fmt, "a folder of the user's", lambda w: _folder(w / "mine", {"notes.txt": b"x", "sub/data.bin": b"\0"}), 2)
        case(fmt, "an empty folder", lambda w: _folder(w / "empty", {}), 2)
        case(fmt, "a file of the user's", lambda w: _file(w / "model.bin", b"GGUF not mine"), 2)
        case(fmt, "an empty file", lambda w: _file(w / "empty.bin", b""), 2)
        case(fmt, "a link to a file", lambda w: _link(w / "ln", _file(w / "target.txt", b"keep")), 2)
        case(fmt, "a link to a folder", lambda w: _link(w / "ln", _folder(w / "dir", {"a": b"1"})), 2)
        case(fmt, "a dangling link", lambda w: _link(w / "ln", str(w / "nowhere")), 2)
        case(fmt, "a FIFO", lambda w: _fifo(w / "fifo"), 2)
        case(fmt, "a socket", lambda w: _socket(w / "sock"), 2)
        case(fmt, "a private character device", lambda w: _device(w / "null") if root else None, 2)
        case(fmt, "the source checkpoint", lambda w: str(checkpoint), 2, "--overwrite")
        case(fmt, "the run holding the source", lambda w: str(checkpoint.parent), 2, "--overwrite")
        case(fmt, "the folder above the run", lambda w: str(checkpoint.parent.parent), 2, "--overwrite")
        case(fmt, "a place inside the source", lambda w: str(checkpoint / "model.out"), 2)
        case(fmt, "a previous export without --overwrite", previous(fmt), 2)
        case(fmt, "a previous export with --overwrite", previous(fmt), 0, "--overwrite")
        case(fmt, f"a previous {other} export with --overwrite", previous(other), 2, "--overwrite")
        case(fmt, "a name with a NUL byte", lambda w: str(w / "a\0b"), 2)
        case(fmt, "a 300-character name", lambda w: str(w / ("x" * 300)), 2)
        case(fmt, "a path through a file", lambda w: _file(w / "notes.txt", b"x") + "/model.out", 2)
        case(fmt, ". (the directory it runs in)", lambda w: ".", 2)
        case(fmt, "..", lambda w: "..", 2)
        case(fmt, "/", lambda w: "/", 2)
        case(fmt, "a read-only file system", lambda w: str(w / "ro" / "m.out") if root and _mount(w / "ro", "size=1m,ro") else None, 2)
        case(fmt, "a full file system", lambda w: str(w / "full" / "m.out") if root and _mount(w / "full", "size=12k") else None, 2)
        case(fmt, "a file-size limit of 4 kB", lambda w: str(w / "m.out"), 2, limit_bytes=4096)
    for path, what in (("..", "the folder above the run"), ("../x.out", "a place beside the run"), (".", "the run itself"),
                       ("report.json", "the run's report"), ("ckpt", "the save step's checkpoint"), ("/", "/"),
                       ("a\0b", "a NUL byte"), ("y" * 300, "a 300-character name"), ("sub/../..", "the run, by a detour")):
        cases.append(_step_case(work, path, what))
    return cases


def _step_case(work: Path, path: str, what: str) -> tuple[str, str, Path, Callable[[], int], Verify]:
    directory = Path(tempfile.mkdtemp(prefix="step-", dir=work))
    (directory / "x.out").write_text("beside the run")
    spec = {"model": MODEL, "data": DATA, "output_dir": str(directory / "run"),
            "steps": [{"pass": "quantize", "params": {"by": "type", "rules": {"head": None, "linear": W8}}},
                      {"pass": "save", "params": {"path": "ckpt"}},
                      {"pass": "export", "params": {"format": "pt2", "path": path}}]}
    (directory / "spec.json").write_text(json.dumps(spec))
    before = {k: v for k, v in _world(directory).items() if not k.startswith("run")}

    def verify(code: int | None) -> str | None:
        after = {k: v for k, v in _world(directory).items() if not k.startswith("run") and not k.startswith(".")}
        if code != 2:
            return f"exit {code}, expected 2"
        return None if after == before else "files beside the run changed"

    return "export step pt2", what, directory, _main(["run", str(directory / "spec.json")]), verify


def _folder(path: Path, files: dict[str, bytes]) -> str:
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return str(path)


def _file(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def _link(path: Path, target: str) -> str:
    path.symlink_to(target)
    return str(path)


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return str(path)


def _socket(path: Path) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    return str(path)


def _device(path: Path) -> str:
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a private node of /dev/null's numbers, in the case's directory
    return str(path)
