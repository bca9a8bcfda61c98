"""The ``lm_eval`` pass: lm-evaluation-harness tasks (HellaSwag, ARC, PIQA, WinoGrande, MMLU, wikitext, or a folder
of your own task YAML files) on the run's causal LM and tokenizer, through lm-eval's own Python API.

The model is the run's as it stands: float, fake-quantized or packed, a captured graph or modules (see
:mod:`mase_lite.workloads.lm_harness`). Each task's metrics land in the run's report as ``<label>.<task>.<metric>``
(``lm_eval.arc_easy.acc``, ``lm_eval.arc_easy.acc_stderr``; a filter other than lm-eval's ``none`` as
``<metric>:<filter>``), usable as a search's objectives. lm-eval comes with the extra ``eval``
(``pip install 'mase-lite[eval]'``).

Example::

    {"pass": "lm_eval", "params": {"tasks": ["hellaswag", "arc_easy"], "limit": 200, "num_fewshot": 0}}
    {"pass": "lm_eval", "params": {"tasks": ["my_task"], "task_dir": "tasks/"}}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from mase_lite.infra.errors import UserError
from mase_lite.passes.registry import PassError, PassParams, PassResult, Seed, register_pass
from mase_lite.workloads.batches import causal_logits, logit_inputs
from mase_lite.workloads.evaluator import evaluating
from mase_lite.workloads.lm_harness import refuse_code, run_tasks, task_manager, tool_lm


class LmEvalParams(PassParams):
    task_dir: str | None = Field(None, min_length=1, description="a folder of lm-eval task YAML files (its "
                                                                 "include_path), e.g. tasks on local JSON files")
    tasks: list[str] = Field(min_length=1, description="lm-eval task or group names")
    limit: int | None = Field(None, ge=1, description="documents per task at most (all: null)")
    num_fewshot: int | None = Field(None, ge=0, description="examples in each prompt (the task's own: null)")
    batch_size: int = Field(16, ge=1, description="requests per forward pass")
    chat: bool = Field(False, description="apply the tokenizer's chat template to each prompt")
    bootstrap_iters: int = Field(1000, ge=0, description="bootstrap resamples of the stderr of non-mean metrics "
                                                          "(perplexities); 0: none")
    seed: Seed = Field(0, description="seed of the few-shot sampling and of the bootstrap")
    label: str = Field("lm_eval", min_length=1, description="name of the metrics in the run's report")

    @field_validator("task_dir")
    @classmethod
    def _folder(cls, task_dir: str | None) -> str | None:
        if task_dir is not None and not Path(task_dir).expanduser().is_dir():
            raise ValueError(f"{task_dir} is not a folder of lm-eval task YAML files")
        return task_dir

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: list[str], info: ValidationInfo) -> list[str]:
        """Tasks lm-eval knows: a spec's mistake found before its run (the index is read once a process)."""
        if "task_dir" in info.data:  # else the folder was refused
            try:
                task_manager(info.data["task_dir"], tasks)
            except UserError as err:
                raise ValueError(err.message) from None
        return tasks


def metric_names(params: LmEvalParams, task: str) -> list[str]:
    """Every metric of each task (which ones, lm-eval knows once it loads the task)."""
    return [f"{name}.*" for name in params.tasks]


@register_pass("lm_eval", kind="analysis", params=LmEvalParams, requires=("data",), metrics=metric_names,
               needs_graph=False)
def lm_eval_pass(mg, params: LmEvalParams, ctx):
    """lm-evaluation-harness tasks on the run's causal LM; each task's metrics as ``<task>.<metric>``."""
    tokenizer = getattr(ctx.data, "tokenizer", None)
    model = getattr(mg, "source_model", mg.model)
    if tokenizer is None or ctx.data.task != "causal-lm" or not hasattr(model, "generate"):
        raise PassError("lm_eval scores a causal language model with the run's tokenizer; this run's task is "
                        f"{ctx.data.task} ({type(model).__name__})")
    if params.chat and not getattr(tokenizer, "chat_template", None):
        raise PassError("the run's tokenizer has no chat template", location=("chat",))
    if params.task_dir is not None:
        try:
            refuse_code(Path(params.task_dir).expanduser())
        except UserError as err:
            raise PassError(err.message, location=err.location) from None
    manager = task_manager(params.task_dir, params.tasks)
    with evaluating(mg.model), evaluating(model):
        lm = tool_lm(model, causal_logits(mg.model, logit_inputs(mg, ctx.data)), tokenizer, params.batch_size)
        scores, about = run_tasks(lm, params.tasks, manager, params.limit, params.num_fewshot, params.seed,
                                  params.bootstrap_iters, params.chat)
    return PassResult({"tasks": about}, metrics=scores, label=params.label)
