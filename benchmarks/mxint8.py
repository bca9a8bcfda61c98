"""MXINT8 memory, packed-linear latency and dequantize throughput: the mxint8 part of ``mase-lite bench``.

Run: python benchmarks/mxint8.py [--device cpu|cuda|auto] [--quick] [--repeats N] [-o DIR]
(the same as ``mase-lite bench --parts mxint8 ...``; the logic lives in mase_lite/bench/mxint8.py).
"""

import sys

from mase_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "mxint8", *sys.argv[1:]]))
