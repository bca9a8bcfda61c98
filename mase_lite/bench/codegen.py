"""The codegen'd package against the MaseGraph it came from: same outputs, same speed or better."""

from __future__ import annotations

import importlib
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from mase_lite.bench.section import Plot, Section
from mase_lite.bench.timing import column_ratio, paired_seconds

PACKED = {"by": "type", "rules": {"linear": {"name": "mxint", "element_width": 8, "storage": "packed"}}}


def _emitted(mg, directory: Path, name: str, device: torch.device) -> torch.nn.Module:
    import mase_lite.passes as passes

    passes.codegen(mg, {"path": str(directory / name)})
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(name).load(device)
    finally:
        sys.path.remove(str(directory))


def bench_codegen(device: torch.device, bert_config: dict, batch: int, seq: int, warmup: int,
                  repeats: int) -> Section:
    """MaseGraph vs emitted model on BERT, float and packed MXINT8."""
    import mase_lite.passes as passes
    from mase_lite.bench.compile import bert
    from mase_lite.ir.graph import MaseGraph

    rows = []
    inputs = {"input_ids": torch.randint(0, 1000, (batch, seq), device=device),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device)}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("float", "packed"):
            mg = MaseGraph(bert(bert_config), hf_input_names=["input_ids", "attention_mask"])
            if variant == "packed":
                mg, _ = passes.quantize(mg, PACKED)
            name = f"bench_{variant}_{abs(hash((tmp, variant))) % 10**8}"
            emitted = _emitted(mg, Path(tmp), name, device)
            graph = mg.to(device).model.eval()
            with torch.inference_mode():
                same = torch.equal(graph(**inputs).logits, emitted(**inputs).logits)
                graph_s, emitted_s = paired_seconds([lambda: graph(**inputs), lambda: emitted(**inputs)], device,
                                                    warmup, repeats)
            rows.append({"model": variant, "MaseGraph ms": 1e3 * statistics.median(graph_s),
                         "emitted ms": 1e3 * statistics.median(emitted_s),
                         "speed-up": column_ratio(graph_s, emitted_s), "bit-identical": same})
    notes = [f"BERT {bert_config}, batch {batch}x{seq}, eval mode; median of {repeats} interleaved calls after "
             f"{warmup} warm-up calls; speed-up = MaseGraph / emitted."]
    return Section("codegen", "Codegen'd model vs its MaseGraph",
                   ["model", "MaseGraph ms", "emitted ms", "speed-up", "bit-identical"], rows, notes,
                   Plot(x="model", ys=["MaseGraph ms", "emitted ms"], ylabel="ms per forward", kind="bar"))
