"""Open a safetensors file or an HF-style folder, keeping quantized weights packed.

The file format is an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, data_offsets) and the data region. The header is read
here and every tensor becomes an np.memmap view after its offsets are checked
against the file size (`safetensors.safe_open(framework="numpy")` hands out each
tensor as an in-memory copy, and older releases cannot give bf16). Tests write
their files with the `safetensors` package. Packed weights are recognised by
their tensor names:

  GPTQ / AWQ   X.qweight, X.qzeros, X.scales (+ X.g_idx)  -> "X.weight", per
               config.json "quantization_config" (or quantize_config.json)
  FP8          X.weight (F8_E4M3 / F8_E5M2) + X.weight_scale or X.weight_scale_inv
  NVFP4        X.weight (U8) + X.weight_scale (F8_E4M3) + X.weight_scale_2
  MXFP4        X_blocks (U8 [..., N, K/32, 16]) + X_scales       -> "X"
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
from poot.checked import Values, confined, load_json, parse_json
from poot.dtypes import DType
from poot.errors import CheckpointError, ConfigError, FormatError
from poot.formats import PackedWeight
from poot.ir.types import WeightRef

from poot_quant.checkpoint import Checkpoint, TensorInfo, payload_key
from poot_quant.registry import get

_DTYPES = {
    "F32": DType.F32, "F16": DType.F16, "BF16": DType.BF16, "I32": DType.I32,
    "I16": DType.I16, "I8": DType.I8, "U8": DType.U8, "U16": DType.U16, "U32": DType.U32,
    "F8_E4M3": DType.F8E4M3, "F8_E5M2": DType.F8E5M2, "F8_E8M0": DType.F8E8M0,
}
_MAX_HEADER = 100 * 1024 * 1024


def is_safetensors(path: Path) -> bool:
    if path.is_dir():
        return any(path.glob("*.safetensors"))
    return path.suffix == ".safetensors"


class _Raw:
    """One stored tensor: file, dtype, shape and its memory-mapped view."""

    def __init__(self, file: Path, name: str, dtype: DType, shape, start: int, array):
        self.file, self.name, self.dtype, self.shape = file, name, dtype, tuple(shape)
        self.start, self.array = start, array

    def ref_key(self) -> str:
        return payload_key(self.file, self.start, int(self.array.nbytes))


def _fail(file: Path, message: str):
    raise CheckpointError(f"safetensors file {file}: {message}")


def read_file(file: Path) -> dict[str, _Raw]:
    size = file.stat().st_size
    if size < 8:
        _fail(file, f"truncated: {size} bytes, not even the 8-byte header length")
    with file.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(size - 8, _MAX_HEADER):
            _fail(file, f"truncated or corrupted: header length {header_len}, file size {size}")
        try:
            header = parse_json(f.read(header_len), "header")
        except ConfigError as exc:
            _fail(file, f"corrupted JSON {exc}")
    data_start = 8 + header_len
    mm = np.memmap(file, np.uint8, mode="r") if size > data_start else np.zeros(0, np.uint8)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(file, name, entry, data_start, size, mm)
    return out


def _entry(file: Path, name: str, entry: Any, data_start: int, size: int, mm) -> _Raw:
    where = f"tensor {name!r}"
    v = Values(entry, f"safetensors file {file}: {where}")
    dtype_name = v.text("dtype")
    shape = v.int_list("shape", lo=0, max_len=8)
    offsets = v.int_list("data_offsets", lo=0, max_len=2)
    if len(offsets) != 2:
        v.fail("data_offsets", offsets, "is not [begin, end]")
    begin, end = offsets
    if dtype_name not in _DTYPES:
        _fail(file, f"{where} has dtype {dtype_name}, which poot has no DType for "
                    f"(readable: {', '.join(_DTYPES)})")
    dtype = _DTYPES[dtype_name]
    nbytes = math.prod(shape) * dtype.itemsize
    if not 0 <= begin <= end or end - begin != nbytes:
        _fail(file, f"{where}: data_offsets [{begin}, {end}] do not hold its {nbytes} bytes "
                    f"({dtype_name} {shape})")
    if data_start + end > size:
        _fail(file, f"truncated: {where} needs bytes [{data_start + begin}, {data_start + end}),"
                    f" the file has {size}")
    array = mm[data_start + begin:data_start + end].view(dtype.numpy).reshape(shape)
    return _Raw(file, name, dtype, shape, data_start + begin, array)


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = Values(load_json(index), index).mapping("weight_map")
        # every shard the index names stays inside the folder (no absolute path, no ..)
        files = sorted({confined(path, f, index, f"weight_map[{n!r}]")
                        for n, f in weight_map.items()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index} names {f.name}, which is missing")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path} holds no .safetensors file")
    return files


def _json(file: Path) -> dict:
    return load_json(file) if file.is_file() else {}


def quantization_config(folder: Path, config: dict) -> dict:
    q = config.get("quantization_config")
    if isinstance(q, dict):
        return q
    # AutoGPTQ's quantize_config.json and AutoAWQ's quant_config.json often lack quant_method:
    # the file itself says which method wrote it
    for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq")):
        q = _json(folder / name)
        if q:
            return {"quant_method": method, **q}
    return {}


def open_safetensors(path: str | Path) -> Checkpoint:
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    raw: dict[str, _Raw] = {}
    for file in _files(path):
        for name, r in read_file(file).items():
            if name in raw:
                raise CheckpointError(f"tensor {name!r} is in both {raw[name].file} and {file}")
            raw[name] = r
    config = _json(folder / "config.json") if path.is_dir() else {}
    tensors = _Grouper(raw, quantization_config(folder, config)).tensors()
    return Checkpoint(path, "safetensors", config, tensors)


def _widens(part: _Raw, want: DType) -> bool:
    """An f16/bf16 scale where the format keeps f32 scales: widened exactly (a copy of the
    small scale tensor only; weights themselves are never converted)."""
    return want is DType.F32 and part.dtype in (DType.F16, DType.BF16)


class _Grouper:
    """Turns stored tensors into logical ones, consuming the parts of packed weights."""

    def __init__(self, raw: dict[str, _Raw], qconfig: dict):
        self.raw, self.qconfig, self.used = raw, qconfig, set()
        self.out: dict[str, TensorInfo] = {}

    def tensors(self) -> dict[str, TensorInfo]:
        for name in sorted(self.raw):
            if name.endswith(".qweight"):
                self.int_grouped(name[:-len(".qweight")])
            elif name.endswith("_blocks") and name[:-len("_blocks")] + "_scales" in self.raw:
                self.mxfp4(name[:-len("_blocks")])
        for name in sorted(self.raw):
            r = self.raw[name]
            if name in self.used or not name.endswith(".weight"):
                continue
            prefix = name[:-len(".weight")]
            if r.dtype in (DType.F8E4M3, DType.F8E5M2):
                self.fp8(prefix)
            elif r.dtype is DType.U8 and prefix + ".weight_scale_2" in self.raw:
                self.nvfp4(prefix)
        for name, r in self.raw.items():
            if name not in self.used:
                ref = WeightRef(str(r.file), name, r.ref_key(), r.dtype.value)
                self.out[name] = TensorInfo(name, r.shape, r.dtype, None, (r.array,), ref)
        return dict(sorted(self.out.items()))

    def need(self, name: str, owner: str) -> _Raw:
        if name not in self.raw:
            raise CheckpointError(f"packed tensor {owner!r} has no companion {name!r}")
        return self.raw[name]

    def add(self, name: str, shape, fmt: str, attrs: dict, parts: list[_Raw]) -> None:
        """Check the parts against the format's roles, then record the packed tensor."""
        rows, k = math.prod(shape[:-1]), shape[-1]
        packed = PackedWeight(fmt, (rows, k), attrs)
        where = f"tensor {name!r} ({fmt}) in {parts[0].file}"
        try:
            roles = get(fmt).roles(packed.shape, packed.attr_dict)
        except FormatError as exc:
            raise CheckpointError(f"{where}: {exc}") from exc
        sources = []
        for spec, part in zip(roles, parts, strict=True):
            want = spec.type.dtype
            same_kind = part.dtype is want or part.dtype.itemsize == 1 == want.itemsize
            if part.array.size != spec.type.size or not (same_kind or _widens(part, want)):
                raise CheckpointError(
                    f"{where}: {part.name!r} is {part.dtype.value}{list(part.shape)}, but role "
                    f"{spec.role!r} of a [{rows}, {k}] weight needs {spec.type}")
            # a byte role stored under another byte dtype (MXFP4 scales saved as U8) is
            # viewed as the role's dtype, so every runtime binds the type it declares
            array = part.array.view(want.numpy) if same_kind and part.dtype is not want \
                else part.array if same_kind else part.array.astype(want.numpy)
            sources.append(array.reshape(spec.type.shape))
        self.used.update(p.name for p in parts)
        key = "+".join(p.ref_key() for p in parts)
        ref = WeightRef(str(parts[0].file), name, key, fmt)
        self.out[name] = TensorInfo(name, tuple(shape), None, packed, tuple(sources), ref)

    # -- the recognised layouts ---------------------------------------------------------
    def int_grouped(self, prefix: str) -> None:
        owner = prefix + ".qweight"
        method = str(self.qconfig.get("quant_method", "")).lower()
        if method not in ("gptq", "awq"):
            raise CheckpointError(f"tensor {owner!r} in {self.raw[owner].file} is GPTQ/AWQ-packed "
                                  f"but config.json has no gptq/awq quantization_config "
                                  f"(quant_method {method or 'missing'!r})")
        qweight = self.raw[owner]
        qzeros, scales = self.need(prefix + ".qzeros", owner), self.need(prefix + ".scales", owner)
        q = Values(self.qconfig, "quantization_config")
        bits = q.integer("bits", q.integer("w_bit", 4, lo=1, hi=8), lo=1, hi=8)
        group_size = q.integer("group_size", q.integer("q_group_size", 128, lo=-1, hi=1 << 20),
                               lo=-1, hi=1 << 20)
        if group_size == 0:
            q.fail("group_size", 0, "is not -1 or a positive group size")
        if len(qweight.shape) != 2:
            raise CheckpointError(f"tensor {owner!r} in {qweight.file} has shape "
                                  f"{list(qweight.shape)}; expected 2 dimensions")
        if method == "awq":
            version = str(self.qconfig.get("version", "gemm")).lower()
            k, n = qweight.shape[0], qweight.shape[1] * 8
            attrs = {"group_size": group_size, "version": version}
            self.add(prefix + ".weight", (n, k), "awq:int4", attrs, [qweight, qzeros, scales])
            return
        k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
        fmt = f"gptq:int{bits}"
        attrs = {"group_size": group_size, "sym": bool(self.qconfig.get("sym", True)),
                 "version": "v2" if self.qconfig.get("checkpoint_format") == "gptq_v2" else "v1"}
        parts = [qweight, qzeros, scales]
        g_idx = self.raw.get(prefix + ".g_idx")
        if g_idx is not None:
            gs = k if group_size == -1 else group_size
            trivial = g_idx.array.size == k and np.array_equal(g_idx.array, np.arange(k) // gs)
            if self.qconfig.get("desc_act") or not trivial:
                attrs["act_order"] = True
                parts.append(g_idx)
                self.check_g_idx(prefix, g_idx, k, gs)
            self.used.add(g_idx.name)
        self.add(prefix + ".weight", (n, k), fmt, attrs, parts)

    def check_g_idx(self, prefix: str, g_idx: _Raw, k: int, gs: int) -> None:
        groups = -(-k // gs)
        values = np.asarray(g_idx.array)
        if values.size == k and (values.min() < 0 or values.max() >= groups):
            raise CheckpointError(f"tensor {g_idx.name!r} in {g_idx.file} holds groups outside "
                                  f"[0, {groups}) for {prefix!r}")

    def fp8(self, prefix: str) -> None:
        weight = self.raw[prefix + ".weight"]
        inverse = self.raw.get(prefix + ".weight_scale_inv")  # DeepSeek-style block scales
        scale = inverse or self.raw.get(prefix + ".weight_scale")
        if scale is None or len(weight.shape) != 2:
            return  # a bare FP8 tensor stays a dense F8 tensor
        n, k = weight.shape
        fmt = "fp8:e4m3" if weight.dtype is DType.F8E4M3 else "fp8:e5m2"
        if inverse is None and scale.array.size == 1:
            attrs = {"scale": "tensor"}
        elif inverse is None and scale.shape in ((n,), (n, 1)):
            attrs = {"scale": "channel"}
        else:
            q = Values(self.qconfig, "quantization_config")
            block = q.int_list("weight_block_size", [128, 128], lo=1, hi=1 << 16, max_len=2)
            attrs = {"scale": "block", "block": tuple(block)}
        self.add(prefix + ".weight", (n, k), fmt, attrs, [weight, scale])

    def nvfp4(self, prefix: str) -> None:
        owner = prefix + ".weight"
        weight = self.raw[owner]
        scale = self.need(prefix + ".weight_scale", owner)
        if len(weight.shape) != 2:
            raise CheckpointError(f"NVFP4 tensor {owner!r} in {weight.file} has shape "
                                  f"{list(weight.shape)}; expected [N, K/2]")
        n, k = weight.shape[0], weight.shape[1] * 2
        self.add(owner, (n, k), "nvfp4", {}, [weight, scale, self.raw[prefix + ".weight_scale_2"]])

    def mxfp4(self, prefix: str) -> None:
        blocks, scales = self.raw[prefix + "_blocks"], self.raw[prefix + "_scales"]
        if len(blocks.shape) < 3 or blocks.shape[-1] != 16:
            raise CheckpointError(f"MXFP4 tensor {blocks.name!r} in {blocks.file} has shape "
                                  f"{list(blocks.shape)}; expected [..., N, K/32, 16]")
        shape = (*blocks.shape[:-2], blocks.shape[-2] * 32)
        self.add(prefix, shape, "mxfp4", {}, [blocks, scales])



def write_folder(folder: Path, tensors: dict[str, np.ndarray], config: dict | None = None,
                 shards: int = 1, extra: dict[str, dict] | None = None) -> Path:
    """Write an HF-style folder: model.safetensors (or `shards` files and their index),
    config.json, and any `extra` JSON files (quantize_config.json, ...). What the reader
    above opens; used to build checkpoints in tests and by tools that export them."""
    from poot.optional import require

    save_file = require("safetensors.numpy").save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else \
            "model.safetensors"
        part = {n: np.ascontiguousarray(tensors[n]) for n in names[s::shards]}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
             "weight_map": weight_map}))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=1))
    for name, value in (extra or {}).items():
        (folder / name).write_text(json.dumps(value, indent=1))
    return folder
