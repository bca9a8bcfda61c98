"""``mase-lite bench --quick`` runs every part on CPU and writes its table, JSON and plots."""

import json

import pytest
import torch

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import column_ratio
from mase_lite.cli import main


def test_quick_bench_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--device", "cpu", "--repeats", "2", "-o", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["device"] == "cpu" and result["quick"] is True
    sections = {s["name"]: s for s in result["sections"]}
    assert list(sections) == ["compile", "attention", "memory", "linear", "cpu_linear", "cpu_bandwidth", "cpu_model",
                              "dequantize", "codegen", "decode"]
    (decode,) = sections["decode"]["rows"]
    assert decode["threads"] == 1 and decode["MXINT8 tokens/s"] == pytest.approx(1e3 / decode["MXINT8 ms/token"])
    assert decode["MXINT8 / MXINT8 in transformers' generate speed-up"] == pytest.approx(
        decode["MXINT8 in transformers' generate ms/token"] / decode["MXINT8 ms/token"])
    for name in ("MXINT8", "Q4_0", "MXFP4"):  # each speed-up is the same row's float32 time over the column's
        assert decode[f"{name} / float32 speed-up"] == pytest.approx(decode["float32 ms/token"] / decode[f"{name} ms/token"])
    assert [r["seq"] for r in sections["attention"]["rows"]] == [32, 64]
    assert [r["batch"] for r in sections["linear"]["rows"]] == [1, 16, 256]
    assert [(r["threads"], r["batch"]) for r in sections["cpu_linear"]["rows"]] == [(1, 1), (1, 8), (1, 64)]
    assert all(r["fp32 / mxint8"] > 0 and r["bf16 / mxint8 bf16"] > 0 for r in sections["cpu_linear"]["rows"])
    assert [r["measure"] for r in sections["cpu_model"]["rows"]] == [
        "process RSS (MiB)", "RSS grown by the model (MiB)", "forward 1x1 tokens, 1 thread (ms)", "forward 1x16 tokens, 1 thread (ms)"]
    memory, grown, *forward = sections["cpu_model"]["rows"]
    assert grown["float"] > 0 and grown["packed"] > 0  # the heap trimmed at both ends: growth, never negative
    for row in (memory, grown):
        assert row["packed / float"] == pytest.approx(row["packed"] / row["float"]) and row["speed-up"] == "-"
    for row in forward:  # a speed-up as in every table: the float column over the packed one, above 1 when faster
        assert row["speed-up"] == pytest.approx(row["float"] / row["packed"]) and row["packed / float"] == "-"
    assert [r["model"] for r in sections["codegen"]["rows"]] == ["float", "packed"]
    assert all(r["bit-identical"] for r in sections["codegen"]["rows"])
    assert sections["memory"]["rows"][0]["of theory"] == "100.0%"  # every quick layer's width divides by 32
    for row in sections["attention"]["rows"] + sections["compile"]["rows"]:
        assert row["speed-up"] > 0 and float(row["max abs diff"]) < 1e-4
    markdown = (out / "results.md").read_text()
    assert "### Naive attention vs fuse_sdpa" in markdown and "| bert-tiny shape |" in markdown
    assert markdown in capsys.readouterr().out
    assert sorted(result["plots"]) == ["attention.png", "codegen.png", "compile.png", "cpu_linear.png", "dequantize.png",
                                       "linear.png"]
    for name in result["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cuda_without_a_gpu_is_a_user_error(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert main(["bench", "--device", "cuda", "--parts", "attention", "-o", str(tmp_path / "b")]) == 2
    assert "--device: cuda was asked for but no CUDA device is visible; use cpu or auto" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_repeats_must_be_positive(tmp_path, capsys):
    assert main(["bench", "--repeats", "0", "--parts", "attention", "-o", str(tmp_path / "b")]) == 2
    assert "--repeats: must be at least 1, got 0" in capsys.readouterr().err


def test_markdown_table_and_column_ratio():
    section = Section("s", "Title", ["name", "ms", "ok"], [{"name": "a", "ms": 1.23456, "ok": True},
                                                          {"name": "b", "ms": 12345.6, "ok": False}],
                      ["a note"], Plot(x="name", ys=["ms"], ylabel="ms"))
    assert section.markdown().splitlines() == ["### Title", "", "| name | ms | ok |", "|---|---:|---:|",
                                               "| a | 1.235 | yes |", "| b | 12346 | no |", "", "a note"]
    assert column_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 1.0]) == 4.0  # medians 4 and 1: what the ms columns show
