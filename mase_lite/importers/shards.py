"""The safetensors files of a checkpoint directory someone else made, read as data.

Only regular files inside the directory are opened (a FIFO would block, a link may point anywhere). With a
``model.safetensors.index.json`` exactly the files it maps are read and every tensor must be where it says;
without one every ``*.safetensors`` file is read. A tensor name in two files is refused (one would silently
override the other). Every header is read and checked by safetensors before any tensor's data; a tensor is
loaded only after its dtype and size were checked, and a float tensor holding NaN or an infinity is refused.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from mase_lite.deploy.layers import ExportError
from mase_lite.infra.errors import UserError, short
from mase_lite.infra.files import open_regular
from mase_lite.infra.jsonio import loads

INDEX = "model.safetensors.index.json"
MAX_JSON_BYTES = 16 << 20  # a config or an index: transformers' are kilobytes to a few megabytes
FLOAT = ("F32", "F16", "BF16", "F64")
_READ_ERRORS = (SafetensorError, OSError, RuntimeError, TypeError, ValueError)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, through any links, is a file of the checkpoint directory ``root``: inside it, or, for a
    snapshot of the Hugging Face cache (``<repo>/snapshots/<revision>``, whose files link to ``../../blobs/``), in
    its repository's ``blobs``."""
    real, root = path.resolve(), root.resolve()
    blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    return root in real.parents or (blobs is not None and real.parent == blobs)


def regular(path: Path, root: Path | None) -> None:
    """Refuse (an ``ExportError``) a ``path`` that is not a regular file inside ``root`` (through any links;
    anywhere if None)."""
    real = path.resolve()
    if root is not None and not inside(path, root):
        raise ExportError(f"{path}: resolves to {real}, outside {root}: a checkpoint's files are inside its directory")
    try:
        mode = os.stat(real).st_mode
    except OSError as err:
        raise ExportError(f"{path}: cannot read it ({err.strerror})") from None
    if not stat.S_ISREG(mode):
        raise ExportError(f"{path}: not a regular file (a FIFO, a device or a directory)")


def read_bytes(path: Path, root: Path | None, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (inside ``root`` unless None), at most ``limit`` of them (a config, an
    index)."""
    regular(path, root)
    try:
        file = open_regular(path)
        if file is None:  # swapped for a FIFO or a device since the check
            raise ExportError(f"{path}: not a regular file (a FIFO, a device or a directory)")
        with file:
            data = file.read(limit + 1)
    except OSError as err:
        raise ExportError(f"{path}: cannot read it ({err.strerror})") from None
    if len(data) > limit:
        raise ExportError(f"{path}: larger than {limit >> 20} MiB, which no config or index is")
    return data


def read_json(path: Path, root: Path) -> dict[str, Any]:
    """The JSON object in the regular file ``path`` inside ``root``, strictly read (:mod:`mase_lite.infra.jsonio`)."""
    try:
        value = loads(read_bytes(path, root), str(path))
    except UserError as err:
        raise ExportError(str(err)) from None
    if not isinstance(value, dict):
        raise ExportError(f"{path}: expected a JSON object, not {type(value).__name__}")
    return value


class Shards:
    """The tensors of a directory's safetensors files: names, dtypes and shapes from the headers; data on demand.

    Use as a context manager (the files stay open while it is used)."""

    def __init__(self, root: Path):
        self.root = root
        self.where: dict[str, Path] = {}
        self._files: dict[Path, Any] = {}
        weight_map = self._read_headers()
        if weight_map is not None:
            self._check_index(weight_map)

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._files.values():
            handle.__exit__(None, None, None)
        self._files.clear()

    @property
    def nbytes(self) -> int:
        return sum(os.stat(file).st_size for file in self._files)

    def _read_headers(self) -> dict[str, str] | None:
        index = self.root / INDEX
        weight_map = None
        if index.exists() or index.is_symlink():
            weight_map = read_json(index, self.root).get("weight_map")
            if not (isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())):
                raise ExportError(f"{index}: weight_map = {short(weight_map)}: expected an object of tensor names "
                                  "to file names")
            names = sorted(set(weight_map.values()))
            for name in names:
                if not inside(self.root / name, self.root):
                    raise ExportError(f"{index}: weight_map names {name!r}, which resolves to "
                                      f"{(self.root / name).resolve()}, outside {self.root}")
            files = [self.root / name for name in names]
        else:
            files = sorted(self.root.glob("*.safetensors"))
        if not files:
            raise ExportError(f"{self.root}: no .safetensors file")
        for file in files:
            regular(file, self.root)
            try:
                handle = safe_open(str(file), framework="pt").__enter__()
            except _READ_ERRORS as err:
                raise ExportError(f"{file} is not a readable safetensors file: {_first_line(err)}") from None
            self._files[file] = handle
            for name in handle.keys():
                if name in self.where:
                    raise ExportError(f"{file}: tensor {name!r} is also in {self.where[name]}: which one the model "
                                      "holds would be a guess")
                self.where[name] = file
        return weight_map

    def _check_index(self, weight_map: dict[str, str]) -> None:
        index = self.root / INDEX
        for name, file in self.where.items():
            if weight_map.get(name) != file.relative_to(self.root).as_posix():
                raise ExportError(f"{index}: tensor {name!r} is in {file.name}, but the index "
                                  f"{'puts it in ' + repr(weight_map[name]) if name in weight_map else 'does not list it'}")
        for name, file in weight_map.items():
            if name not in self.where:
                raise ExportError(f"{index}: maps tensor {name!r} to {file!r}, which does not hold it")

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """The dtype (safetensors' name: ``F32``, ``I32``, ``F8_E4M3``...) and the shape the header declares."""
        info = self._files[self.where[name]].get_slice(name)
        return info.get_dtype(), tuple(info.get_shape())

    def check(self, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...], what: str) -> None:
        """Refuse a tensor that is absent, or not of one of ``dtypes`` and ``shape`` (a single value: of any shape)."""
        if name not in self.where:
            raise ExportError(f"{self.root}: {what} lacks tensor {name}")
        dtype, declared = self.header(name)
        if dtype not in dtypes or (declared != shape and not math.prod(declared) == math.prod(shape) == 1):
            raise ExportError(f"{self.where[name]}: tensor {name!r} is {dtype} of shape {list(declared)}; {what} "
                              f"needs {' or '.join(dtypes)} of shape {list(shape)}")

    def load(self, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...], what: str) -> Tensor:
        """The tensor ``name`` reshaped to ``shape``, once :meth:`check` passed; a float one must be finite."""
        self.check(name, dtypes, shape, what)
        file = self.where[name]
        try:
            tensor = self._files[file].get_tensor(name)
        except _READ_ERRORS as err:
            raise ExportError(f"{file}: cannot read tensor {name!r}: {_first_line(err)}") from None
        if not _finite(tensor):
            raise ExportError(f"{file}: tensor {name!r} holds NaN or infinite values")
        return tensor.reshape(shape)


def _finite(tensor: Tensor) -> bool:
    if tensor.dtype == torch.float8_e4m3fn:  # no infinity; NaN is every bit of the exponent and mantissa set
        return not bool(((tensor.view(torch.uint8) & 0x7F) == 0x7F).any())
    return not tensor.is_floating_point() or bool(torch.isfinite(tensor).all())


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:300]
