"""The ``evaluate`` pass: accuracy, loss and per-class counts of the graph on a split of the run's data.

Its metrics land in the run's report under ``metrics[label]``.

Example::

    mg, info = ml.passes.evaluate(mg, {"split": "test", "label": "ptq-int8"})
    info["metrics"]["accuracy"]
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mase_lite.passes.registry import PassParams, PassResult, register_pass
from mase_lite.train.evaluator import evaluate_model
from mase_lite.train.tasks import get_task


class EvaluateParams(PassParams):
    split: Literal["train", "test"] = Field("test", description="data split to evaluate on")
    batch_size: int = Field(64, ge=1, description="rows per forward pass")
    label: str = Field("evaluate", min_length=1, description="name of these metrics in the run's report")
    progress: bool = Field(True, description="show a progress bar")


def metric_names(params: EvaluateParams, task: str) -> list[str]:
    """The metrics evaluation reports for a model of ``task`` (its registry entry's, the numbers of its meter)."""
    return list(get_task(task).metrics)


@register_pass("evaluate", kind="analysis", params=EvaluateParams, requires=("data",), metrics=metric_names,
               needs_graph=False)
def evaluate_pass(mg, params: EvaluateParams, ctx):
    """Accuracy, mean cross-entropy, per-class counts and the confusion matrix on a data split."""
    metrics = evaluate_model(
        mg.model,
        ctx.data,
        split=params.split,
        batch_size=params.batch_size,
        input_names=mg.input_names,
        progress=params.progress,
    )
    return PassResult({}, metrics=metrics, label=params.label)
