"""The ``data`` part of the reliability probe (benchmarks/robustness.py): local data files damaged or hostile.

Valid bases of every local source — a CSV, a JSON array, JSON Lines and a text corpus, an ``.npz`` of images, an
image folder (PNG, JPEG, GIF) and a ``pretrained`` directory (config and safetensors) — are each damaged at the
byte level (bytes flipped, truncated, emptied, garbage appended, zeros written) and structurally (rows, cells,
labels, arrays, image modes and sizes, config fields of the wrong types or absurd sizes, links and FIFOs). Each
case reads its source as a run does (``build_data``, ``build_model``) in a forked process and answers like the CLI:
exit 0, or exit 2 with one ``mase-lite: error:`` line; a traceback, a hang or the memory cap is a defect.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any, Callable

ROWS = [{"text": f"the {w} sat on the mat number {i}", "label": i % 2} for i, w in enumerate(
    ["cat", "dog", "bird", "cow", "fox", "owl", "ant", "bee", "elk", "yak", "emu", "ram"])]
CORPUS = "\n".join(f"the quick brown fox {i} jumps over the lazy dog {i % 7}" for i in range(40)) + "\n"
WEIRD = [None, True, -1, 2, 2**31, 2**62, 2**64, 10**5000, 1e300, 1.5, "", "x", "\ud800", "\x00", "a" * 200_000,
         [], {}, [1, 2], {"a": 1}, "NaN"]


def reader(spec: dict, task: str, model: dict | None = None) -> Callable[[], int]:
    """A case as the CLI runs it: the data (or model) read; exit 2 with one line for the user's mistake."""
    def call() -> int:
        from mase_lite.infra.errors import UserError, describe

        try:
            if model is not None:
                from mase_lite.workloads.models import build_model

                build_model(model, num_labels=2, seed=0)
            else:
                from mase_lite.workloads.data import build_data

                data = build_data(spec, task=task, seed=0)
                next(iter(data.loader("train", 4)))  # one batch made, as training would
            return 0
        except UserError as err:
            print(f"mase-lite: error: {describe(err)}", file=sys.stderr)
            return 2

    return call


def pretrained_run(path: Path, out: Path) -> Callable[[], int]:
    """``mase-lite run`` of a causal LM imported from ``path`` (data from its own tokenizer, one evaluation), in
    ``out``: how the imports part sends a case through the CLI."""
    spec = out / "spec.json"
    spec.write_text(json.dumps({"model": {"task": "causal-lm", "pretrained": str(path)},
                                "data": {"block_size": 8, "n_train": 8, "n_test": 8},
                                "steps": [{"pass": "evaluate", "params": {"progress": False}}],
                                "output_dir": str(out / "run")}))

    def call() -> int:
        from mase_lite.cli import main

        return main(["run", str(spec)])

    return call


# ---------------------------------------------------------------------------------------------- bytes

def _fresh(work: Path, prefix: str) -> Path:
    """A new directory for one case."""
    work.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=work))


def _flip(data: bytes, rng: random.Random, n: int) -> bytes:
    out = bytearray(data)
    for _ in range(min(n, len(out))):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


BYTE_DAMAGE: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "1 byte flipped": lambda d, r: _flip(d, r, 1),
    "8 bytes flipped": lambda d, r: _flip(d, r, 8),
    "64 bytes flipped": lambda d, r: _flip(d, r, 64),
    "truncated": lambda d, r: d[: r.randrange(max(len(d), 1))],
    "emptied": lambda d, r: b"",
    "garbage appended": lambda d, r: d + bytes(r.randrange(256) for _ in range(r.randrange(1, 512))),
    "zeros written": lambda d, r: (lambda at: d[:at] + bytes(64) + d[at + 64:])(r.randrange(max(len(d), 1))),
    "random bytes": lambda d, r: bytes(r.randrange(256) for _ in range(r.randrange(1, 4096))),
}


