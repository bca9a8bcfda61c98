"""pt2: the ``torch.export`` program of the quantized model, for a fresh process:

    import mase_lite.deploy.pt2 as pt2          # registers mase_lite's operators, nothing else runs
    model = pt2.load("model.pt2")               # a torch.nn.Module
    logits = model(input_ids, attention_mask)   # a causal LM, a text classifier; an image classifier: pixel_values

A ``.pt2`` is data, like a checkpoint: :func:`load` reads it with nothing unpickled, evaluated or run. Before torch
sees the archive, :mod:`.pt2_check` refuses one holding pickled objects, guard code beyond relations of the
inputs' sizes, operators outside aten, prims and mase_lite, or symbolic shapes that are more than expressions
(torch's own loader would run each), naming the member; ``trust_code=True`` (or ``--trust-code``) loads an
archive from elsewhere as ``torch.export.load`` does.

Quantized weights are the program's constants, as their quantized values; packed MXINT8 layers keep their int8
codes and call ``mase_lite::mxint8_linear``; quantized activations call ``mase_lite::fake_quantize`` with their
format. The program is the model as a runtime calls it: it takes the model's inputs but ``labels`` (an
encoder-decoder keeps them: its decoder reads the targets), positionally in the order of the export's ``inputs``
(the module torch.export loads takes them as they were traced), batch and sequence dimensions free; it returns
the ``logits`` (a model without: its output's tensors, in order; one alone as itself), with no key/value cache,
and computes the tool's values bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import io
import json
import logging
import zipfile

import torch

import mase_lite.kernels.mxint8.ops  # noqa: F401  (registers mase_lite::mxint8_linear for loading)
import mase_lite.layers.quant_op  # noqa: F401  (registers mase_lite::fake_quantize for loading)
from mase_lite.deploy.pt2_check import check_archive
from mase_lite.deploy.tracing import inference_program
from mase_lite.infra.errors import UserError
from mase_lite.infra.files import follow_umask, head_of, read_regular, staged_file
from mase_lite.infra.progress import loggers_at
from mase_lite.infra.trust import trusted

TARGET = "pt2"
ANY_WEIGHT_FORMAT = True  # a weight format without a mapping here is written as its values
MARKER = "mase_lite.json"  # an extra file naming the writer: what tells a previous export at a path


def write(mg, path: str | Path, tokenizer: Any = None) -> dict[str, Any]:
    """Write ``mg`` (a graph or a module-mode model with example inputs) as a ``torch.export`` program to ``path``:
    its inference inputs (not ``labels``) in order, returning its logits."""
    program, inputs, outputs = inference_program(mg, TARGET, unpack=False)
    path = Path(path)
    archive = io.BytesIO()  # torch's archive writer aborts the process on a full disk; Python's write raises
    torch.export.save(program, archive, extra_files={MARKER: json.dumps({"format": TARGET, "writer": "mase_lite"})})
    with staged_file(path) as tmp:
        tmp.write_bytes(archive.getbuffer())
        follow_umask(tmp)
    return {"format": TARGET, "path": str(path), "bytes": path.stat().st_size, "inputs": inputs, "outputs": outputs}


def is_export(path: Path) -> bool:
    """Whether ``path`` is a program :func:`write` wrote (its archive holds the writer's marker)."""
    if head_of(path, 4) != b"PK\x03\x04":
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith(f"/extra/{MARKER}") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def load(path: str | Path, trust_code: bool = False) -> torch.nn.Module:
    """The program written by :func:`write`, as a module; an archive that holds more than data is refused naming
    the member, unless ``trust_code`` (or ``--trust-code``)."""
    data = read_regular(path, "a torch.export program")
    trust = trust_code or trusted()
    if not trust:
        check_archive(data, str(path))
    try:
        with loggers_at(logging.CRITICAL, "torch.export"):  # it logs a damaged archive's traceback, then raises
            program = torch.export.load(io.BytesIO(data))
        return program.module() if trust else program.module(check_guards=False)
    except Exception as err:  # torch's loader raises many kinds (AssertionError, SpecViolationError, ...) for damage
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise UserError(f"{path} is not a readable torch.export program: {type(err).__name__}: {first}") from None
