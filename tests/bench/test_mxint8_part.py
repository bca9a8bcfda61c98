"""The MXINT8 part of the bench: packing, memory against the format's theory, one row per case."""

import pytest
import torch

from mase_lite.bench.mxint8 import THEORETICAL_SAVING, bench_dequantize, bench_linear, bench_memory
from mase_lite.kernels.mxint8 import MXInt8Linear, pack_linears

CPU = torch.device("cpu")


def test_theory_is_one_int8_and_a_32th_of_a_scale_against_float32():
    assert THEORETICAL_SAVING == pytest.approx((32 - 8.25) / 32) == pytest.approx(0.7421875)


def test_pack_linears_packs_all_but_the_classifier(tiny_bert):
    inputs = {"input_ids": torch.randint(0, 1000, (2, 16))}
    with torch.no_grad():
        expected = tiny_bert(**inputs).logits
    linears = [name for name, m in tiny_bert.named_modules() if isinstance(m, torch.nn.Linear)]
    assert pack_linears(tiny_bert, skip=("classifier",)) == len(linears) - 1
    packed = [name for name, m in tiny_bert.named_modules() if isinstance(m, MXInt8Linear)]
    assert packed == [name for name in linears if name != "classifier"]
    assert isinstance(tiny_bert.classifier, torch.nn.Linear)
    with torch.no_grad():
        torch.testing.assert_close(tiny_bert(**inputs).logits, expected, rtol=0.05, atol=0.05)


def test_memory_rows_follow_from_the_layer_sizes():
    config = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, vocab_size=1000)
    section = bench_memory(CPU, config, batch=2, seq=8)
    weights = 4 * 64 * 64 + 2 * 64 * 128 + 64 * 64  # q, k, v, out; intermediate, output; pooler
    packed_bytes = weights + weights // 32           # one int8 per weight, one uint8 scale per 32 (64 and 128 divide)
    row = section.rows[0]
    assert row["fp32"] == 4 * weights / 2 ** 20 and row["packed"] == packed_bytes / 2 ** 20
    assert row["saved"] == f"{1 - packed_bytes / (4 * weights):.1%}" == "74.2%"
    assert row["of theory"] == "100.0%"
    assert [r["measure"] for r in section.rows] == ["packed Linear weights (MiB)", "parameters + buffers, whole model (MiB)"]


def test_tables_have_one_row_per_case():
    linear = bench_linear(CPU, features=64, batches=[1, 3], warmup=0, repeats=1)
    assert [row["batch"] for row in linear.rows] == [1, 3]
    assert linear.markdown().splitlines()[4].startswith("| 1 |")
    dequant = bench_dequantize(CPU, sizes=[1], warmup=0, repeats=1)
    assert [row["Mi elements"] for row in dequant.rows] == [1]
    assert dequant.rows[0]["ratio"] == pytest.approx(dequant.rows[0]["dequantize GB/s"] / dequant.rows[0]["copy GB/s"])


def test_cpu_sections_compare_side_by_side(monkeypatch):
    from mase_lite.bench import mxint8_cpu

    monkeypatch.setitem(__import__("sys").modules, "torchao.quantization", None)  # as if torchao were not installed
    assert mxint8_cpu.torchao_linear(torch.ones(4, 4), torch.ones(4)) is None
    linear = mxint8_cpu.bench_cpu_linear(64, [1, 40], [1], rounds=2, min_run_time=0.001)
    assert [(r["threads"], r["batch"], r["torchao int8 ms"]) for r in linear.rows] == [(1, 1, "-"), (1, 40, "-")]
    assert "torchao: not installed" in linear.notes[0]
    rows = mxint8_cpu.bench_cpu_bandwidth(64, [1], rounds=1, min_run_time=0.001).rows
    assert [row["threads"] for row in rows] == [1, "1, CPU time"]
    for bandwidth in rows:
        assert bandwidth["packed MiB"] * 2**20 == 64 * 64 + 64 * 2
        assert bandwidth["mxint8 / copy"] == pytest.approx(bandwidth["mxint8 GB/s"] / bandwidth["copy GB/s"])
    for row in linear.rows:  # each speed-up is the ratio of its own row's columns
        assert row["fp32 / mxint8"] == pytest.approx(row["F.linear fp32 ms"] / row["mxint8 fp32 ms"])