# ---------------------------------------------------------------------------------------------- text

def _csv(rows: list[dict]) -> bytes:
    lines = ["text,label"] + [f"{json.dumps(r.get('text'))},{r.get('label')}" if isinstance(r, dict) else str(r) for r in rows]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def _json(rows: list) -> bytes:
    return json.dumps(rows).encode("utf-8", "surrogatepass")


def _jsonl(rows: list) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode("utf-8", "surrogatepass")


TEXT_FORMATS = {"x.csv": ("csv", _csv), "x.json": ("json", _json), "x.jsonl": ("json", _jsonl)}


def _row_changes(rng: random.Random) -> list[tuple[str, Callable[[list], list]]]:
    changes = []
    for value in WEIRD:
        shown = "a 5001-digit int" if isinstance(value, int) and value > 10**100 else repr(value)[:24]
        changes.append((f"a label {shown}", lambda rows, v=value: [dict(rows[0], label=v), *rows[1:]]))
        changes.append((f"a text {shown}", lambda rows, v=value: [dict(rows[0], text=v), *rows[1:]]))
        changes.append((f"a row {shown}", lambda rows, v=value: [v, *rows[1:]]))
    changes += [
        ("no label column", lambda rows: [{"text": r["text"]} for r in rows]),
        ("no text column", lambda rows: [{"label": r["label"]} for r in rows]),
        ("an extra column", lambda rows: [dict(r, extra=1) for r in rows]),
        ("one row", lambda rows: rows[:1]),
        ("no rows", lambda rows: []),
        ("one label only", lambda rows: [dict(r, label=0) for r in rows]),
        ("labels 0 and 7", lambda rows: [dict(r, label=7 * (r["label"])) for r in rows]),
        ("20000 rows", lambda rows: rows * 1700),
    ]
    return changes


def text_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable[[], int]]]:
    cases = []
    for name, (dataset, write) in TEXT_FORMATS.items():
        base = write(ROWS)
        for damage, change in BYTE_DAMAGE.items():
            for k in range(per_damage):
                path = _fresh(work, "text") / name
                path.write_bytes(change(base, rng))
                cases.append((f"{dataset} {name}", damage, path.parent, reader({"dataset": dataset, "path": str(path)}, "sequence-classification")))
        for what, change in _row_changes(rng):
            path = _fresh(work, "text") / name
            try:
                path.write_bytes(write(change(copy.deepcopy(ROWS))))
            except (TypeError, ValueError, OverflowError, UnicodeEncodeError):  # a value this format cannot hold
                continue
            cases.append((f"{dataset} {name}", what, path.parent, reader({"dataset": dataset, "path": str(path)}, "sequence-classification")))
    json_nest = _fresh(work, "text") / "x.json"
    json_nest.write_text("[" * 100_000 + "]" * 100_000)
    cases.append(("json x.json", "nested 1e5 deep", json_nest.parent, reader({"dataset": "json", "path": str(json_nest)}, "sequence-classification")))
    for damage, change in BYTE_DAMAGE.items():
        for k in range(per_damage):
            path = _fresh(work, "text") / "x.txt"
            path.write_bytes(change(CORPUS.encode(), rng))
            cases.append(("txt corpus", damage, path.parent, reader({"dataset": "txt", "path": str(path), "block_size": 8}, "causal-lm")))
    for what, text in [("one word", "word\n"), ("whitespace only", " \n\t\n"), ("NUL bytes", "a\x00b\n" * 50),
                       ("a lone surrogate", "a \ud800 b\n" * 50), ("one 4 MB line", "word " * 800_000)]:
        path = _fresh(work, "text") / "x.txt"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        cases.append(("txt corpus", what, path.parent, reader({"dataset": "txt", "path": str(path), "block_size": 8}, "causal-lm")))
    split_dir = _fresh(work, "text")
    (split_dir / "train.csv").write_bytes(_csv(ROWS))
    os.mkfifo(split_dir / "test.csv")
    cases.append(("csv directory", "test.csv a FIFO", split_dir, reader({"dataset": "csv", "path": str(split_dir)}, "sequence-classification")))
    return cases


