"""MXINT8 memory, packed-linear latency and dequantize throughput: the mxint8 part of ``mase-lite bench``.

Run: python benchmarks/mxint8.py [--device cpu|cuda|auto] [--quick] [--repeats N] [-o DIR] [--record]
(the same as ``mase-lite bench --parts mxint8 ...``; the logic lives in mase_lite/bench/mxint8.py).
"""

import argparse
import sys

from mase_lite.cli import main
from record import add_record_flag, recording  # beside this script

if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the rest is the bench's
    add_record_flag(parser)
    rest = parser.parse_known_args()[1]
    with recording("mxint8"):
        sys.exit(main(["bench", "--parts", "mxint8", *rest]))
