"""Name your own dataset for specs: ``register_dataset(name, loader)``, then ``"data": {"dataset": name}``; your
own task: ``register_task(Task(...))`` (its head, inputs, default model and dataset, data builder — one of
``classification_data``, ``language_data``, ``seq2seq_data``, ``image_data`` or your own — and metrics), then
``"model": {"task": name}``.

A loader takes the data section (a :class:`~mase_lite.workloads.data.DataSpec`) and the run's seed and
returns ``{"train": table, "test": table}``, where a table is a list of row dicts, a dict of columns
or a ``datasets.Dataset``, or one table of rows (a list or a ``datasets.Dataset``) that the run
divides by ``data.test_fraction``. Columns are named by the
data section (``text_column``, ``label_column``, ``image_column``, ``source_column``,
``target_column``). Register from a module named by ``--plugin`` or a spec's ``plugins``, or from an
installed package through the entry-point group ``mase_lite.datasets`` (the entry point is called
with no arguments). A search's prefix cache works with it unchanged.

Example::

    >>> def reviews(spec, seed):
    ...     rows = [{"text": "great", "label": 1}, {"text": "dull", "label": 0}] * 10
    ...     return {"train": rows[:16], "test": rows[16:]}
    >>> register_dataset("my-reviews", reviews, tasks=("sequence-classification",))
    >>> "my-reviews" in dataset_names("sequence-classification")
    True
"""

from mase_lite.workloads.data import classification_data, image_data, language_data, seq2seq_data
from mase_lite.workloads.datasets import RawData, dataset_names, register_dataset
from mase_lite.workloads.tasks import Task, get_task, register_task, task_names

__all__ = ["RawData", "Task", "classification_data", "dataset_names", "get_task", "image_data", "language_data",
           "register_dataset", "register_task", "seq2seq_data", "task_names"]
