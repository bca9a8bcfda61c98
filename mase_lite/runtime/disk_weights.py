"""Weights that stay on disk: a model built without its tensors (on the meta device), whose modules are made
resident one at a time from a safetensors directory and whose changed modules are written to the run's files.

A model larger than the free memory can so be quantized block by block (``"model": {"stream": true}``): memory
holds one decoder block, the modules that run before the first block while its inputs are computed, and what a
pass keeps. A module is *resident* inside :meth:`DiskWeights.resident`: its tensors are read from the directory
(memory-mapped; the latest version a pass wrote is read instead), in the dtype the model was built with; on
leaving, what changed is written to ``work_dir`` (quantized weights as their codes, :mod:`mase_lite.layers.storage`)
and the tensors go back to the meta device.

>>> import tempfile, safetensors.torch, torch.nn as nn
>>> source, work = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> safetensors.torch.save_file({"0.weight": torch.ones(2, 3), "0.bias": torch.zeros(2)}, f"{source}/model.safetensors")
>>> model = nn.Sequential(nn.Linear(3, 2, device="meta"))
>>> weights = DiskWeights(model, source, work)
>>> with weights.resident("0", write=True):
...     model[0].weight.add_(1).sum().item()
12.0
>>> model[0].weight.device.type, weights.peak_bytes
('meta', 32)
>>> with weights.resident("0"):
...     model[0].weight.sum().item()
12.0
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import safetensors
import safetensors.torch
import torch
import torch.nn as nn
from torch import Tensor

from mase_lite.infra.errors import UserError
from mase_lite.infra.faults import as_fault
from mase_lite.infra.files import check_inside, follow_umask, staged_file
from mase_lite.infra.heap import return_free_memory
from mase_lite.layers.quantized import OperandQuantizer
from mase_lite.layers.storage import flatten, restore_codes, stored_codes, unflatten

ATTRIBUTE = "mase_disk_weights"  # where a streamed model keeps its DiskWeights


class DiskWeights:
    """The tensors of ``model`` (built on the meta device) in the safetensors files of ``directory``, by the
    model's own tensor names (one name of a tied group is enough); modules a pass changed are written to
    ``work_dir``. ``peak_bytes``: the most bytes of tensors resident at once."""

    def __init__(self, model: nn.Module, directory: str | Path, work_dir: str | Path):
        self.model = model
        self.directory = Path(directory)
        self.work_dir = Path(work_dir)
        self.location: dict[str, tuple[Path, str]] = {}  # tensor name -> (file, key) of its latest version
        self.codes: dict[str, tuple[Path, dict]] = {}  # quantized parameter -> (file, manifest entry) of its codes
        self.resident_bytes = self.peak_bytes = 0
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise UserError(f"model.stream: {self.directory} holds no .safetensors file (streaming reads safetensors only)")
        for file in files:
            check_inside(file, self.directory, "model.pretrained")
            for name in _names_in(file):
                if name in self.location:
                    raise UserError(f"model.stream: tensor {name!r} is in both {self.location[name][0].name} and {file.name}")
                self.location[name] = (file, name)
        self.aliases: dict[str, list[str]] = {}  # each tensor name -> every name of its (tied) tensor
        groups: dict[int, list[str]] = {}
        for name, tensor in _tensors(model):
            groups.setdefault(id(tensor), []).append(name)
        for names in groups.values():
            for group in self._untie(names):
                for name in group:
                    self.aliases[name] = group
        missing = [n for n, t in _tensors(model) if t.is_meta and not any(a in self.location for a in self.aliases[n])]
        if missing:
            raise UserError(f"model.stream: {self.directory} has no tensor {missing[0]!r} (of {len(missing)} missing); "
                            "a streamed model's tensors are read by the model's own names")

    def _untie(self, names: list[str]) -> list[list[str]]:
        """A tied group as the directory has it: tied as the model ties it, unless it holds different values
        under two of its names (as transformers loads it then: untied)."""
        stored = [n for n in names if n in self.location]
        if len(stored) < 2:
            return [names]
        values = [_get_tensors(file, [key])[key] for file, key in (self.location[n] for n in stored)]
        if all(torch.equal(values[0], v) for v in values[1:]):
            return [names]
        for name in stored[1:]:  # its own parameter, on the meta device as the rest
            meta = _get(self.model, name)
            _assign(self.model, name, nn.Parameter(torch.empty_like(meta, device="meta"), requires_grad=meta.requires_grad))
        return [[n for n in names if n not in stored[1:]], *([n] for n in stored[1:])]

    def parts(self) -> list[tuple[str, str | None]]:
        """``(prefix, skip)`` of the parts a whole-model reader makes resident in turn: the model but its repeated
        blocks, then each block."""
        found = repeated_blocks(self.model)
        if found is None:
            return [("", None)]
        prefix, blocks = found
        return [("", prefix), *((f"{prefix}.{i}", None) for i in range(len(blocks)))]

    @contextmanager
    def resident(self, prefix: str, write: bool = False, skip: str | None = None) -> Iterator[nn.Module]:
        """The module at ``prefix`` ("" for the model) with its tensors in memory (but those under ``skip``, a
        submodule prefix); with ``write``, its tensors are written to ``work_dir`` on leaving (codes for the
        quantized weights that hold stored values), for later residencies to read."""
        module = self.model.get_submodule(prefix)
        loaded = self._load(module, prefix, skip)
        try:
            yield module
            if write:
                self._write(module, prefix, loaded)
        finally:
            self._release(module, loaded)

    @contextmanager
    def on_call(self, skip: str) -> Iterator[None]:
        """Within it, a module outside ``skip`` (a submodule prefix) whose own tensors are on disk is made
        resident when it is called (only the modules a run reaches: an embedding before the first block); all
        go back to the meta device on leaving."""
        loaded: list[tuple[nn.Module, list]] = []

        def make_resident(prefix: str):
            def hook(module, args):
                loaded.append((module, self._load(module, prefix, skip, recurse=False)))
            return hook

        handles = [module.register_forward_pre_hook(make_resident(name)) for name, module in self.model.named_modules()
                   if not _under(name, skip) and any(t.is_meta for _, t in _own_tensors(module))]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for module, tensors in loaded:
                self._release(module, tensors)

    def _load(self, module: nn.Module, prefix: str, skip: str | None, recurse: bool = True) -> list[tuple[str, Tensor]]:
        """Read the module's meta tensors; returns ``(name in module, meta tensor)`` of each, to put back."""
        done: dict[int, Tensor] = {}
        loaded, stored = [], {}
        for name, meta in (_tensors(module) if recurse else _own_tensors(module)):
            full = _join(prefix, name)
            if not meta.is_meta or _under(full, skip):
                continue
            if id(meta) not in done:
                if full in self.codes:
                    value = torch.empty(meta.shape, dtype=meta.dtype)
                    stored[name] = full
                else:
                    value = self._read(full, meta)
                done[id(meta)] = nn.Parameter(value, requires_grad=False) if isinstance(meta, nn.Parameter) else value
                self.resident_bytes += value.numel() * value.element_size()
            _assign(module, name, done[id(meta)])
            loaded.append((name, meta))
        self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
        if stored:
            restore_codes(module, {name: self._encoded(full) for name, full in stored.items()})
        return loaded

    def _read(self, name: str, meta: Tensor) -> Tensor:
        file, key = next(self.location[a] for a in self.aliases.get(name, [name]) if a in self.location)
        value = _get_tensors(file, [key])[key]
        if tuple(value.shape) != tuple(meta.shape):
            raise UserError(f"model.stream: {file}: {key!r} is {list(value.shape)}, the model's is {list(meta.shape)}")
        return value.to(meta.dtype)

    def _encoded(self, name: str):
        file, entry = self.codes[name]
        keys = [f"{name}.{k}" for k in ("codes", *entry["side"])]
        return unflatten(_get_tensors(file, keys), {name: entry}, str(file))[name]

    def _write(self, module: nn.Module, prefix: str, loaded: list[tuple[str, Tensor]]) -> None:
        """Write the resident tensors of ``module``: quantized weights holding stored values as their codes."""
        codes = stored_codes(module, held_only=True)
        tensors, manifest = flatten({_join(prefix, n): e for n, e in codes.items()})
        keys: dict[int, str] = {}  # one key per tensor: tied names share it
        for name, meta in loaded:
            if name not in codes and id(meta) not in keys:
                keys[id(meta)] = _join(prefix, name)
                tensors[keys[id(meta)]] = _get(module, name).detach().contiguous()
        file = self.work_dir / f"{prefix or 'model'}.safetensors"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            with staged_file(file) as tmp:
                safetensors.torch.save_file(tensors, str(tmp))
                follow_umask(tmp)
        except (OSError, safetensors.SafetensorError) as err:  # the staged file is gone
            fault = as_fault(err, file)  # a full disk, a read-only file system: named with the free space
            if fault is None:
                raise
            raise fault from None
        for name, meta in loaded:
            full = _join(prefix, name)
            if name in codes:
                self.codes[full] = (file, manifest[full])
            else:
                self.codes.pop(full, None)
                for alias in self.aliases.get(full, [full]):  # a tied tensor written under one name is read under all
                    self.location[alias] = (file, keys[id(meta)])

    def _release(self, module: nn.Module, loaded: list[tuple[str, Tensor]]) -> None:
        freed: set[int] = set()
        for name, meta in loaded:
            value = _get(module, name)
            if id(value) not in freed and not value.is_meta:
                freed.add(id(value))
                self.resident_bytes -= value.numel() * value.element_size()
            _assign(module, name, meta)
        for quantizer in module.modules():
            if isinstance(quantizer, OperandQuantizer):
                quantizer._held = None  # it named tensors now freed: a new tensor at the same address is not them
        return_free_memory()  # a block's buffers of many sizes fragment the heap: its resident size would grow


