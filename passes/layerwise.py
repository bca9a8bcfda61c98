"""Layer-wise calibration: statistics of chosen layers' inputs collected one repeated block at a time.

GPTQ, SparseGPT and Wanda change a layer's weight from the layer's inputs on calibration data. When the
model repeats blocks (a transformer's decoder layers), the inputs of the first block are captured once and
the blocks are processed in order: ``handle`` sees a block's selected layers and a function that runs the
block on its inputs (to collect statistics through hooks), changes the layers, and the block runs again to
give the next block its inputs, now from the changed model. A pass that needs only the first inputs'
statistics raises :class:`Enough` from a hook: the run stops there, and this block and the ones after it run on
those inputs only. Peak memory is the model plus one block's statistics and the calibration activations.
Selected layers outside the blocks (an output head) are handled last, over whole-model runs.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from mase_lite.ir.capture import caches_off
from mase_lite.infra.heap import return_free_memory
from mase_lite.runtime.disk_weights import streamed
from mase_lite.layers.quantized import quantized_once
from mase_lite.numerics.codes import encode
from mase_lite.numerics.native.threads import spare_threads
from mase_lite.passes.registry import PassError
from mase_lite.workloads.batches import model_inputs


class _Stop(Exception):
    """Raised by the hook that captures the first block's inputs: the rest of the model need not run."""


class Enough(Exception):
    """Raised by a hook of ``handle``'s run once its statistics are complete: the run stops, and this block and
    the ones after it run on the inputs it got to only (a pass that judges on its first rows forwards no more)."""


class InputStatistics:
    """Forward pre-hooks accumulating, per layer, ``2 X Xᵀ / n`` of its (quantized) input ``X`` (``[rows, in]``),
    or only its diagonal ``2 Σ x² / n`` with ``diagonal``. Layers that have seen the same sequence of inputs
    (``history``: a block's query, key and value projections) hold one accumulator: one GEMM per input and
    batch, bit-identical sums, and no copies. An accumulator held by one layer is updated in place
    (``beta·H + alpha·XᵀX`` in the GEMM itself); one held by several is updated into a new tensor by the first
    of them to see the input, which the others then take."""

    def __init__(self, layers: dict[str, nn.Module], dtype: torch.dtype, diagonal: bool = False):
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.history: dict[str, list[int]] = {name: [] for name in layers}
        self.dtype = dtype
        self.diagonal = diagonal
        self._last: tuple | None = None  # (input, input format, serial, rows, operand) of the latest input
        self._serial = 0
        self._updated: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # this input's: id(old) -> (old, new)
        self.handles = [layer.register_forward_pre_hook(self._hook(name)) for name, layer in layers.items()]

    def _input(self, layer: nn.Module, x: torch.Tensor) -> tuple[int, int, torch.Tensor]:
        """``(serial, rows, operand)`` of the layer's input: the ``[rows, in]`` matrix (its squares summed over
        rows with ``diagonal``), computed once for the layers called on the same tensor."""
        quantizer = getattr(layer, "data_in_quantizer", None)
        key = None if quantizer is None else quantizer.spec.as_dict()
        last = self._last
        if last is not None and last[0] is x and last[1] == key:
            return last[2:]
        original = x
        if quantizer is not None:
            x = quantizer(x)
        x = x.detach().reshape(-1, x.shape[-1]).to(self.dtype)
        self._serial += 1
        self._updated = {}  # the old accumulators it kept alive (so no id is reused) are released
        self._last = (original, key, self._serial, x.shape[0], x.square().sum(0) if self.diagonal else x)
        return self._last[2:]

    def _held_elsewhere(self, name: str, h: torch.Tensor) -> bool:
        return any(other is h for held, other in self.sums.items() if held != name)

    def _hook(self, name: str):
        def hook(layer: nn.Module, args: tuple) -> None:
            serial, rows, x = self._input(layer, args[0])
            n = self.counts.get(name, 0)
            total = n + rows
            h = self.sums.get(name)
            done = self._updated.get(id(h))
            if done is not None and done[0] is h and self.history[name][-1:] != [serial]:  # another layer with
                # this history has added this input (a layer called twice on one tensor adds it twice)
                self.sums[name] = done[1]
            elif self.diagonal:
                new = x.mul(2 / total) if h is None else torch.add(h.mul(n / total), x, alpha=2 / total)
                self._updated[id(h)] = (h, new)
                self.sums[name] = new
            elif h is not None and not self._held_elsewhere(name, h):  # in place: a 5632-wide Hessian is 127 MB
                h.addmm_(x.t(), x, beta=n / total, alpha=2 / total)
                self._updated[id(h)] = (h, h)
            else:
                new = torch.mm(x.t(), x).mul_(2 / total) if h is None else torch.addmm(h, x.t(), x, beta=n / total,
                                                                                       alpha=2 / total)
                self._updated[id(h)] = (h, new)
                self.sums[name] = new
            self.counts[name] = total
            self.history[name].append(serial)

        return hook

    def remove(self) -> None:
        self._last = None
        self._updated = {}
        for handle in self.handles:
            handle.remove()


