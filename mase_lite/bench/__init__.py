"""The performance lab: torch.compile vs eager, naive vs fused attention, MXINT8 memory and speed,
and codegen'd models vs their graphs, on CPU or CUDA (``mase-lite bench``, the course's lab 4, run by users on their
machine). The project's own measurements against peers and baselines are the scripts in ``benchmarks/``, which
record their figures in ``benchmarks/RESULTS.md``.

Example::

    from mase_lite.bench import run_bench
    result = run_bench(["attention", "mxint8"], device="cpu", quick=True, output_dir="bench_out")
"""

from mase_lite.bench.run import PARTS, run_bench

__all__ = ["PARTS", "run_bench"]
