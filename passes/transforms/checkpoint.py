"""The ``save`` and ``load`` passes: checkpoints (safetensors weights, JSON recipe, tokenizer) so one
pipeline starts from the model another produced.

Example::

    mg, info = ml.passes.save(mg, {"path": "checkpoint"})                       # <run dir>/checkpoint
    mg, info = ml.passes.load(mg, {"path": "runs/finetune/checkpoint"})

A checkpoint directory holds ``model.safetensors`` and ``recipe.json`` (see ``MaseGraph.save``)
and, when the graph has data, ``tokenizer/``. It is written whole or not at all. Quantized weights are
stored as their codes and scales (``weights: "codes"``, the default: a 4-bit weight in groups of 128 with
float16 scales takes 4.125 bits per element); a load decodes them bit for bit, with no data.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field

from mase_lite.infra.errors import UserError, ensure_dir
from mase_lite.infra.files import recover, staged_directory
from mase_lite.ir.serialize import RECIPE, read_recipe
from mase_lite.layers.storage import quantized_parameters
from mase_lite.passes.registry import PassError, PassParams, PassResult, register_pass
from mase_lite.passes.replay import load_graph
from mase_lite.workloads.tokenizer import load_tokenizer, same_vocabulary
from mase_lite.infra.trust import trusted, trusting

logger = logging.getLogger(__name__)

TOKENIZER_DIR = "tokenizer"


class SaveParams(PassParams):
    path: str = Field("checkpoint", min_length=1, description="checkpoint directory, relative to the run")
    tokenizer: bool = Field(True, description="save the data's tokenizer in <path>/tokenizer")
    weights: Literal["codes", "float"] = Field(
        "codes", description="codes: each quantized weight and bias as its codes and scales (the format's bits); "
        "float: their float values, which training on needs"
    )


class LoadParams(PassParams):
    path: str = Field(min_length=1, description="checkpoint directory: relative to the run, else to the working directory")
    tokenizer: bool = Field(True, description="re-tokenize the run's data with the checkpoint's tokenizer when it differs")
    trust_code: bool = Field(
        False, description="import and call the model factory and classes the checkpoint names even when not registered, "
        "and its tokenizer's custom code (ignored in a spec recorded in a report)"
    )


def _check_replaceable(target: Path) -> None:
    """Only a checkpoint, an empty directory or nothing may stand where a checkpoint goes.

    A save killed mid-replace is recovered first, so it never makes this save refuse."""
    recover(target)
    if target.is_symlink():
        raise PassError(f"{target} is a symbolic link; a checkpoint is replaced whole, so name the directory itself", location=("path",))
    if target.exists() and not (target / RECIPE).is_file() and (not target.is_dir() or any(target.iterdir())):
        raise PassError(f"{target} exists and is not a checkpoint; refusing to replace it")


@register_pass("save", kind="analysis", params=SaveParams, needs_graph=False)
def save_pass(mg, params: SaveParams, ctx):
    """Save weights, recipe and tokenizer to a checkpoint directory (whole or not at all)."""
    target = ctx.path(params.path)
    _check_replaceable(target)
    ensure_dir(target.parent, "path")
    with staged_directory(target) as staging:
        mg.save(staging, weights=params.weights)
        tokenizer = getattr(ctx.data, "tokenizer", None) if params.tokenizer else None
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging / TOKENIZER_DIR))
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    size = sum((target / f).stat().st_size for f in files)
    stored = sorted(read_recipe(target).stored)
    kept = sorted(set(quantized_parameters(mg.model)) - set(stored))
    logger.info("saved a checkpoint to %s (%d bytes, %d parameters as codes)", target, size, len(stored))
    if kept and params.weights == "codes":
        logger.info("quantized parameters kept as float (tied, pruned or without codes): %s", ", ".join(kept[:10]))
    return PassResult({"path": str(target), "files": files, "bytes": size, "codes": len(stored), "kept_float": kept})


def _find_checkpoint(ctx, path: str) -> Path:
    """``path`` under the run directory if it is there, else as given (relative to the working directory);
    a checkpoint a crash left mid-replace is recovered first."""
    candidates = [Path(ctx.output_dir) / path if ctx.output_dir is not None else Path(path), Path(path)]
    for candidate in candidates:
        recover(candidate)
        if (candidate / RECIPE).is_file():
            return candidate
    looked = " and ".join(dict.fromkeys(str(c) for c in candidates))
    raise PassError(f"no checkpoint at {path!r} (looked for {RECIPE} in {looked})")


def _check_against_data(model, data, where: Path) -> None:
    """The loaded model accepts the run's token ids and has a logit for every label."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and getattr(data, "tokenizer", None) is not None and data.vocab_size > vocab:
        raise PassError(
            f"the checkpoint {where} has vocab_size {vocab} but the run's tokenizer has "
            f"{data.vocab_size} tokens; save the checkpoint with its tokenizer or set data.tokenizer"
        )
    labels = getattr(config, "num_labels", None)
    wanted = getattr(data, "num_labels", None)
    if labels is not None and wanted is not None and wanted > labels:
        raise PassError(
            f"the checkpoint {where} classifies {labels} labels but the run's data has {wanted}"
        )


@register_pass("load", kind="transform", params=LoadParams, replay=False, needs_graph=False)
def load_pass(mg, params: LoadParams, ctx):
    """Replace the graph by a checkpoint's (rebuilt from its recipe); the run's data is re-tokenized if needed."""
    where = _find_checkpoint(ctx, params.path)
    try:
        loaded = load_graph(where, trust_code=params.trust_code)
    except UserError as err:
        raise PassError(f"checkpoint {where}: {err}") from None
    data = ctx.data
    tokenizer_dir = where / TOKENIZER_DIR
    if getattr(data, "tokenizer", None) is not None and params.tokenizer and tokenizer_dir.is_dir():
        with trusting(trusted() or params.trust_code):  # a tokenizer's custom code, as the model's
            saved = load_tokenizer(tokenizer_dir, field="path")
        if not same_vocabulary(saved, data.tokenizer):
            logger.info("re-tokenizing the run's data with the tokenizer of %s", where)
            data = data.with_tokenizer(saved)
    if data is not None:
        _check_against_data(loaded.source_model, data, where)
    retokenized = data is not ctx.data
    ctx.data = data
    return PassResult({"path": str(where), "retokenized": retokenized}, graph=loaded)