def collect(layers: dict[str, nn.Module], run: Callable[[], object], dtype: torch.dtype, diagonal: bool = False,
            who: str = "the pass") -> InputStatistics:
    """The layers' input statistics over ``run()``; a layer ``run`` never called is a PassError naming it."""
    statistics = InputStatistics(layers, dtype, diagonal)
    try:
        run()
    finally:
        statistics.remove()
    for name in layers:
        if name not in statistics.sums:
            raise PassError(f"{who}: layer {name!r} was not called on the calibration data; select only layers the model runs")
    return statistics


def blocks(model: nn.Module, layers: dict[str, nn.Module]) -> tuple[str, nn.ModuleList] | None:
    """The ``ModuleList`` of repeated blocks holding the most selected layers (a transformer's layers)."""
    best, count = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            inside = sum(layer.startswith(f"{name}.") for layer in layers) if name else 0
            if inside > count:
                best, count = (name, module), inside
    return best


def _first_block_inputs(model: nn.Module, block: nn.Module, batches: list[dict]) -> list[tuple[tuple, dict]]:
    captured = []

    def hook(module, args, kwargs):
        captured.append((args, kwargs))
        raise _Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in batches:
            try:
                model(**batch)
            except _Stop:
                pass
    finally:
        handle.remove()
    return captured


def _run_block(block: nn.Module, inputs: list[tuple[tuple, dict]], nxt: list | None = None) -> list[tuple[tuple, dict]]:
    """The block on each input, and the next block's inputs (its output in place of the hidden states), appended
    to ``nxt``. Each weight is quantized once for all the inputs (the values are dropped after: they are as large
    as the weights)."""
    nxt = [] if nxt is None else nxt
    with quantized_once(block):
        for args, kwargs in inputs:
            out = block(*args, **kwargs)
            hidden = out[0] if isinstance(out, (tuple, list)) else out
            if args:
                nxt.append(((hidden, *args[1:]), kwargs))
            else:
                nxt.append(((), {**kwargs, "hidden_states": hidden}))
    return nxt