# ---------------------------------------------------------------------------------------------- images

def _npz(**arrays: Any) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npz_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable[[], int]]]:
    import numpy as np

    images = np.random.default_rng(0).random((12, 3, 8, 8)).astype(np.float32)
    labels = np.arange(12) % 2
    base = _npz(images=images, labels=labels)
    variants: list[tuple[str, bytes]] = [(d, change(base, rng)) for d, change in BYTE_DAMAGE.items() for _ in range(per_damage)]
    for dtype in ("float16", "float64", "uint8", "int64", "bool", "complex64", "U3", "object"):
        try:
            variants.append((f"images {dtype}", _npz(images=images.astype(dtype), labels=labels)))
        except (TypeError, ValueError):
            continue
    for shape in [(), (12,), (12, 8), (12, 1, 8, 8), (12, 4, 8, 8), (12, 3, 0, 8), (12, 3, 8, 8, 2), (12, 8, 8, 3),
                  (0, 3, 8, 8), (12, 3, 1, 1)]:
        variants.append((f"images of shape {shape}", _npz(images=np.zeros(shape, np.float32), labels=labels)))
    for what, value in [("labels negative", -labels), ("labels float", labels + 0.5), ("labels 2**40", labels + 2**40),
                        ("labels uint64 max", np.full(12, 2**64 - 1, dtype=np.uint64)), ("labels 2-d", labels.reshape(6, 2)),
                        ("5 labels", labels[:5]), ("labels strings", labels.astype("U2")), ("labels bool", labels.astype(bool)),
                        ("labels one class", labels * 0)]:
        variants.append((what, _npz(images=images, labels=value)))
    for what, pixels in [("NaN pixels", np.full_like(images, np.nan)), ("inf pixels", np.full_like(images, np.inf)),
                         ("pixels 1e30", np.full_like(images, 1e30))]:
        variants.append((what, _npz(images=pixels, labels=labels)))
    variants += [("no labels", _npz(images=images)), ("no images", _npz(labels=labels)),
                 ("an extra array", _npz(images=images, labels=labels, other=labels)),
                 ("a .npy named .npz", (lambda b: (np.save(b, images), b.getvalue())[1])(io.BytesIO()))]
    cases = []
    for what, content in variants:
        path = _fresh(work, "npz") / "x.npz"
        path.write_bytes(content)
        cases.append(("npz", what, path.parent, reader({"dataset": "npz", "path": str(path)}, "image-classification")))
    return cases


def _image(mode: str, size: tuple[int, int], fmt: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, fmt)
    return buffer.getvalue()


