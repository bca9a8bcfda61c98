"""pt2: the ``torch.export`` program of the quantized model, for a fresh process:

    import mase_lite.deploy.pt2 as pt2          # registers mase_lite's operators, nothing else runs
    model = pt2.load("model.pt2")               # a torch.nn.Module: model(input_ids) -> logits, ...

Quantized weights are the program's constants, as their quantized values; packed MXINT8 layers keep their int8
codes and call ``mase_lite::mxint8_linear``; quantized activations call ``mase_lite::fake_quantize`` with their
format. The program takes the model's inputs in order (batch and sequence dimensions free) and returns its
tensors (a model output's fields, in order; a tensor when there is one, as ``logits``), and computes the
tool's values bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import mase_lite.kernels.mxint8.ops  # noqa: F401  (registers mase_lite::mxint8_linear for loading)
import mase_lite.nn.quant_op  # noqa: F401  (registers mase_lite::fake_quantize for loading)
from mase_lite.deploy.layers import ExportError
from mase_lite.deploy.tracing import Outputs, dynamic, evaluating, example_inputs, quantized_values
from mase_lite.errors import UserError
from mase_lite.files import follow_umask, staged_file

TARGET = "pt2"


def write(mg, path: str | Path, tokenizer: Any = None) -> dict[str, Any]:
    """Write ``mg`` (a graph or a module-mode model with example inputs) as a ``torch.export`` program to ``path``."""
    model = mg.model
    inputs = example_inputs(mg)
    wrapper = Outputs(model, list(inputs))
    with quantized_values(model, unpack=False), evaluating(wrapper), torch.no_grad():
        outputs = wrapper.names_of(model(**inputs))
        try:
            program = torch.export.export(wrapper, tuple(inputs.values()),
                                          dynamic_shapes=(tuple(dynamic(v) for v in inputs.values()),), strict=False)
        except Exception as err:  # torch.export's refusal of this model, in one line
            raise ExportError(f"{TARGET}: torch.export cannot trace this model: {str(err).splitlines()[0]}") from None
    path = Path(path)
    with staged_file(path) as tmp:
        with open(tmp, "wb") as file:  # a file object: torch.export names no staging file
            torch.export.save(program, file)
        follow_umask(tmp)
    return {"format": TARGET, "path": str(path), "bytes": path.stat().st_size, "inputs": list(inputs),
            "outputs": outputs}


def load(path: str | Path) -> torch.nn.Module:
    """The program written by :func:`write`, as a module."""
    try:
        return torch.export.load(str(path)).module()
    except (OSError, RuntimeError, ValueError, KeyError) as err:
        raise UserError(f"{path} is not a readable torch.export program: {str(err).splitlines()[0]}") from None
