"""GGUF files forged byte by byte, for the hostile-file tests and the reliability probe
(benchmarks/robustness_gguf.py): a valid file's parts, read with the gguf package's own reader, changed at will
(any count, type, length, offset or value, consistent or not) and written back."""

from __future__ import annotations

import copy
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
CODES = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f", BOOL: "B",
         UINT64: "Q", INT64: "q", FLOAT64: "d"}


@dataclass
class Array:
    """An array value: ``count`` (when given) is written in place of ``len(items)``."""

    type: int
    items: list
    count: int | None = None


@dataclass
class Raw:
    """Bytes written as they are, in place of a value."""

    data: bytes


@dataclass
class KV:
    key: str | bytes | Raw
    type: int
    value: Any


@dataclass
class TensorInfo:
    name: str | bytes | Raw
    dims: list[int]
    type: int
    offset: int  # into the data section


@dataclass
class Parts:
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes
    version: int = 3
    magic: bytes = b"GGUF"
    alignment: int = 32  # the padding written before the data section
    tensor_count: int | None = None
    kv_count: int | None = None
    order: str = "<"
    tail: bytes = field(default=b"")  # written after the data

    def copy(self) -> Parts:
        return copy.deepcopy(self)

    def kv(self, key: str) -> KV:
        return next(kv for kv in self.kvs if kv.key == key)

    def set(self, key: str | bytes | Raw, kind: int, value: Any) -> None:
        """Set ``key`` to a value of ``kind``: in place, or as a new first key."""
        found = [kv for kv in self.kvs if kv.key == key]
        if found:
            found[0].type, found[0].value = kind, value
        else:
            self.kvs.insert(0, KV(key, kind, value))

    def drop(self, key: str) -> None:
        self.kvs = [kv for kv in self.kvs if kv.key != key]

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name)

    def relaid(self, alignment: int) -> Parts:
        """The same tensors laid out anew, each at the next multiple of ``alignment`` (the padding too)."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        parts, data = self.copy(), b""
        for t in parts.tensors:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
            blob = self.data[t.offset:t.offset + math.prod(t.dims) // block * size]
            data += bytes(-len(data) % alignment)
            t.offset = len(data)
            data += blob
        parts.data, parts.alignment = data, alignment
        return parts

    def header_bytes(self) -> int:
        """Where the data section starts."""
        return len(self._head()) + (-len(self._head()) % self.alignment)

    def _head(self) -> bytes:
        out = [self.magic, self._pack("I", self.version),
               self._pack("Q", len(self.tensors) if self.tensor_count is None else self.tensor_count),
               self._pack("Q", len(self.kvs) if self.kv_count is None else self.kv_count)]
        for kv in self.kvs:
            out += [self._string(kv.key), self._pack("I", kv.type), self.value_bytes(kv.type, kv.value)]
        for t in self.tensors:
            out += [self._string(t.name), self._pack("I", len(t.dims)), *(self._pack("Q", d) for d in t.dims),
                    self._pack("I", t.type), self._pack("Q", t.offset)]
        return b"".join(out)

    def to_bytes(self) -> bytes:
        head = self._head()
        return head + bytes(-len(head) % self.alignment) + self.data + self.tail

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path

    def _pack(self, code: str, value: Any) -> bytes:
        return struct.pack(self.order + code, value)

    def _string(self, text: str | bytes | Raw) -> bytes:
        if isinstance(text, Raw):
            return text.data
        raw = text.encode("utf-8") if isinstance(text, str) else text
        return self._pack("Q", len(raw)) + raw

    def value_bytes(self, kind: int, value: Any) -> bytes:
        if isinstance(value, Raw):
            return value.data
        if kind == STRING:
            return self._string(value)
        if kind == ARRAY:
            count = len(value.items) if value.count is None else value.count
            return (self._pack("I", value.type) + self._pack("Q", count)
                    + b"".join(self.value_bytes(value.type, item) for item in value.items))
        return self._pack(CODES[kind], value)


def parse(path: Path) -> Parts:
    """The parts of a valid GGUF file (flat arrays only), as the gguf package reads them."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    kvs = []
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        kind = int(fld.types[0])
        value = Array(int(fld.types[-1]), list(fld.contents())) if kind == ARRAY else fld.contents()
        kvs.append(KV(name, kind, value))
    tensors = [TensorInfo(t.name, [int(d) for d in t.shape], int(t.tensor_type), int(t.data_offset) - reader.data_offset)
               for t in reader.tensors]
    return Parts(kvs, tensors, bytes(reader.data[reader.data_offset:]), alignment=reader.alignment)
