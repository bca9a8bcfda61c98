"""Naive attention vs the same graph after ``fuse_sdpa``: the attention part of ``mase-lite bench``.

Run: python benchmarks/attention.py [--device cpu|cuda|auto] [--quick] [--repeats N] [-o DIR] [--record]
(the same as ``mase-lite bench --parts attention ...``; the logic lives in mase_lite/bench/attention.py).
"""

import argparse
import sys

from mase_lite.cli import main
from record import add_record_flag, recording  # beside this script

if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the rest is the bench's
    add_record_flag(parser)
    rest = parser.parse_known_args()[1]
    with recording("attention"):
        sys.exit(main(["bench", "--parts", "attention", *rest]))
