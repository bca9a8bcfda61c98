"""Local data files are data: every damaged or hostile one is refused in one line naming the file and the problem
(a UserError, exit 2 from the CLI), before memory is spent on it, never a traceback or a hang."""

import io
import json
import os
import struct
import zipfile
import zlib

import numpy as np
import pytest
from PIL import Image

from mase_lite.infra.errors import UserError
from mase_lite.workloads.data import build_data


def write(name: str, content):
    def make(d):
        path = d / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        return path
    return make


def npz(**arrays):
    def make(d):
        np.savez(d / "x.npz", **arrays)
        return d / "x.npz"
    return make


def npz_declaring(shape):
    def make(d):
        with zipfile.ZipFile(d / "x.npz", "w") as archive:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
            archive.writestr("images.npy", header.getvalue())
            labels = io.BytesIO()
            np.save(labels, np.zeros(4, dtype=int))
            archive.writestr("labels.npy", labels.getvalue())
        return d / "x.npz"
    return make


def npy_named_npz(d):
    np.save(d / "x.npy", np.zeros((4, 8, 8)))
    os.rename(d / "x.npy", d / "x.npz")
    return d / "x.npz"


ROWS = [{"text": f"row {i}", "label": i % 2} for i in range(10)]
TEXT = "sequence-classification"
CASES = {
    "npy named npz": ("npz", npy_named_npz, r"not an \.npz file \(an \.npz is a zip of \.npy arrays\)"),
    "empty npz": ("npz", write("x.npz", b""), r"not an \.npz file"),
    "0-d images": ("npz", npz(images=np.array(3.0), labels=np.array(1)), r"images of shape \[\]; expected"),
    "0x0 images": ("npz", npz(images=np.zeros((4, 3, 0, 0)), labels=np.zeros(4, dtype=int)), r"\[4, 3, 0, 0\]"),
    "labels of 2**62": ("npz", npz(images=np.zeros((4, 8, 8)), labels=np.full(4, 2**62)),
                        r"labels must be integers 0 \.\. 2147483647, got int64 values 4611686018427387904 \.\. 4611686018427387904$"),
    "uint64 max labels": ("npz", npz(images=np.zeros((4, 8, 8)), labels=np.full(4, 2**64 - 1, dtype=np.uint64)),
                          r"got uint64 values 18446744073709551615 \.\. 18446744073709551615$"),
    "string labels": ("npz", npz(images=np.zeros((4, 8, 8)), labels=np.array(["a", "b", "a", "b"])),
                      r"labels must be integers 0 \.\. 2147483647, got <U1$"),
    "a header of 1e18 elements": ("npz", npz_declaring((10**9, 10**9)), r"data.path: the arrays of .* would need about"),
    "rows that are numbers": ("json", write("x.json", "[1, 2, 3]"), r"x\.json: row 1 is 1, not an object of columns"),
    "rows that are null": ("json", write("x.json", "[null]"), r"row 1 is None, not an object"),
    "nesting 1e5 deep": ("json", write("x.json", "[" * 100000 + "]" * 100000), r"nested deeper than 64 levels"),
    "a 5000-digit number": ("json", write("x.json", '[{"text": "a", "label": ' + "9" * 5000 + "}]"),
                            r"a number has more than 4300 digits"),
    "a label of 1e300": ("json", write("x.json", json.dumps([{"text": "a", "label": 1e300}, *ROWS])),
                         r"row 1: label column 'label' holds 1e\+300; labels must be integers 0, 1, \.\.\. up to"),
    "a lone surrogate": ("json", write("x.json", '[{"text": "\\ud800", "label": 1}]'), r"holds a lone surrogate"),
    "a CSV field over 128 KB": ("csv", write("x.csv", "text,label\n" + "a" * 200000 + ",1\n"),
                                r"x\.csv, line \d+: not CSV the reader takes \(field larger than field limit"),
    "a 20-digit CSV label": ("csv", write("x.csv", "text,label\na,99999999999999999999\n" + "b,0\n" * 9),
                             r"holds '99999999999999999999'; labels must be integers"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_data_file_is_refused_in_one_line(case, tmp_path):
    dataset, make, message = CASES[case]
    path = make(tmp_path)
    task = "image-classification" if dataset == "npz" else TEXT
    with pytest.raises(UserError, match=message) as caught:
        build_data({"dataset": dataset, "path": str(path)}, task=task)
    assert "\n" not in str(caught.value)


def image_folder(d, name: str, make) -> None:
    for cls in ("a", "b"):
        (d / cls).mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (10, 20, 30)).save(d / cls / "ok.png")
    make(d / "a" / name)


def png_declaring(width: int, height: int):
    """A PNG whose header says width x height (its CRC right) and holds one pixel of data."""
    def make(path):
        buffer = io.BytesIO()
        Image.new("L", (1, 1)).save(buffer, "PNG")
        data = bytearray(buffer.getvalue())
        data[16:24] = struct.pack(">II", width, height)
        data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])) & 0xFFFFFFFF)
        path.write_bytes(bytes(data))
    return make


