"""GGUF files read as data: a bounded, validating reader of the container (versions 2 and 3, either byte order).

A GGUF file is a header (magic ``GGUF``, version, tensor count, key-value count), typed key-value pairs (scalars,
UTF-8 strings, arrays of them, arrays of arrays), tensor infos (name, dimensions, GGML type, offset) and, from the
next multiple of ``general.alignment``, the tensors' data. Someone else's file is data: before anything is looped
over or allocated, every count and length is checked against the bytes left in the file, so a 10 KB file declaring
2**60 values is refused at once; arrays nest at most :data:`MAX_DEPTH` deep, the metadata holds at most
:data:`MAX_VALUES` values and the file at most :data:`MAX_TENSORS` tensors. Only regular files are opened (a FIFO
named ``x.gguf`` would block its reader). Every problem raises :class:`ExportError` naming the file and the field or
tensor at fault; nothing else is raised.

>>> import struct, tempfile
>>> path = Path(tempfile.mkdtemp()) / "m.gguf"
>>> name = b"general.quantized_by"
>>> _ = path.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, len(name)) + name + struct.pack("<IQ", 8, 9) + b"mase-lite")
>>> metadata(path)
{'general.quantized_by': 'mase-lite'}
>>> _ = path.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1) + b"x" + struct.pack("<IIQ", 9, 0, 2**60))
>>> metadata(path)
Traceback (most recent call last):
...
mase_lite.deploy.errors.ExportError: .../m.gguf is not a readable GGUF file: 'x': an array of 1152921504606846976 UINT8...
"""

from __future__ import annotations

import math
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mase_lite.deploy.layers import ExportError
from mase_lite.infra.errors import short

MAGIC = b"GGUF"
VERSIONS = (2, 3)
HEADER_BYTES = 24  # magic, version, tensor count, key-value count
MAX_DEPTH = 4  # arrays within arrays (llama.cpp reads none; the gguf package writes them)
MAX_VALUES = 1 << 22  # metadata values in all; a 262k-token vocabulary with its scores, types and merges is ~1M
MAX_TENSORS = 1 << 16  # a 405B dense model has ~1.1k tensors
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 64  # GGUF's limit on a tensor's name
DEFAULT_ALIGNMENT = 32
MAX_INT64 = 2**63 - 1

BOOL, STRING, ARRAY = 7, 8, 9
SCALARS = {0: ("UINT8", "B"), 1: ("INT8", "b"), 2: ("UINT16", "H"), 3: ("INT16", "h"), 4: ("UINT32", "I"),
           5: ("INT32", "i"), 6: ("FLOAT32", "f"), 7: ("BOOL", "B"), 10: ("UINT64", "Q"), 11: ("INT64", "q"),
           12: ("FLOAT64", "d")}
