"""lm-evaluation-harness tasks on the tool's model, through lm-eval's own Python API.

lm-eval's ``HFLM`` does the requests (loglikelihood, rolling loglikelihood, generate_until; batched, sorted, its logits
cache); its forward is the run's model (:class:`ToolLM`): a captured graph, fake-quantized or packed modules compute
the logits exactly as in evaluation, and ``generate_until`` runs the model's own modules through transformers'
``generate``. The tokenizer is the run's (a copy: lm-eval gives it a padding token). Tasks are lm-eval's own or those
of a folder of task YAML files (``task_dir``: lm-eval's ``include_path``, e.g. a ``dataset_path: json`` task on local
files). A task file that names Python code (``!function``) is not imported unless the user trusts the file's code.

Example::

    lm = tool_lm(model, causal_logits(model, ["input_ids"]), tokenizer, batch_size=16)
    scores, about = run_tasks(lm, ["arc_easy"], task_manager(None, ["arc_easy"]), limit=200)
    scores["arc_easy"]["acc"], about["arc_easy"]["documents"]
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import yaml

from mase_lite.infra.errors import UserError
from mase_lite.infra.progress import loggers_at
from mase_lite.infra.trust import TRUST_HINT, trusted

EXTRA = "pip install 'mase-lite[eval]'"
CODE_TAG = "!function"


def harness():
    """lm-eval's ``(simple_evaluate, HFLM, TaskManager)``; a clear error naming the extra when it is not installed."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise UserError(f"the lm_eval step needs lm-evaluation-harness ({err.name} is missing): {EXTRA}") from None
    return simple_evaluate, HFLM, TaskManager


def tool_lm(model: torch.nn.Module, logits: Callable[[torch.Tensor], torch.Tensor], tokenizer, batch_size: int):
    """An lm-eval ``HFLM`` whose forward is ``logits`` (token ids ``[batch, length]`` -> ``[batch, length, vocab]``)
    and whose ``generate`` is ``model``'s (a transformers causal LM sharing ``logits``'s modules)."""
    _, HFLM, _ = harness()

    class ToolLM(HFLM):
        def _model_call(self, inps, attn_mask=None, labels=None):
            with torch.no_grad():
                return logits(inps)

    # lm_eval's warning that a model given as an instance makes some arguments moot, out of the way
    with loggers_at(logging.ERROR, "lm_eval"), _tied_as_is(model):
        return ToolLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size)


@contextlib.contextmanager
def _tied_as_is(model: torch.nn.Module):
    """``model.tie_weights`` does nothing: HFLM re-ties a model it is given, and the model's tied weights are tied
    already (re-tying would give a packed ``lm_head`` a float weight beside its codes)."""
    own = model.__dict__.get("tie_weights")
    model.tie_weights = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del model.tie_weights
        if own is not None:
            model.tie_weights = own


def _shown(path: Path, task_dir: Path) -> str:
    """``path`` relative to the task folder when it is inside it."""
    return str(path.relative_to(task_dir.resolve())) if path.is_relative_to(task_dir.resolve()) else str(path)


class _Tags(yaml.SafeLoader):
    """A YAML loader that reads any tag (``!function``) as nothing: to follow a task file's includes, not run it."""


_Tags.add_multi_constructor("!", lambda loader, suffix, node: None)


def refuse_code(task_dir: Path) -> None:
    """Refuse a task folder whose YAML (or a file it includes) names Python code (``!function``) unless the user
    trusts the file's code."""
    if trusted():
        return
    todo = sorted(p for pattern in ("*.yaml", "*.yml") for p in task_dir.rglob(pattern))
    seen: set[Path] = set()
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if CODE_TAG in line:
                raise UserError(f"{_shown(path, task_dir)}:{number} names Python code ({line.strip()}); it is not "
                                f"imported unless you {TRUST_HINT}", location=("task_dir",))
        try:
            includes = (yaml.load(text, _Tags) or {}).get("include") or []
        except (yaml.YAMLError, AttributeError):
            continue  # lm-eval names what it cannot read when it loads the task
        todo.extend(path.parent / name for name in ([includes] if isinstance(includes, str) else includes))


@functools.lru_cache(maxsize=4)
def _manager(task_dir: str | None, defaults: bool):
    _, _, TaskManager = harness()
    return TaskManager(include_path=task_dir, include_defaults=defaults)


def task_manager(task_dir: str | None, tasks: Sequence[str]):
    """lm-eval's ``TaskManager`` knowing ``task_dir``'s tasks (lm-eval's own too when a task is not in the folder:
    indexing those takes seconds); a missing folder or an unknown task (with the closest known ones) is a
    ``UserError`` located at ``task_dir`` or ``tasks.<i>``. Indexing reads the task files; it imports nothing."""
    folder = None if task_dir is None else Path(task_dir).expanduser().resolve()
    if folder is not None:
        if not folder.is_dir():
            raise UserError(f"{task_dir} is not a folder of lm-eval task YAML files", location=("task_dir",))
        manager = _manager(str(folder), False)
        if all(task in manager.all_tasks for task in tasks):
            return manager
    manager = _manager(None if folder is None else str(folder), True)
    for i, task in enumerate(tasks):
        if task not in manager.all_tasks:
            close = difflib.get_close_matches(task, manager.all_tasks, n=3)
            raise UserError(f"{task!r} is not an lm-eval task or group"
                            + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                            + ("" if task_dir is not None else "; give task_dir for a folder of your own tasks"),
                            location=("tasks", i))
    return manager


def metric_name(key: str) -> str | None:
    """lm-eval's result key ``"<metric>,<filter>"`` as this tool reports it: ``<metric>`` for the filter ``none``,
    ``<metric>:<filter>`` for another; ``None`` for what is not a metric (``alias``, ``samples``).

    >>> metric_name("acc,none"), metric_name("exact_match,strict-match"), metric_name("alias")
    ('acc', 'exact_match:strict-match', None)
    """
    metric, comma, filter_name = key.partition(",")
    if not comma:
        return None
    return metric if filter_name == "none" else f"{metric}:{filter_name}"


def run_tasks(lm, tasks: Sequence[str], manager, limit: int | None = None, num_fewshot: int | None = None,
              seed: int = 0, bootstrap_iters: int = 1000, chat: bool = False) -> tuple[dict, dict]:
    """``lm`` on ``tasks`` (groups add their own entry), seeded with ``seed``: ``{task: {metric: value}}`` and
    ``{task: {"documents", "num_fewshot", "higher_is_better"}}``."""
    simple_evaluate, _, _ = harness()
    with loggers_at(logging.ERROR, "lm_eval"):
        out = simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                              task_manager=manager, bootstrap_iters=bootstrap_iters, apply_chat_template=chat,
                              log_samples=False, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                              fewshot_random_seed=seed)
    scores = {task: {name: float(value) for key, value in results.items()
                     if (name := metric_name(key)) is not None and isinstance(value, (int, float))}
              for task, results in out["results"].items()}
    about = {task: {"documents": out["n-samples"].get(task, {}).get("effective"),
                    "num_fewshot": out["n-shot"].get(task), "higher_is_better": out["higher_is_better"].get(task)}
             for task in scores}
    return scores, about
