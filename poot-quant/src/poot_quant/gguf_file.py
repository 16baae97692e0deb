"""Open a GGUF file: header checked against the file size, tensors as memory-map views.

The header (key/values: poot.models.gguf_meta.GGUFHeader; tensor infos: here) is walked with
every length and offset checked against the file before it is used, so a truncated or corrupted
file gives a CheckpointError naming the file and the field or tensor, never an
out-of-bounds read or a runaway loop. (gguf.GGUFReader would do the same walk
without those checks, and keeps ~200k numpy views of the vocabulary alive: on
SmolLM2 it took 2.2 s and a 200 MB peak here, this walk 0.28 s and 47 MB. The type ids
and block geometry are poot_quant.ggml_types', checked against the `gguf` package's,
which still supplies the quantization code; tests check this reader against GGUFReader
on real files.)

A model split by llama.cpp's gguf-split (or the converter's --split-max-tensors) is several
files named <prefix>-00001-of-0000N.gguf: each a whole GGUF with its own header and data,
the first one holding the model's key/values, every one saying `split.no` and `split.count`.
Opening the first opens them all, as one checkpoint.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from poot.dtypes import DType
from poot.errors import CheckpointError
from poot.formats import PackedWeight
from poot.ir.types import WeightRef
from poot.models.gguf_meta import MAGIC, GGUFHeader, map_file

from poot_quant.checkpoint import Checkpoint, TensorInfo, payload_key
from poot_quant.ggml_types import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType
from poot_quant.registry import formats


MAX_DIMS = 4  # GGML_MAX_DIMS

#: the name llama.cpp gives shard n of N (llama_split_path: "%s-%05d-of-%05d.gguf")
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$",
                        re.IGNORECASE)

_DENSE = {GGMLQuantizationType.F32: DType.F32, GGMLQuantizationType.F16: DType.F16,
          GGMLQuantizationType.BF16: DType.BF16, GGMLQuantizationType.I8: DType.I8,
          GGMLQuantizationType.I16: DType.I16, GGMLQuantizationType.I32: DType.I32}


def is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == MAGIC


def looks_gguf(path: Path) -> bool:
    """A file that claims to be GGUF by its name: opened as one so that what is wrong with
    it is said (rather than passed to no reader at all)."""
    return path.is_file() and path.suffix.lower() == ".gguf"


def _tensor_info(h: GGUFHeader, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = h.string(f"name of tensor #{index}")
    n_dims = h.u32(f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        h.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
    dims = tuple(h.u64(f"dimensions of tensor {name!r}") for _ in range(n_dims))
    raw_type = h.u32(f"type of tensor {name!r}")
    offset = h.u64(f"data offset of tensor {name!r}")
    return name, dims, raw_type, offset


def _read_header(h: GGUFHeader) -> tuple[dict[str, Any], list, int]:
    metadata, n_tensors = h.metadata()
    if n_tensors * 24 > h.size - h.pos:
        h.fail(f"the header claims {n_tensors} tensors, more than the file can hold")
    infos = [_tensor_info(h, i) for i in range(n_tensors)]
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
            or alignment & (alignment - 1):
        h.fail(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-h.pos // alignment) * alignment
    return metadata, infos, data_start


def _tensor(h: GGUFHeader, name: str, dims, raw_type: int, offset: int, data_start: int,
            alignment: int) -> TensorInfo:
    where = f"tensor {name!r}"
    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        h.fail(f"{where} has unknown GGML type id {raw_type}")
    if any(d <= 0 for d in dims):
        h.fail(f"{where} has an empty dimension {list(dims)}")
    shape = tuple(reversed(dims))  # GGUF lists ne[0] (the contiguous K) first
    block, type_size = GGML_QUANT_SIZES[qtype]
    if dims[0] % block:
        h.fail(f"{where} ({qtype.name}) has {dims[0]} values per row, not a multiple of "
               f"its block size {block}")
    nbytes = math.prod(dims) // block * type_size
    if offset % alignment:
        h.fail(f"{where} starts at data offset {offset}, not a multiple of {alignment}")
    start = data_start + offset
    if start + nbytes > h.size:
        h.fail(f"truncated: {where} needs bytes [{start}, {start + nbytes}), the file has "
               f"{h.size}")
    raw = h.data[start:start + nbytes]
    ref_key = payload_key(h.path, start, nbytes)
    if qtype in _DENSE:
        dtype = _DENSE[qtype]
        ref = WeightRef(str(h.path), name, ref_key, dtype.value)
        return TensorInfo(name, shape, dtype, None, (raw.view(dtype.numpy).reshape(shape),), ref)
    fmt = f"gguf:{qtype.name}"
    if fmt not in formats():
        h.fail(f"{where} is stored as {qtype.name}, which poot_quant cannot decode "
               f"(GGUF types it reads: F32, F16, BF16, I8, I16, I32, "
               f"{', '.join(f[5:] for f in formats() if f.startswith('gguf:'))})")
    rows = math.prod(shape[:-1])
    packed = PackedWeight(fmt, (rows, shape[-1]))
    ref = WeightRef(str(h.path), name, ref_key, fmt)
    return TensorInfo(name, shape, None, packed, (raw.reshape(rows, -1),), ref)


def _shard_tensors(h: GGUFHeader, metadata: dict[str, Any], infos, data_start: int,
                   tensors: dict[str, TensorInfo]) -> None:
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    for name, dims, raw_type, offset in infos:
        if name in tensors:
            h.fail(f"duplicate tensor name {name!r}")
        tensors[name] = _tensor(h, name, dims, raw_type, offset, data_start, alignment)


def _split_field(h: GGUFHeader, metadata: dict[str, Any], key: str,
                 default: int | None) -> int:
    value = metadata.get(key, default)
    if value is None:
        h.fail(f"has no {key}, which every shard of a split GGUF carries")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        h.fail(f"{key} {value!r} is not a count")
    return value


def shard_paths(first: Path, count: int) -> list[Path]:
    """The files of a model split in `count` shards, given its first shard."""
    m = SPLIT_NAME.match(first.name)
    if m is None or int(m["no"]) != 1:
        raise CheckpointError(f"{first} says split.count = {count}, but its name is not the "
                              f"first shard's <prefix>-00001-of-{count:05d}.gguf, so the "
                              f"other shards cannot be found")
    return [first.with_name(f"{m['prefix']}-{n:05d}-of-{count:05d}{first.suffix}")
            for n in range(1, count + 1)]


def open_gguf(path: str | Path) -> Checkpoint:
    path = Path(path)
    h = map_file(path)
    metadata, infos, data_start = _read_header(h)
    tensors: dict[str, TensorInfo] = {}
    _shard_tensors(h, metadata, infos, data_start, tensors)
    count = _split_field(h, metadata, "split.count", 1)
    if count > 1:
        if _split_field(h, metadata, "split.no", 0) != 0:
            raise CheckpointError(f"{path} is shard {metadata['split.no'] + 1} of {count} of a "
                                  f"split GGUF; open its first shard (-00001-of-{count:05d})")
        for n, shard in enumerate(shard_paths(path, count)[1:], start=1):
            if not shard.is_file():
                raise CheckpointError(f"{path} is split in {count} files, but shard {n + 1} "
                                      f"({shard.name}) is missing")
            sh = map_file(shard)
            shard_meta, shard_infos, shard_start = _read_header(sh)
            got = (_split_field(sh, shard_meta, "split.no", None),
                   _split_field(sh, shard_meta, "split.count", None))
            if got != (n, count):
                sh.fail(f"split.no/split.count are {got[0]}/{got[1]}, expected {n}/{count} "
                        f"for shard {n + 1} of {path.name}")
            _shard_tensors(sh, shard_meta, shard_infos, shard_start, tensors)
        want = metadata.get("split.tensors.count", len(tensors))
        if want != len(tensors):
            raise CheckpointError(f"{path}: split.tensors.count says {want} tensors, its "
                                  f"{count} shards hold {len(tensors)}")
    return Checkpoint(path, "gguf", metadata, tensors)
