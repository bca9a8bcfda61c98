"""The ``evaluate`` pass: accuracy, loss and per-class counts of the graph on a split of the run's data.

Its metrics land in the run's report under ``metrics[label]``. A causal language model's perplexity takes one of three
protocols: ``windows`` (the data's own windows, every token after a window's first scored), ``sliding`` (transformers'
strided windows: ``context`` tokens every ``stride``) or ``chunks`` (llama.cpp's ``llama-perplexity``: chunks of
``context`` tokens, their second half scored, the first token the beginning-of-text one with ``bos``); see
:mod:`mase_lite.workloads.perplexity`. A paper quoting transformers' guide uses ``sliding``; a llama.cpp figure ``chunks``
with its ``-c`` as ``context``.

Example::

    mg, info = ml.passes.evaluate(mg, {"split": "test", "label": "ptq-int8"})
    info["metrics"]["accuracy"]
    mg, info = ml.passes.evaluate(mg, {"protocol": "chunks", "context": 512, "bos": True})
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mase_lite.infra.errors import UserError
from mase_lite.passes.registry import PassParams, PassResult, register_pass
from mase_lite.workloads.batches import logit_inputs
from mase_lite.workloads.evaluator import evaluate_model, stream_perplexity
from mase_lite.workloads.language import token_stream
from mase_lite.workloads.tasks import get_task


class EvaluateParams(PassParams):
    split: Literal["train", "test"] = Field("test", description="data split to evaluate on")
    batch_size: int = Field(64, ge=1, description="rows per forward pass")
    label: str = Field("evaluate", min_length=1, description="name of these metrics in the run's report")
    progress: bool = Field(True, description="show a progress bar")
    protocol: Literal["windows", "sliding", "chunks"] = Field(
        "windows", description="causal LMs: the data's windows, transformers' strided windows, or llama.cpp's chunks")
    context: int | None = Field(None, ge=2, description="sliding and chunks: tokens a window or chunk holds")
    stride: int | None = Field(None, ge=1, description="sliding: tokens between the starts of windows")
    bos: bool = Field(False, description="chunks: each chunk starts with the beginning-of-text token (llama.cpp "
                                         "does for models whose vocabulary adds one)")

    @model_validator(mode="after")
    def _protocol_fields(self):
        if self.protocol == "windows" and (self.context, self.stride, self.bos) != (None, None, False):
            raise ValueError("context, stride and bos belong to the sliding and chunks protocols")
        if self.protocol != "windows" and self.context is None:
            raise ValueError(f"context: the {self.protocol} protocol needs the tokens a window holds")
        if self.protocol == "sliding" and (self.stride is None or self.stride > self.context):
            raise ValueError(f"stride: the sliding protocol needs one of at most context ({self.context})")
        if self.protocol == "chunks" and (self.context < 4 or self.context % 2 or self.stride is not None):
            raise ValueError("context: the chunks protocol needs an even context of at least 4 (and no stride)")
        return self


def metric_names(params: EvaluateParams, task: str) -> list[str]:
    """The metrics evaluation reports for a model of ``task`` (its registry entry's, the numbers of its meter)."""
    if params.protocol != "windows":
        return ["loss", "perplexity", "tokens"]
    return list(get_task(task).metrics)


@register_pass("evaluate", kind="analysis", params=EvaluateParams, requires=("data",), metrics=metric_names,
               needs_graph=False)
def evaluate_pass(mg, params: EvaluateParams, ctx):
    """Accuracy, mean cross-entropy, per-class counts and the confusion matrix on a data split; a causal language
    model's perplexity by a protocol."""
    if params.protocol != "windows":
        return PassResult({}, metrics=_protocol_metrics(mg, params, ctx.data), label=params.label)
    metrics = evaluate_model(
        mg.model,
        ctx.data,
        split=params.split,
        batch_size=params.batch_size,
        input_names=mg.input_names,
        progress=params.progress,
    )
    return PassResult({}, metrics=metrics, label=params.label)


def _protocol_metrics(mg, params: EvaluateParams, data) -> dict:
    if data.task != "causal-lm":
        raise UserError(f"evaluate.protocol: {params.protocol!r} scores a causal language model's tokens; this run's "
                        f"task is {data.task}")
    stream = token_stream(data.tokenizer, data.documents[params.split])
    bos = data.tokenizer.bos_token_id if params.bos else None
    if params.bos and bos is None:
        raise UserError("evaluate.bos: the run's tokenizer has no beginning-of-text token")
    try:
        metrics = stream_perplexity(mg.model, stream, logit_inputs(mg, data), params.protocol, params.context,
                                    params.stride, bos, params.batch_size)
    except ValueError as err:
        raise UserError(f"evaluate.context: {err} (the {params.split} split has {stream.numel()} tokens)") from err
    return {**metrics, "protocol": params.protocol, "split": params.split}