def each_block(model: nn.Module, layers: dict[str, nn.Module], batches: list[dict],
               handle: Callable[[dict[str, nn.Module], Callable[[], object]], None], log: Callable[[int, int], None] | None = None) -> None:
    """Call ``handle(block_layers, run)`` for the selected layers of each repeated block in order, then for those
    outside the blocks (``run`` runs the whole model on ``batches``), in evaluation mode without gradients or
    key/value caches. A model streamed from disk (:mod:`mase_lite.runtime.disk_weights`) has one block resident at a
    time, written back after ``handle``; its layers outside the blocks cannot be handled (they need whole-model
    runs)."""
    disk = streamed(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), caches_off(model):
            found = blocks(model, layers)
            rest = dict(layers)
            if found is not None:
                prefix, repeated = found
                if disk is not None:
                    _check_streamable(layers, prefix)
                with disk.on_call(skip=prefix) if disk is not None else nullcontext():
                    inputs = _first_block_inputs(model, repeated[0], batches)
                for i, block in enumerate(repeated):
                    inside = {n: m for n, m in layers.items() if n.startswith(f"{prefix}.{i}.")}
                    rest = {n: m for n, m in rest.items() if n not in inside}
                    # torch's ops on the cores other processes leave, looked at again each block: on a busy machine a
                    # thread waiting at a join for a preempted one spins, and two threads cost more CPU than one
                    with (disk.resident(f"{prefix}.{i}", write=bool(inside)) if disk is not None else nullcontext(),
                          spare_threads()):
                        if inside:
                            inputs = _handled(handle, inside, block, inputs)
                        inputs = _run_block(block, inputs)
                    return_free_memory()  # the block's Hessians, sweeps and activations: else the heap grows block by block
                    if log is not None:
                        log(i + 1, len(repeated))
            elif disk is not None:
                raise PassError("model.stream: the model has no repeated blocks (a ModuleList of layers) to load one at a time")
            if rest:
                with spare_threads():
                    handle(rest, lambda: _run_model(model, batches))
    finally:
        model.train(was_training)


def _run_model(model: nn.Module, batches: list[dict]) -> None:
    """The whole model on each batch, until a hook raises :class:`Enough`."""
    try:
        for batch in batches:
            model(**batch)
    except Enough:
        pass


def _handled(handle: Callable, inside: dict[str, nn.Module], block: nn.Module, inputs: list) -> list:
    """``handle(inside, run)`` with ``run`` running ``block`` on ``inputs``; the inputs it got to where a hook raised
    :class:`Enough`, else all of them."""
    kept = list(inputs)

    def run() -> None:
        done: list = []
        try:
            _run_block(block, kept, done)
        except Enough:
            del kept[len(done) + 1:]

    handle(inside, run)
    return kept


def _check_streamable(layers: dict[str, nn.Module], prefix: str) -> None:
    outside = [name for name in layers if not name.startswith(f"{prefix}.")]
    if outside:
        raise PassError(f"model.stream: layer {outside[0]!r} is outside the repeated blocks ({prefix}), and calibrating it "
                        "needs the whole model in memory; leave it out (quantize's rules, or this pass's targets)")


def calibration_batches(mg, data, split: str, batch_size: int, num_batches: int) -> list[dict]:
    """The first ``num_batches`` batches of ``split`` (in order), as the model's inputs on its device."""
    device = torch.device("cpu") if streamed(mg.source_model) else next(iter(mg.source_model.parameters()), torch.empty(0)).device
    loader = data.loader(split, batch_size, shuffle=False)
    return [model_inputs(b, mg.input_names, device) for _, b in zip(range(num_batches), loader)]


def weight_of(layer: nn.Module) -> torch.Tensor:
    """The weight as its format sees it, ``[out, in]`` (transformers' Conv1D keeps ``[in, out]``)."""
    stored = getattr(layer, "_stored_view", None)
    return (stored("weight", layer.weight) if stored is not None else layer.weight).detach()


def store_weight(layer: nn.Module, weight: torch.Tensor, side: dict[str, torch.Tensor] | None, fmt: dict | None) -> None:
    """Write ``weight`` (``[out, in]``) into the layer; where its format stores it as codes under the scales
    ``side`` (those a sweep fixed), the layer holds it (computes with exactly these values, and a checkpoint
    stores these scales)."""
    weight = weight.to(layer.weight.dtype)
    encoded = encode(weight, fmt, side, values=weight) if side is not None and fmt is not None else None
    if encoded is not None:
        layer.restore_parameter("weight", encoded, values=weight)  # encode checked that its codes decode to these
        return
    with torch.no_grad():
        weight_of(layer).copy_(weight)