def text_bomb(path):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    png = buffer.getvalue()
    body = b"Comment\x00\x00" + zlib.compress(b"a" * (64 << 20))
    chunk = struct.pack(">I", len(body)) + b"zTXt" + body + struct.pack(">I", zlib.crc32(b"zTXt" + body) & 0xFFFFFFFF)
    path.write_bytes(png[:33] + chunk + png[33:])


def fuzzed_gif(path):
    buffer = io.BytesIO()
    Image.new("P", (16, 16)).save(buffer, "GIF")
    data = bytearray(buffer.getvalue())
    data[20:40] = b"\xff" * 20
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, make, message", [
    ("x.png", os.mkfifo, r"x\.png: not a regular file"),  # would block the reader forever
    ("big.png", png_declaring(12000, 12000), r"big\.png: an image of 12000 x 12000 pixels, more than the 67108864"),
    ("z.png", text_bomb, r"z\.png: not a readable image \(ValueError: Decompressed data too large"),
    ("g.gif", fuzzed_gif, r"g\.gif: not a readable image \("),
])
def test_a_hostile_image_is_refused_before_it_is_decoded(name, make, message, tmp_path):
    image_folder(tmp_path, name, make)
    with pytest.raises(UserError, match=message):
        build_data({"dataset": "image-folder", "path": str(tmp_path)}, task="image-classification")


@pytest.mark.parametrize("fields, message", [
    ({"num_hidden_layers": 100000}, r"model\.pretrained: a llama model of this config would need about [\d.]+ GB, more"),
    ({"hidden_size": 65536, "intermediate_size": 65536, "num_attention_heads": 64},
     r"model\.pretrained: a llama model of this config would need about"),
])
def test_a_local_pretrained_directory_is_sized_before_it_is_built(fields, message, tmp_path, monkeypatch):
    """Sized like an hf_config, from its config, before anything is allocated (the machine's memory fixed at 8 GB)."""
    from transformers import LlamaConfig

    from mase_lite.infra import limits
    from mase_lite.workloads.models import build_model

    monkeypatch.setattr(limits, "memory_bytes", lambda: 8 << 30)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2)
    for key, value in fields.items():
        setattr(config, key, value)
    config.save_pretrained(tmp_path)
    with pytest.raises(UserError, match=message):
        build_model({"pretrained": str(tmp_path), "task": "causal-lm"}, num_labels=2, seed=0)


def test_a_pickled_checkpoint_is_refused_in_one_line_and_never_unpickled(tmp_path):
    import pickle

    from transformers import LlamaConfig

    from mase_lite.workloads.models import build_model

    LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_hidden_layers=1).save_pretrained(tmp_path)
    canary = tmp_path / "ran"
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Planted(str(canary))))
    with pytest.raises(UserError, match=r"model\.pretrained = .*: could not load it \(Weights only load failed"):
        build_model({"pretrained": str(tmp_path), "task": "causal-lm"}, num_labels=2, seed=0)
    assert not canary.exists()


class _Planted:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_csv_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    (tmp_path / "x.csv").write_bytes("\ufefftext,label\n".encode() + "".join(f"row {i},{i % 2}\n" for i in range(10)).encode())
    data = build_data({"dataset": "csv", "path": str(tmp_path / "x.csv")})
    assert data.size("train") + data.size("test") == 10


def test_complex_pixels_are_refused(tmp_path):
    np.savez(tmp_path / "x.npz", images=np.zeros((4, 8, 8), dtype=np.complex64), labels=np.arange(4) % 2)
    with pytest.raises(UserError, match=r"image values must be finite real numbers, got complex64"):
        build_data({"dataset": "npz", "path": str(tmp_path / "x.npz")}, task="image-classification")


