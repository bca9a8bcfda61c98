"""Fine-tuning a model on a :class:`DataModule`: AdamW, transformers' warm-up/decay schedules, clipping, freezing.

Example::

    info = fit(mg.model, data, input_names=mg.input_names, epochs=1, lr=1e-3, freeze=["bert.embeddings.*"])
    info["loss"], info["steps"], info["seconds"]
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Literal

import torch
import torch.nn as nn
from tqdm import tqdm
from transformers import get_scheduler

from mase_lite.infra.errors import UserError
from mase_lite.infra.limits import check_fits
from mase_lite.workloads.batches import forward_batch, model_device
from mase_lite.infra.progress import Ticker, bars_disabled

logger = logging.getLogger(__name__)

Schedule = Literal["linear", "cosine", "constant"]
Precision = Literal["auto", "off", "bf16", "fp16"]


# transformers' scheduler names: each warms up linearly from 0 over the warm-up steps, then decays
# linearly or along a half cosine to 0 at the last step, or stays constant.
_HF_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def split_trainable(model: nn.Module, freeze: Sequence[str]) -> tuple[dict[str, nn.Parameter], list[nn.Parameter]]:
    """``(trainable by name, frozen)``: parameters needing gradients minus those whose name fully
    matches a ``freeze`` regex. Every pattern must match something."""
    compiled = []
    for pattern in freeze:
        try:
            compiled.append(re.compile(pattern))
        except re.error as err:
            raise UserError(f"{pattern!r} is not a valid regex ({err})", location=("freeze",)) from None
    named = dict(model.named_parameters())
    for pattern, rx in zip(freeze, compiled):
        if not any(rx.fullmatch(name) for name in named):
            shown = ", ".join(list(named)[:8])
            raise UserError(f"{pattern!r} matches no parameter name (names look like: {shown}, ...)", location=("freeze",))
    trainable, frozen = {}, []
    for name, p in named.items():
        if p.requires_grad and not any(rx.fullmatch(name) for rx in compiled):
            trainable[name] = p
        elif p.requires_grad:
            frozen.append(p)
    if not trainable:
        raise UserError("no trainable parameters: every parameter is frozen or has requires_grad=False")
    return trainable, frozen


def _precision(requested: Precision, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``requested`` on ``device``; None means full precision."""
    if requested == "off":
        return None
    if device.type != "cuda":
        if requested == "auto":
            return None
        raise UserError(f"mixed_precision = {requested!r} needs a CUDA model; the model is on {device}")
    if requested == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if requested == "bf16" else torch.float16


def _check_state_fits(trainable: dict[str, nn.Parameter]) -> None:
    """Room, besides the model, for what training adds to each trainable parameter: its gradient and AdamW's two
    moments (a ``UserError`` naming ``freeze``, which leaves parameters out of them)."""
    count = sum(p.numel() for p in trainable.values())
    check_fits("freeze", 3 * sum(p.numel() * p.element_size() for p in trainable.values()),
               f"training {count} parameters (a gradient and AdamW's two moments for each)")


class _Optimiser:
    """AdamW with a warm-up/decay schedule, gradient clipping and (fp16) loss scaling: one ``step(loss)``."""

    def __init__(self, trainable: dict[str, nn.Parameter], lr: float, weight_decay: float, total: int,
                 warmup: int, schedule: Schedule, grad_clip: float | None, amp_dtype: torch.dtype | None):
        decay = [p for p in trainable.values() if p.ndim > 1]
        no_decay = [p for p in trainable.values() if p.ndim <= 1]
        self.params = list(trainable.values())
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
        )
        self.scheduler = get_scheduler(
            _HF_SCHEDULES[schedule], self.optimizer, num_warmup_steps=warmup, num_training_steps=total
        )
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        self.grad_clip = grad_clip

    def step(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def fit(
    model: nn.Module,
    data,
    *,
    input_names: Sequence[str] | None = None,
    epochs: int = 1,
    max_steps: int | None = None,
    lr: float = 1e-3,
    batch_size: int = 16,
    weight_decay: float = 0.01,
    warmup_fraction: float = 0.1,
    schedule: Schedule = "linear",
    grad_clip: float | None = 1.0,
    freeze: Sequence[str] = (),
    mixed_precision: Precision = "auto",
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Train ``model`` on ``data``'s train split where the model lives; returns loss, steps, seconds.

    Epoch ``e`` visits the rows in the order of ``torch.Generator`` seed ``seed + e``; dropout
    draws from torch's generator seeded with ``seed`` inside the run (the global state is restored
    afterwards), so a run does not depend on what ran before it. Only trainable, unfrozen
    parameters are optimised; frozen ones get no gradient during the run and their
    ``requires_grad`` is restored afterwards, as is the model's train/eval mode.
    """
    input_names = list(input_names or data.input_names)
    device = model_device(model)
    amp_dtype = _precision(mixed_precision, device)
    trainable, frozen = split_trainable(model, freeze)
    if device.type == "cpu":  # the memory check_fits knows
        _check_state_fits(trainable)
    steps_per_epoch = len(data.loader("train", batch_size))
    total = min(max_steps, epochs * steps_per_epoch) if max_steps else epochs * steps_per_epoch
    optimiser = _Optimiser(trainable, lr, weight_decay, total, round(warmup_fraction * total), schedule, grad_clip, amp_dtype)
    autocast = (lambda: torch.autocast("cuda", dtype=amp_dtype)) if amp_dtype is not None else nullcontext

    was_training = model.training
    for p in frozen:
        p.requires_grad_(False)
    model.train()
    losses: list[float] = []
    steps, samples, running = 0, 0, None
    start = time.perf_counter()
    bar = tqdm(total=total, desc="train", unit="step", disable=bars_disabled() if progress else True)
    ticker = Ticker("train", total, "step")
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            batches = (
                (epoch, batch)
                for epoch in range(epochs)
                for batch in data.loader("train", batch_size, shuffle=True, seed=seed + epoch)
            )
            for step, (epoch, batch) in zip(range(total), batches):
                if step % steps_per_epoch == 0:
                    losses = []
                with autocast():
                    loss, _ = forward_batch(model, batch, input_names, data.task)
                value = loss.item()
                if not math.isfinite(value):
                    raise UserError(f"training diverged: the loss is {value} at step {step}; lower lr (now {lr})")
                optimiser.step(loss)
                steps += 1
                samples += len(batch["labels"])
                losses.append(value)
                running = value if running is None else 0.9 * running + 0.1 * value
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{running:.4f}")
                if progress:
                    ticker.tick(epoch=epoch, loss=f"{running:.4f}")
    finally:
        bar.close()
        for p in frozen:
            p.requires_grad_(True)
        model.train(was_training)
    seconds = time.perf_counter() - start
    logger.info("trained %d steps in %.2f s, last-epoch loss %.4f", steps, seconds, sum(losses) / max(1, len(losses)))
    return {
        "loss": sum(losses) / len(losses) if losses else float("nan"),
        "last_step_loss": losses[-1] if losses else float("nan"),
        "steps": steps,
        "epochs": epochs,
        "samples": samples,
        "seconds": seconds,
        "samples_per_second": samples / seconds if seconds > 0 else float("nan"),
        "trainable_parameters": sum(p.numel() for p in trainable.values()),
        "frozen_parameters": sum(p.numel() for p in frozen),
        "mixed_precision": {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp_dtype],
    }
