"""An opened checkpoint: metadata, and tensors that stay packed and memory-mapped."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from poot.dtypes import DType
from poot.errors import CheckpointError
from poot.formats import PackedWeight
from poot.ir.types import WeightRef


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """One checkpoint tensor. Exactly one of `dtype` (dense) and `packed` is set.

    `shape` is the logical shape in numpy order ([N, K] for a projection; a stack
    of experts is [E, N, K] with `packed.shape` = [E*N, K]). `sources` are views
    of the file's memory map, in the order of the format's roles (one array, of
    `shape`, for a dense tensor): nothing is read until used.
    """

    name: str
    shape: tuple[int, ...]
    dtype: DType | None
    packed: PackedWeight | None
    sources: tuple[np.ndarray, ...]
    ref: WeightRef

    @property
    def is_packed(self) -> bool:
        return self.packed is not None

    @property
    def storage(self) -> DType | PackedWeight:
        return self.packed if self.packed is not None else self.dtype

    @property
    def nbytes(self) -> int:
        return sum(int(s.nbytes) for s in self.sources)

    def array(self) -> np.ndarray:
        """The dense tensor as a (memory-mapped, read-only) numpy view."""
        if self.packed is not None:
            raise CheckpointError(f"tensor {self.name!r} of {self.ref.checkpoint} is packed "
                                  f"({self.packed!r}); use dequantize() or its sources")
        return self.sources[0]

    def dequantize(self) -> np.ndarray:
        """The tensor's values as float32 of `shape` (a new array)."""
        if self.packed is None:
            return np.asarray(self.sources[0], np.float32).reshape(self.shape)
        from poot_quant.registry import get

        fmt = get(self.packed.format)
        out = fmt.dequantize(list(self.sources), self.packed.shape, **self.packed.attr_dict)
        return out.reshape(self.shape)


def payload_key(path: Path, offset: int, nbytes: int) -> str:
    """File + offset + length + mtime: equal bytes share a cache entry, changed files do not."""
    st = path.stat()
    return f"{path.resolve()}:{offset}:{nbytes}:{st.st_mtime_ns}"


class Checkpoint:
    """`metadata` (GGUF key/values, or a safetensors folder's parsed config.json),
    `tensors` (name -> TensorInfo), `path`, `kind` ("gguf" or "safetensors"), `close()`."""

    def __init__(self, path: Path, kind: str, metadata: dict[str, Any],
                 tensors: dict[str, TensorInfo]):
        self.path, self.kind = Path(path), kind
        self.metadata, self.tensors = metadata, tensors

    def __repr__(self) -> str:
        return f"<{self.kind} checkpoint {self.path} ({len(self.tensors)} tensors)>"

    def __getitem__(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.path} has no tensor {name!r}") from None

    def close(self) -> None:
        """Drop this checkpoint's references to the memory maps (the OS unmaps a file
        once no array view of it is alive any more)."""
        self.tensors = {}

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_checkpoint(path: str | os.PathLike, format_hint: str | None = None) -> Checkpoint:
    """Open a GGUF file or a safetensors file/folder; CheckpointError if it is neither."""
    from poot_quant.gguf_file import is_gguf, looks_gguf, open_gguf
    from poot_quant.safetensors_dir import is_safetensors, open_safetensors

    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    hint = (format_hint or "").lower()
    if hint == "gguf" or (not hint and (is_gguf(p) or looks_gguf(p))):
        return open_gguf(p)
    if hint == "safetensors" or (not hint and is_safetensors(p)):
        return open_safetensors(p)
    raise CheckpointError(f"{p} is neither a GGUF file nor a safetensors file or folder"
                          + (f" (format hint {format_hint!r})" if format_hint else ""))
