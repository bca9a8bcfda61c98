"""The ``train`` pass: fine-tune the graph's weights on the run's data (the structure is unchanged).

Example::

    mg, info = ml.passes.train(mg, {"epochs": 1, "lr": 1e-3, "freeze": ["bert.embeddings.*"]})
    info["loss"], info["steps"], info["seconds"]
"""

from __future__ import annotations

from pydantic import Field

from mase_lite.passes.registry import PassParams, PassResult, Seed, register_pass
from mase_lite.workloads.trainer import Precision, Schedule, fit


class TrainParams(PassParams):
    epochs: int = Field(1, ge=1, description="passes over the train split")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimiser steps")
    lr: float = Field(1e-3, gt=0, description="peak learning rate of AdamW")
    batch_size: int = Field(16, ge=1, description="rows per step")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (not applied to biases and norms)")
    warmup_fraction: float = Field(0.1, ge=0, le=1, description="share of the steps spent warming up linearly")
    schedule: Schedule = Field("linear", description="decay after warm-up: linear or cosine to 0, or constant")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the gradient norm to this (null: no clipping)")
    freeze: list[str] = Field(default_factory=list, description="regexes of parameter names to keep fixed")
    mixed_precision: Precision = Field("auto", description="autocast dtype on CUDA (auto: bf16 if supported, else fp16)")
    seed: Seed | None = Field(None, description="seed of the data order (default: the data's seed)")
    progress: bool = Field(True, description="show a progress bar with the running loss")


@register_pass("train", kind="transform", params=TrainParams, requires=("data",), replay=False,
               needs_graph=False)
def train_pass(mg, params: TrainParams, ctx):
    """Fine-tune the weights with AdamW, warm-up and decay, gradient clipping and freezing by name."""
    seed = params.seed if params.seed is not None else getattr(ctx.data, "seed", 0)
    info = fit(
        mg.model,
        ctx.data,
        input_names=mg.input_names,
        seed=seed,
        **params.model_dump(exclude={"seed"}),
    )
    return PassResult(info)