def _secret(tmp_path):
    """A file outside the data directory, which a link inside it points to."""
    (tmp_path / "elsewhere").mkdir()
    secret = tmp_path / "elsewhere" / "secret.csv"
    secret.write_text("text,label\n" + "".join(f"secret {i},{i % 2}\n" for i in range(10)))
    return secret


def test_a_split_file_linked_from_outside_the_directory_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "test.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(10)))
    (data / "train.csv").symlink_to(_secret(tmp_path))
    with pytest.raises(UserError) as caught:
        build_data({"dataset": "csv", "path": str(data)})
    assert str(caught.value) == (f"data.path: {data / 'train.csv'} is a link to {tmp_path / 'elsewhere' / 'secret.csv'}, "
                                 f"outside {data}: copy the file into the directory instead")


def test_an_image_linked_from_outside_the_folder_is_refused(tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    outside = tmp_path / "outside.png"
    Image.new("RGB", (8, 8)).save(outside)
    image_folder(data, "linked.png", lambda path: path.symlink_to(outside))
    with pytest.raises(UserError, match=r"^data\.path: .*linked\.png is a link to .*outside\.png, outside "):
        build_data({"dataset": "image-folder", "path": str(data)}, task="image-classification")


@pytest.mark.parametrize("data_files, message", [
    ("/etc/passwd", r"data_files '/etc/passwd' lies outside"),
    ("../elsewhere/secret.csv", r"data_files '\.\./elsewhere/secret\.csv' lies outside"),
    ({"split": "train", "path": "https://example.com/x.csv"}, r"data_files 'https://example\.com/x\.csv' lies outside"),
])
def test_a_local_datasets_card_naming_files_outside_its_directory_is_refused(data_files, message, tmp_path):
    import yaml

    _secret(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\na,0\nb,1\n")
    card = {"configs": [{"config_name": "default", "data_files": [data_files] if isinstance(data_files, dict) else data_files}]}
    (data / "README.md").write_text(f"---\n{yaml.safe_dump(card)}---\n# data\n")
    with pytest.raises(UserError, match=r"^data\.dataset: .*README\.md: " + message) as caught:
        build_data({"dataset": str(data)})
    assert "\n" not in str(caught.value)


def test_a_local_datasets_directory_with_a_link_out_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").symlink_to(_secret(tmp_path))
    with pytest.raises(UserError, match=r"^data\.dataset: .*train\.csv is a link to .*secret\.csv, outside "):
        build_data({"dataset": str(data)})


def test_a_local_dataset_loading_script_is_refused_as_such_and_never_run(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    canary = tmp_path / "ran"
    (data / "data.py").write_text(f"open({str(canary)!r}, 'w')\n")
    with pytest.raises(UserError) as caught:
        build_data({"dataset": str(data)})
    assert str(caught.value) == (f"data.dataset = {str(data)!r}: the datasets library does not read it: Dataset scripts "
                                 "are no longer supported, but found data.py")
    assert not canary.exists()


def _pretrained_dir(tmp_path, config_change=None, weights_change=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                 num_key_value_heads=1, num_hidden_layers=1)).save_pretrained(tmp_path)
    if config_change:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps(config_change(config)))
    if weights_change:
        weights = tmp_path / "model.safetensors"
        weights.write_bytes(weights_change(weights.read_bytes()))
    return tmp_path


@pytest.mark.parametrize("config_change, weights_change, message", [
    (lambda c: {**c, "hidden_size": None}, None, r"Validation error for field 'hidden_size': TypeError: Field 'hidden_size' expected int"),
    (lambda c: {**c, "num_attention_heads": 0}, None, r"\(integer modulo by zero\)"),
    (lambda c: {**c, "model_type": []}, None, r"\(unhashable type: 'list'\)"),
    (None, lambda w: w[: len(w) // 2], r"\(Error while deserializing header: incomplete metadata"),
    (None, lambda w: b"", r"\(Error while deserializing header: header too small\)"),
])
def test_a_damaged_pretrained_directory_is_refused_in_one_line(config_change, weights_change, message, tmp_path):
    """Found by benchmarks/robustness.py's data part: huggingface_hub's strict config checks, transformers' own and
    damaged safetensors ended in tracebacks."""
    from mase_lite.workloads.models import build_model

    path = _pretrained_dir(tmp_path, config_change, weights_change)
    with pytest.raises(UserError, match=rf"^model\.pretrained = '{path}': could not load it .*{message}") as caught:
        build_model({"pretrained": str(path), "task": "causal-lm"}, num_labels=2, seed=0)
    assert "\n" not in str(caught.value)
