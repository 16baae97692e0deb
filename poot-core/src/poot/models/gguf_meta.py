"""Read a GGUF file's key/value metadata as plain Python values, bounds-checked.

`GGUFHeader` is a cursor over the file's bytes that refuses to step past the end: every
length and count is checked against the bytes left before it is used, nested arrays are
limited in depth, so a truncated, corrupted or hostile header is a CheckpointError naming the
file and the field, never an out-of-bounds read, a deep recursion or a runaway loop. The tensor
infos and data (poot_quant.gguf_file) are read with the same cursor. (gguf.GGUFReader walks the
same header without those checks: a 384-byte file whose string is re-declared as an array kept
it busy for over 20 s.)
"""
from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np

from poot.errors import CheckpointError

MAGIC = b"GGUF"
#: arrays of arrays deeper than this are refused (poot reads none; the format allows them)
MAX_ARRAY_DEPTH = 8

_SCALARS = {  # GGUFValueType id -> numpy dtype
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
    10: "<u8", 11: "<i8", 12: "<f8",
}
_BOOL, _STRING, _ARRAY = 7, 8, 9


class GGUFHeader:
    """A cursor over the file bytes that refuses to step past the end."""

    def __init__(self, data: np.ndarray, path: Path):
        self.data, self.path, self.pos, self.size = data, path, 0, data.size
        self.view = memoryview(data)  # slicing a memoryview costs far less than a memmap

    def fail(self, message: str):
        raise CheckpointError(f"GGUF file {self.path}: {message}")

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            self.fail(f"truncated or corrupted: {what} at byte {start} needs {n} bytes, "
                      f"the file has {self.size}")
        self.pos += n
        return start

    def scalar(self, dtype: str, what: str):
        dt = np.dtype(dtype)
        start = self.take(dt.itemsize, what)
        return np.frombuffer(self.data, dt, 1, start)[0].item()

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.view, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.view, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        start = self.take(n, what)
        try:
            return str(self.view[start:start + n], "utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at byte {start} is not valid UTF-8")

    def value_type(self, what: str) -> int:
        raw = self.u32(f"type of {what}")
        if raw not in _SCALARS and raw not in (_STRING, _ARRAY):
            self.fail(f"{what} has unknown value type {raw}")
        return raw

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            return self.array(what, depth + 1)
        v = self.scalar(_SCALARS[vtype], what)
        return bool(v) if vtype == _BOOL else v

    def array(self, what: str, depth: int = 1) -> list:
        if depth > MAX_ARRAY_DEPTH:
            self.fail(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        etype = self.value_type(f"elements of {what}")
        count = self.u64(f"length of {what}")
        if etype in _SCALARS:
            dt = np.dtype(_SCALARS[etype])
            start = self.take(count * dt.itemsize, what)
            values = np.frombuffer(self.data, dt, count, start)
            return values.astype(bool).tolist() if etype == _BOOL else values.tolist()
        # strings take at least 8 bytes each, nested arrays 12: bound the count first
        if count * (8 if etype == _STRING else 12) > self.size - self.pos:
            self.fail(f"{what} claims {count} elements, more than the file can hold")
        return [self.value(etype, f"{what}[{i}]", depth) for i in range(count)]

    def metadata(self) -> tuple[dict[str, Any], int]:
        """The header's key/values (with GGUF.version/tensor_count/kv_count) and the tensor
        count, leaving the cursor at the first tensor info."""
        if self.size < 4 or bytes(self.data[:4]) != MAGIC:
            self.fail("not a GGUF file (bad magic)")
        self.pos = 4
        version = self.u32("version")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            self.fail("big-endian GGUF files are not supported" if swapped in (2, 3)
                      else f"unsupported GGUF version {version}")
        n_tensors, n_kv = self.u64("tensor count"), self.u64("key/value count")
        if n_kv * 12 > self.size - self.pos:  # a key/value takes at least 12 bytes
            self.fail(f"truncated or corrupted: the header claims {n_kv} key/values, more "
                      f"than the file can hold")
        meta: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                                "GGUF.kv_count": n_kv}
        for i in range(n_kv):
            key = self.string(f"key #{i}")
            if key in meta:
                self.fail(f"duplicate metadata key {key!r}")
            meta[key] = self.value(self.value_type(key), key)
        # every value is a Python copy now: the vocabulary's megabytes of file pages go
        release_file_pages(self.data[:self.pos])
        return meta, n_tensors


def release_file_pages(array: np.ndarray) -> None:
    """Drop the resident pages of `array`'s bytes when they are a view of a read-only file
    mapping (the whole pages inside it): the bytes stay the file's, and a later read faults
    them in again from the page cache. For bytes read once and copied out (the header's
    key/values, the reordered q/k rows), so that the process does not hold them twice."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if not isinstance(base, mmap.mmap) or not memoryview(base).readonly \
            or not hasattr(base, "madvise"):
        return
    page = mmap.PAGESIZE
    origin = np.frombuffer(base, np.uint8).ctypes.data
    start = array.ctypes.data - origin
    stop = start + array.nbytes
    first, last = -(-start // page) * page, stop // page * page
    if last > first:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)


def map_file(path: str | Path) -> GGUFHeader:
    """A GGUFHeader over the memory-mapped file, or a CheckpointError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"GGUF file {path} is empty")
    with path.open("rb") as f:
        head = f.read(64)
    if head[:4] != MAGIC:
        raise CheckpointError(f"{path} is not a GGUF file ({describe_start(head)})")
    return GGUFHeader(np.memmap(path, np.uint8, mode="r"), path)


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every key/value of a GGUF file (including the GGUF.* header fields) as plain values.

    Read once per file version in a process (a 262144-token vocabulary is seconds of
    parsing); each call gets its own dict (the lists inside are shared: do not mutate)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return map_file(path).metadata()[0]   # names the missing file
    return dict(_cached(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _cached(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    return map_file(path).metadata()[0]


def describe_start(head: bytes) -> str:
    """What a file that should be GGUF looks like instead, from its first bytes."""
    known = {b"\x89PNG": "a PNG image", b"PK\x03\x04": "a zip archive", b"\x7fELF": "an ELF "
             "binary", b"%PDF": "a PDF document", b"\xff\xd8\xff": "a JPEG image",
             b"GIF8": "a GIF image", b"\x1f\x8b": "a gzip archive"}
    for magic, kind in known.items():
        if head.startswith(magic):
            return f"it is {kind}"
    if not head:
        return "it is empty"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\t\r\n" for c in text):
        return f"it starts with text {text[:16]!r}, not the magic b'GGUF'"
    return f"it starts with {head[:8]!r}, not the magic b'GGUF'"
