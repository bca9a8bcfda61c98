"""Naive attention vs the same graph after ``fuse_sdpa``: the attention part of ``mase-lite bench``.

Run: python benchmarks/attention.py [--device cpu|cuda|auto] [--quick] [--repeats N] [-o DIR]
(the same as ``mase-lite bench --parts attention ...``; the logic lives in mase_lite/bench/attention.py).
"""

import sys

from mase_lite.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--parts", "attention", *sys.argv[1:]]))
