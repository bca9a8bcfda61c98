"""benchmarks/mxint8.py runs end to end on small sizes (figures themselves live in RESULTS.md)."""

import importlib.util
from pathlib import Path

import torch

from mase_lite.kernels.mxint8 import MXInt8Linear

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mxint8.py"


def load_script():
    spec = importlib.util.spec_from_file_location("mxint8_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pack_linears_packs_all_but_the_classifier(tiny_bert):
    bench = load_script()
    inputs = {"input_ids": torch.randint(0, 1000, (2, 16))}
    with torch.no_grad():
        expected = tiny_bert(**inputs).logits
    linears = [name for name, m in tiny_bert.named_modules() if isinstance(m, torch.nn.Linear)]
    bench.pack_linears(tiny_bert)
    packed = [name for name, m in tiny_bert.named_modules() if isinstance(m, MXInt8Linear)]
    assert packed == [name for name in linears if name != "classifier"]
    assert isinstance(tiny_bert.classifier, torch.nn.Linear)
    with torch.no_grad():
        torch.testing.assert_close(tiny_bert(**inputs).logits, expected, rtol=0.05, atol=0.05)


def test_tables_have_one_row_per_case():
    bench = load_script()
    cpu = torch.device("cpu")
    linear = bench.bench_linear(cpu, features=64, batches=[1, 3], repeats=1, warmup=0).splitlines()
    assert len(linear) == 4 and linear[2].startswith("| 1 |") and linear[3].startswith("| 3 |")
    dequant = bench.bench_dequantize(cpu, sizes=[1], repeats=1, warmup=0).splitlines()
    assert len(dequant) == 3 and dequant[2].startswith("| 1 Mi |")