def _png_declaring(width: int, height: int) -> bytes:
    data = bytearray(_image("L", (1, 1), "PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
    return bytes(data)


def image_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable[[], int]]]:
    cases = []

    def folder(what: str, name: str, make: Callable[[Path], None]) -> None:
        root = _fresh(work, "images")
        for cls in ("a", "b"):
            (root / cls).mkdir()
            for k in range(3):
                (root / cls / f"ok{k}.png").write_bytes(_image("RGB", (8, 8), "PNG"))
        make(root / "a" / name)
        cases.append(("image-folder", what, root, reader({"dataset": "image-folder", "path": str(root), "image_size": 8},
                                                          "image-classification")))

    for fmt, name in (("PNG", "x.png"), ("JPEG", "x.jpg"), ("GIF", "x.gif")):
        base = _image("RGB" if fmt != "GIF" else "P", (8, 8), fmt)
        for damage, change in BYTE_DAMAGE.items():
            for _ in range(per_damage):
                content = change(base, rng)
                folder(f"{fmt}: {damage}", name, lambda p, c=content: p.write_bytes(c))
    for mode in ("1", "L", "LA", "P", "RGBA", "I", "I;16", "F", "CMYK"):
        fmt = "JPEG" if mode == "CMYK" else "TIFF" if mode in ("F",) else "PNG"
        name = {"JPEG": "m.jpg", "TIFF": "m.tif", "PNG": "m.png"}[fmt]
        try:
            content = _image(mode, (8, 8), fmt)
        except (OSError, ValueError, KeyError):
            continue
        folder(f"mode {mode}", name, lambda p, c=content: p.write_bytes(c))
    for size in ((1, 1), (1, 4000), (3000, 3000)):
        folder(f"an image of {size[0]} x {size[1]}", "s.png", lambda p, s=size: p.write_bytes(_image("RGB", s, "PNG")))
    for size in ((12000, 12000), (50000, 50000), (2**31 - 1, 1), (0, 5)):
        folder(f"a PNG declaring {size[0]} x {size[1]}", "d.png", lambda p, s=size: p.write_bytes(_png_declaring(*s)))
    folder("a FIFO named x.png", "f.png", lambda p: os.mkfifo(p))
    folder("a directory named x.png", "dir.png", lambda p: p.mkdir())
    folder("a text file named x.png", "t.png", lambda p: p.write_text("not an image"))
    folder("a link to /etc/passwd named x.png", "l.png", lambda p: p.symlink_to("/etc/passwd"))
    folder("a dangling link", "g.png", lambda p: p.symlink_to(p.parent / "missing.png"))
    one_class = _fresh(work, "images")
    (one_class / "a").mkdir()
    (one_class / "a" / "x.png").write_bytes(_image("RGB", (8, 8), "PNG"))
    cases.append(("image-folder", "one class", one_class, reader({"dataset": "image-folder", "path": str(one_class)}, "image-classification")))
    return cases


# ---------------------------------------------------------------------------------------------- pretrained

def pretrained_cases(work: Path, rng: random.Random, per_damage: int) -> list[tuple[str, str, Path, Callable[[], int]]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    import torch

    base = work / "pretrained-base"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                 num_key_value_heads=1, num_hidden_layers=1)).save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    weights = (base / "model.safetensors").read_bytes()
    cases = []

    def directory(what: str, config_text: str, weights_bytes: bytes | None) -> None:
        root = _fresh(work, "pretrained")
        (root / "config.json").write_text(config_text)
        if weights_bytes is not None:
            (root / "model.safetensors").write_bytes(weights_bytes)
        cases.append(("pretrained", what, root, reader({}, "causal-lm", {"pretrained": str(root), "task": "causal-lm"})))

    for damage, change in BYTE_DAMAGE.items():
        for _ in range(per_damage):
            directory(f"weights: {damage}", json.dumps(config), change(weights, rng))
            directory(f"config: {damage}", change(json.dumps(config).encode(), rng).decode("utf-8", "replace"), weights)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size", "model_type",
                "max_position_embeddings", "torch_dtype", "rope_scaling"):
        for value in [None, "x", -1, 0, 2**40, 1.5, [], {}]:
            directory(f"config {key} = {json.dumps(value)}", json.dumps({**config, key: value}), weights)
        directory(f"config without {key}", json.dumps({k: v for k, v in config.items() if k != key}), weights)
    directory("no weights", json.dumps(config), None)
    directory("config not an object", "[1, 2]", weights)
    directory("auto_map naming code", json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "evil.Model"}}), weights)
    return cases


def data_cases(seed: int, work: Path, per_damage: int = 5) -> list[tuple[str, str, Path, Callable[[], int]]]:
    """Every case of the part: ``(source, damage, directory, call)``."""
    rng = random.Random(seed)
    return (text_cases(work, rng, per_damage) + npz_cases(work, rng, per_damage) + image_cases(work, rng, per_damage)
            + pretrained_cases(work, rng, per_damage))