TYPE_NAMES = {**{k: name for k, (name, _) in SCALARS.items()}, STRING: "STRING", ARRAY: "ARRAY"}
LEAST_BYTES = {**{k: struct.calcsize(code) for k, (_, code) in SCALARS.items()}, STRING: 8, ARRAY: 12}
KV_LEAST_BYTES = 8 + 1 + 4 + 1  # a one-byte key, its type, a one-byte value
TENSOR_LEAST_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # a one-byte name, one dimension, type, offset
NUMPY_TYPES = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4", "I64": "i8"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``dims`` in GGUF's order (the contiguous dimension first), ``offset`` and
    ``n_bytes`` its bytes in the file."""

    name: str
    dims: tuple[int, ...]
    type: str  # the GGML type's name: F32, Q8_0...
    offset: int
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in numpy's and torch's order (the contiguous dimension last)."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFFile:
    """A validated GGUF file: its metadata (Python values; arrays as lists), its tensors by name, and its bytes
    (memory-mapped: :meth:`array` copies nothing)."""

    path: Path
    version: int
    byte_order: str  # "<" or ">"
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    buffer: Any

    def array(self, name: str) -> np.ndarray:
        """A tensor's data as ``GGUFReader`` gives it, read-only: F32, F16, F64 and I8-I64 as their numpy types in
        :attr:`TensorInfo.shape`; any other GGML type as ``uint8`` with the last dimension its bytes per row."""
        info = self.tensors[name]
        kind = NUMPY_TYPES.get(info.type)
        if kind is None:  # whole blocks per row: the row's bytes are the tensor's over its rows
            rows = math.prod(info.shape[:-1])
            blocks = np.frombuffer(self.buffer, np.uint8, info.n_bytes, info.offset)
            return blocks.reshape(*info.shape[:-1], info.n_bytes // rows)
        dtype = np.dtype(self.byte_order + kind)
        values = np.frombuffer(self.buffer, dtype, info.n_bytes // dtype.itemsize, info.offset).reshape(info.shape)
        return values if dtype.isnative else values.astype(dtype.newbyteorder("="))


def metadata(path: str | Path) -> dict[str, Any]:
    """The key-value pairs of the GGUF file ``path``, validated as :func:`read_file` validates them; no tensor
    info or data is read."""
    return _Parser(Path(path), _mapped(Path(path))).metadata()[2]


def read_file(path: str | Path) -> GGUFFile:
    """The GGUF file ``path``, every field validated: header, metadata, tensor infos (names unique and at most 64
    bytes; 1 to 4 positive dimensions whose product fits in 63 bits; known GGML types whose block size divides the
    rows; offsets aligned), and each tensor's bytes inside the file, no two overlapping."""
    path = Path(path)
    return _Parser(path, _mapped(path)).file()


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is meant as a GGUF file: anything but a directory named ``*.gguf`` (which :func:`read_file`
    refuses, saying why, and never opens unless it is a regular file), or a regular file starting with ``GGUF``."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    named = Path(path).suffix.lower() == ".gguf"
    if named or not stat.S_ISREG(mode):
        return named and not stat.S_ISDIR(mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 4) == MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _mapped(path: Path) -> Any:
    """The bytes of the regular file ``path``, memory-mapped (a FIFO or a device is refused before it is opened)."""
    try:
        mode = os.stat(path).st_mode
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if stat.S_ISREG(mode) else None  # never blocks: see fstat
    except (OSError, ValueError) as err:
        raise ExportError(f"{path}: cannot read it ({getattr(err, 'strerror', None) or err})") from None
    if fd is None:
        raise ExportError(f"{path} is {_kind(mode)}; a GGUF model is read from a regular file")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # the name changed since the stat
            raise ExportError(f"{path} is {_kind(info.st_mode)}; a GGUF model is read from a regular file")
        if info.st_size < HEADER_BYTES:
            raise ExportError(f"{path} is not a readable GGUF file: header: the file has {info.st_size} bytes, "
                              f"a GGUF header {HEADER_BYTES}")
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as err:
            raise ExportError(f"{path}: cannot map it ({getattr(err, 'strerror', None) or err})") from None
    finally:
        os.close(fd)


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """GGML type code -> (name, elements per block, bytes per block), from llama.cpp's own table in the gguf package."""
    try:
        from gguf.constants import GGML_QUANT_SIZES
    except ImportError:
        raise ExportError("reading GGUF files needs the gguf package: pip install gguf (or mase-lite[export])") from None
    return {int(qtype): (qtype.name, *sizes) for qtype, sizes in GGML_QUANT_SIZES.items()}