def streamed(model: nn.Module) -> DiskWeights | None:
    """The model's :class:`DiskWeights` when it is streamed from disk, else None."""
    return getattr(model, ATTRIBUTE, None)


def repeated_blocks(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The ``ModuleList`` of more than one block holding the most parameters (a transformer's layers), by path."""
    best, size = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            count = sum(p.numel() for p in module.parameters())
            if count > size:
                best, size = (name, module), count
    return best


def _names_in(file: Path) -> list[str]:
    try:
        with safetensors.safe_open(str(file), framework="pt") as f:
            return list(f.keys())
    except (OSError, safetensors.SafetensorError) as err:
        raise UserError(f"model.stream: {file} is not a readable safetensors file ({err})") from None


def _tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    """Every parameter and buffer by name, tied ones under each of their names."""
    return [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]


def _own_tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    """The module's own parameters and buffers (not its submodules'), by name."""
    return [(n, t) for n, t in (*module._parameters.items(), *module._buffers.items()) if t is not None]


def _get_tensors(file: Path, keys: list[str]) -> dict[str, Tensor]:
    try:
        with safetensors.safe_open(str(file), framework="pt") as f:
            return {key: f.get_tensor(key) for key in keys}
    except (OSError, safetensors.SafetensorError) as err:
        raise UserError(f"model.stream: {file}: cannot read {keys[0]!r} ({err})") from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _under(name: str, prefix: str | None) -> bool:
    return prefix is not None and (name == prefix or name.startswith(f"{prefix}."))


def _assign(module: nn.Module, name: str, value: Tensor) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if attr in owner._parameters:
        owner._parameters[attr] = value
    else:
        owner._buffers[attr] = value


def _get(module: nn.Module, name: str) -> Tensor:
    owner_name, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    return owner._parameters[attr] if attr in owner._parameters else owner._buffers[attr]
