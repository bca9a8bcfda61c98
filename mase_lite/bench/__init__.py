"""The performance lab: torch.compile vs eager, naive vs fused attention, MXINT8 memory and speed,
and codegen'd models vs their graphs, on CPU or CUDA (``mase-lite bench``).

Example::

    from mase_lite.bench import run_bench
    result = run_bench(["attention", "mxint8"], device="cpu", quick=True, output_dir="bench_out")
"""

from mase_lite.bench.run import PARTS, run_bench

__all__ = ["PARTS", "run_bench"]