class _Parser:
    """A cursor over a GGUF file's bytes that checks every read against what is left."""

    def __init__(self, path: Path, buffer: Any):
        self.path, self.buffer, self.pos, self.order, self.values = path, buffer, 0, "<", 0

    def fail(self, where: Any, what: str) -> ExportError:
        return ExportError(f"{self.path} is not a readable GGUF file: {where}: {what}")

    def left(self) -> int:
        return len(self.buffer) - self.pos

    def scalar(self, code: str, where: Any) -> Any:
        size = struct.calcsize(code)
        if self.left() < size:
            raise self.fail(where, f"the file ends {self.left()} bytes into a {size}-byte value")
        (value,) = struct.unpack_from(self.order + code, self.buffer, self.pos)
        self.pos += size
        return value

    def string(self, where: Any, limit: int | None = None) -> str:
        length = self.scalar("Q", where)
        if length > self.left():
            raise self.fail(where, f"a string of {length} bytes cannot fit in the {self.left()} bytes left")
        if limit is not None and not 0 < length <= limit:
            raise self.fail(where, f"a name of {length} bytes; give 1 to {limit}")
        raw = self.buffer[self.pos:self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(where, f"a string that is not UTF-8 (byte {err.start} of {short(raw)})") from None

    def value(self, kind: int, where: Any, depth: int = 0) -> Any:
        if kind == STRING:
            return self.string(where)
        if kind == ARRAY:
            return self.array(where, depth + 1)
        if kind not in SCALARS:
            raise self.fail(where, f"value type {kind} is unknown; GGUF's are 0 to 12")
        value = self.scalar(SCALARS[kind][1], where)
        if kind == BOOL:
            if value > 1:
                raise self.fail(where, f"a BOOL of byte value {value}; give 0 or 1")
            return bool(value)
        return value

    def array(self, where: Any, depth: int) -> list:
        if depth > MAX_DEPTH:
            raise self.fail(where, f"arrays nested more than {MAX_DEPTH} deep")
        kind = self.scalar("I", where)
        if kind not in LEAST_BYTES:
            raise self.fail(where, f"an array of value type {kind}, which is unknown; GGUF's are 0 to 12")
        count = self.scalar("Q", where)
        if count > self.left() // LEAST_BYTES[kind]:
            raise self.fail(where, f"an array of {count} {TYPE_NAMES[kind]} values cannot fit in the {self.left()} "
                                   "bytes left")
        self.values += count
        if self.values > MAX_VALUES:
            raise self.fail(where, f"the metadata holds more than {MAX_VALUES} values")
        if kind in SCALARS:
            dtype = np.dtype(self.order + SCALARS[kind][1])
            items = np.frombuffer(self.buffer, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            if kind == BOOL:
                if count and int(items.max()) > 1:
                    raise self.fail(where, f"a BOOL of byte value {int(items.max())}; give 0 or 1")
                return items.astype(bool).tolist()
            return items.tolist()
        if kind == STRING:
            return self.strings(count, where)
        return [self.value(kind, _Item(where, i), depth) for i in range(count)]

    def strings(self, count: int, where: Any) -> list[str]:
        """``count`` strings (one loop, the fast path of a vocabulary: a million tokens take about a second)."""
        buffer, pos, end, order, out = self.buffer, self.pos, len(self.buffer), self.order + "Q", []
        for i in range(count):
            if end - pos < 8:
                self.pos = pos
                raise self.fail(_Item(where, i), f"the file ends {end - pos} bytes into a string's length")
            (length,) = struct.unpack_from(order, buffer, pos)
            pos += 8
            if length > end - pos:
                raise self.fail(_Item(where, i), f"a string of {length} bytes cannot fit in the {end - pos} bytes left")
            raw = buffer[pos:pos + length]
            pos += length
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                raise self.fail(_Item(where, i), f"a string that is not UTF-8 (byte {err.start} of {short(raw)})") from None
        self.pos = pos
        return out

    def header(self) -> tuple[int, int, int]:
        magic = self.buffer[:4]
        if magic != MAGIC:
            raise self.fail("magic", f"the file starts with {magic!r}, not {MAGIC!r}")
        self.pos = 4
        version = self.scalar("I", "GGUF.version")
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in VERSIONS and swapped in VERSIONS:  # written on a big-endian machine
            self.order, version = ">", swapped
        if version not in VERSIONS:
            raise self.fail("GGUF.version", f"version {version}; readable: {', '.join(map(str, VERSIONS))}")
        tensors, kvs = self.scalar("Q", "GGUF.tensor_count"), self.scalar("Q", "GGUF.kv_count")
        if kvs > self.left() // KV_LEAST_BYTES:
            raise self.fail("GGUF.kv_count", f"{kvs} key-value pairs cannot fit in the {self.left()} bytes left")
        if kvs > MAX_VALUES:
            raise self.fail("GGUF.kv_count", f"{kvs} key-value pairs; at most {MAX_VALUES} are read")
        if tensors > MAX_TENSORS:
            raise self.fail("GGUF.tensor_count", f"{tensors} tensors; at most {MAX_TENSORS} are read")
        return version, tensors, kvs

    def metadata(self) -> tuple[int, int, dict[str, Any]]:
        """(version, tensor count, the key-value pairs)."""
        version, tensors, kvs = self.header()
        out: dict[str, Any] = {}
        for i in range(kvs):
            key = self.string(f"key {i}")
            if not key:
                raise self.fail(f"key {i}", "an empty key")
            if key in out:
                raise self.fail(short(key), "a duplicate key")
            kind = self.scalar("I", short(key))
            out[key] = self.value(kind, short(key))
            self.values += 1
            if key == "general.alignment" and (kind != 4 or out[key] <= 0 or out[key] & (out[key] - 1)):
                raise self.fail(key, f"{TYPE_NAMES.get(kind, kind)} {short(out[key])}; give a UINT32 power of two")
        if tensors > self.left() // TENSOR_LEAST_BYTES:
            raise self.fail("GGUF.tensor_count", f"{tensors} tensor infos cannot fit in the {self.left()} bytes left")
        return version, tensors, out

    def file(self) -> GGUFFile:
        version, count, meta = self.metadata()
        alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        types = _ggml_types()
        infos = [self.tensor_info(i, types, alignment) for i in range(count)]
        start = -(-self.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        for name, dims, kind, offset, n_bytes in infos:
            if name in tensors:
                raise self.fail(f"tensor {short(name)}", "a duplicate tensor name")
            if start + offset + n_bytes > len(self.buffer):
                raise self.fail(f"tensor {short(name)}", f"its {n_bytes} bytes at offset {offset} of the data section "
                                f"(byte {start + offset}) end past the file's {len(self.buffer)} bytes")
            tensors[name] = TensorInfo(name, dims, kind, start + offset, n_bytes)
        ordered = sorted(tensors.values(), key=lambda t: (t.offset, t.n_bytes))
        for before, after in zip(ordered, ordered[1:]):
            if after.offset < before.offset + before.n_bytes:
                raise self.fail(f"tensor {short(after.name)}", f"its bytes overlap those of tensor {short(before.name)}")
        return GGUFFile(self.path, version, self.order, meta, tensors, self.buffer)

    def tensor_info(self, i: int, types: dict[int, tuple[str, int, int]],
                    alignment: int) -> tuple[str, tuple[int, ...], str, int, int]:
        name = self.string(f"tensor info {i}", MAX_NAME_BYTES)
        where = f"tensor {short(name)}"
        n_dims = self.scalar("I", where)
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(where, f"{n_dims} dimensions; give 1 to {MAX_DIMS}")
        dims = tuple(self.scalar("Q", where) for _ in range(n_dims))
        elements = 1
        for dim in dims:
            elements *= dim
        if min(dims) < 1 or elements > MAX_INT64:
            raise self.fail(where, f"dimensions {list(dims)}; give positive ones whose product fits in 63 bits")
        code = self.scalar("I", where)
        if code not in types:
            raise self.fail(where, f"GGML type {code} is unknown; known: {', '.join(sorted(t[0] for t in types.values()))}")
        kind, block, type_bytes = types[code]
        if dims[0] % block:
            raise self.fail(where, f"a row of {dims[0]} {kind} values is not a whole number of blocks of {block}")
        offset = self.scalar("Q", where)
        if offset % alignment:
            raise self.fail(where, f"offset {offset} is not a multiple of the alignment {alignment}")
        return name, dims, kind, offset, elements // block * type_bytes


@dataclass(frozen=True)
class _Item:
    """Where an array's item is, formatted only when an error names it."""

    array: Any
    index: int

    def __str__(self) -> str:
        return f"{self.array}[{self.index}]"
