"""Models, data, training and evaluation: what a pipeline's ``model`` and ``data`` sections build,
and what the ``train``/``evaluate`` passes run.

Example::

    from mase_lite.workloads import prepare, fit, evaluate_model
    model, data = prepare({}, {}, Path("runs/x"), seed=0)     # bert-tiny shape, synthetic sentiment
    fit(model, data, epochs=1)
    evaluate_model(model, data)["accuracy"]
"""

from mase_lite.workloads import builtin_tasks  # noqa: F401, I001  (registers the built-in tasks; then the datasets, which name them)
from mase_lite.workloads import builtin_datasets  # noqa: F401
from mase_lite.workloads.data import BatchLoader, DataModule, DataSpec, build_data
from mase_lite.workloads.evaluator import evaluate_model
from mase_lite.workloads.models import ModelSpec, build_model
from mase_lite.workloads.prepare import prepare
from mase_lite.workloads.seeding import seed_everything
from mase_lite.workloads.trainer import fit

__all__ = [
    "BatchLoader",
    "DataModule",
    "DataSpec",
    "ModelSpec",
    "build_data",
    "build_model",
    "evaluate_model",
    "fit",
    "prepare",
    "seed_everything",
]
