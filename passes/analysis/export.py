"""The ``export`` pass: write the model for a runtime (it does not change the graph).

Example::

    {"pass": "export", "params": {"format": "compressed-tensors", "path": "hf"}}   # transformers, vLLM, SGLang
    {"pass": "export", "params": {"format": "gguf", "path": "model.gguf"}}         # llama.cpp
    {"pass": "export", "params": {"format": "onnx", "path": "model.onnx"}}         # onnxruntime
    {"pass": "export", "params": {"format": "pt2", "path": "model.pt2"}}           # torch.export.load

A layer whose format the target cannot hold is refused before anything is written, naming the layer, its
format and the target's nearest scheme (see :mod:`mase_lite.deploy`). A relative path stays inside the run; an
absolute one may hold a previous export of the same format, replaced with ``"overwrite": true``; nothing else that
stands at the path (a folder, a file, a device, the model's source) is ever replaced.

The tokenizer written with the model (compressed-tensors, gguf) is the call's ``tokenizer=``, else the data's (the
run's, or ``data=`` of a call), else the one saved beside the model; ``info["tokenizer"]`` says which
(``"tokenizer="``, ``"data"`` or the directory), ``None`` (with a warning) when there was none.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from mase_lite.deploy import export, target_names
from mase_lite.passes.registry import PassParams, PassResult, register_pass

logger = logging.getLogger(__name__)


class ExportParams(PassParams):
    format: str = Field(description="compressed-tensors (a Hugging Face directory), gguf (llama.cpp), onnx (Q/DQ for "
                        "onnxruntime), pt2 (a torch.export program) or a registered target")
    path: str = Field(min_length=1, description="where to write (a directory for compressed-tensors, else a file), "
                      "relative to the run")
    overwrite: bool = Field(False, description="replace a previous export of this format at an absolute path outside the "
                            "run (nothing but the tool's own export is ever replaced)")
    tokenizer: bool = Field(True, description="write the run's tokenizer with the model where the format keeps one")
    @field_validator("format")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in target_names():
            raise ValueError(f"unknown export target {value!r}; allowed: {', '.join(target_names())}")
        return value

    float_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the tensors that are not quantized (compressed-tensors; gguf: float32 or "
        "float16); float32 keeps the tool's numerics exactly")


KEEPS_TOKENIZER = ("compressed-tensors", "gguf")  # the built-in targets that write a tokenizer with the model
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer/tokenizer.json")


def _tokenizer(mg, ctx) -> tuple[Any, str | None]:
    """The tokenizer to write and where it came from: the call's ``tokenizer=``, the run's (or ``data=``'s) data,
    else the one saved beside the model (its ``name_or_path`` directory); ``(None, None)`` when there is none."""
    if ctx.tokenizer is not None:
        return ctx.tokenizer, "tokenizer="
    if getattr(ctx.data, "tokenizer", None) is not None:
        return ctx.data.tokenizer, "data"
    own = getattr(getattr(getattr(mg, "source_model", None), "config", None), "_name_or_path", "") or ""
    if own and any((Path(own) / name).is_file() for name in TOKENIZER_FILES):
        from mase_lite.workloads.tokenizer import load_tokenizer

        return load_tokenizer(own, field="the model's name_or_path"), own
    return None, None


@register_pass("export", kind="analysis", params=ExportParams, needs_graph=False,
               streams=lambda params: params.format == "compressed-tensors")
def export_pass(mg, params: ExportParams, ctx):
    """Write the model as a compressed-tensors directory, a GGUF file, an ONNX model or a torch.export program."""
    tokenizer, source = _tokenizer(mg, ctx) if params.tokenizer else (None, None)
    keeps = params.format in KEEPS_TOKENIZER
    if keeps and params.tokenizer and tokenizer is None:
        logger.warning("export: no tokenizer to write with the model at %s; give one (ml.passes.export(mg, {...}, "
                       "tokenizer=<a tokenizer, its directory or hub name>), or data= a dataset), or set "
                       "\"tokenizer\": false", params.path)
    options = {"float_dtype": params.float_dtype} if params.float_dtype != "float32" else {}
    info = export(mg, params.format, ctx.path(params.path), tokenizer=tokenizer, overwrite=params.overwrite,
                  sources=ctx.sources, **options)
    return PassResult({**info, "tokenizer": source} if keeps else info)
