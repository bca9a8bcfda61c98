"""Memory of a packed model against its float weights: 24 Linears of 2048 x 2048 (403 MB of float32), packed in MXINT8
and in Q4_0 (4-bit groups of 32, float16 scales) by three routes: ``pack_linears`` on the modules, the quantize pass on
the modules, and the quantize pass on a captured graph (what a pipeline runs). Each case runs in a fresh process and
reads its resident memory (``/proc/self/statm``) before the model is built and after packing; "the imports" include
the capture machinery (torch.export and what it loads on first use, ~110 MB), which a small warm-up capture brings
in before the first reading, so that the figures are the model's own. The export cache is off in the cases: a warm-up
found in it is loaded, not exported, and torch.export's first-use memory (~22 MB) would fall on the measured capture.

    python benchmarks/packed_memory.py
    python benchmarks/packed_memory.py --layers 12 --width 1024    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from record import add_record_flag, recording  # beside this script

CASE = """
import gc, json, os, torch
import mase_lite as ml
from mase_lite.kernels import mxint8, packed4

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

RULES = {{"mxint8": {{"name": "mxint", "element_width": 8, "storage": "packed"}},
         "q4_0": {{"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32,
                  "scale_dtype": "float16", "full_range": True, "storage": "packed"}}}}
torch.set_num_threads(1)
warm = ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(64, 64)), example_inputs={{"input": torch.randn(1, 64)}})
ml.passes.quantize(warm, {{"default": RULES["{fmt}"]}})
del warm
gc.collect()
base = rss()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
floats = sum(p.numel() * 4 for p in model.parameters())
if "{route}" == "pack_linears":
    mxint8.pack_linears(model) if "{fmt}" == "mxint8" else packed4.pack_linears(model, "q4_0")
elif "{route}" == "pass on modules":
    model, _ = ml.passes.quantize(model, {{"default": RULES["{fmt}"]}})
else:
    graph = ml.MaseGraph(model, example_inputs={{"input": torch.randn(1, {width})}})
    del model
    graph, _ = ml.passes.quantize(graph, {{"default": RULES["{fmt}"]}})
    model = graph.model
gc.collect()
packed = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
print(json.dumps(dict(floats=floats, packed=packed, after=rss() - base)))
"""

ROUTES = ("pack_linears", "pass on modules", "pass on a captured graph")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    add_record_flag(parser)
    args = parser.parse_args()
    print("| format | route | float weights | the format's bits / float | resident after packing / float |")
    print("|---|---|---|---|---|")
    for fmt in ("mxint8", "q4_0"):
        for route in ROUTES:
            script = CASE.format(fmt=fmt, route=route, layers=args.layers, width=args.width)
            run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                 env={**os.environ, "MASE_LITE_EXPORT_CACHE": "0"})
            m = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"| {fmt} | {route} | {m['floats'] / 1e6:.0f} MB | {m['packed'] / m['floats']:.3f} | "
                  f"{m['after'] / m['floats']:.3f} |")


if __name__ == "__main__":
    with recording("packed_memory", threads=1):  # each case sets one thread
        main()
