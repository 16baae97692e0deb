"""GGUF loading: files written with gguf.GGUFWriter, checked against gguf.GGUFReader; damaged
files (truncated, flipped header bytes, unknown or unsupported types, bad shapes)."""
from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import poot_quant
import pytest
from poot.errors import CheckpointError
from poot.plugin import PluginManager
from poot_quant import plugin
from poot_quant.gguf_file import open_gguf

Q = gguf.GGMLQuantizationType


def write_gguf(path: Path, rng) -> dict[str, tuple]:
    """A small GGUF with quantized, dense and 3-D tensors; returns name -> (qtype, values)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "wörld"])
    w.add_array("tokenizer.ggml.token_type", [3, 1, 1])
    w.add_array("llama.some_floats", [0.5, -1.25])
    expect = {}

    def quantized(name, qtype, shape):
        values = rng.standard_normal(shape).astype(np.float32)
        fmt = poot_quant.get(f"gguf:{qtype.name}")
        (raw,) = fmt.quantize(values.reshape(-1, shape[-1]))
        w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=qtype)
        expect[name] = (qtype, fmt.dequantize([raw], (raw.shape[0], shape[-1])).reshape(shape))

    quantized("blk.0.attn_q.weight", Q.Q4_K, (4, 512))
    quantized("token_embd.weight", Q.Q8_0, (6, 64))
    quantized("blk.0.ffn_gate_exps.weight", Q.Q4_0, (2, 3, 64))
    norm = rng.standard_normal(64).astype(np.float32)
    w.add_tensor("output_norm.weight", norm)
    expect["output_norm.weight"] = (Q.F32, norm)
    half = rng.standard_normal((5, 32)).astype(np.float16)
    w.add_tensor("output.weight", half)
    expect["output.weight"] = (Q.F16, half.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


@pytest.fixture
def small_gguf(tmp_path, rng):
    path = tmp_path / "small.gguf"
    return path, write_gguf(path, rng)


def test_open_keeps_tensors_packed_and_mapped(small_gguf):
    path, expect = small_gguf
    with poot_quant.open_checkpoint(path) as ckpt:
        assert ckpt.kind == "gguf" and set(ckpt.tensors) == set(expect)
        for name, (qtype, values) in expect.items():
            info = ckpt[name]
            assert info.shape == values.shape  # logical order: ne reversed
            for src in info.sources:
                assert isinstance(src.base, np.memmap) or isinstance(src, np.memmap)
                assert not src.flags.writeable
            if qtype in (Q.F32, Q.F16):
                assert info.dtype.value == {Q.F32: "f32", Q.F16: "f16"}[qtype]
                assert info.packed is None
            else:
                assert info.dtype is None and info.packed.format == f"gguf:{qtype.name}"
                assert info.packed.shape == (int(np.prod(values.shape[:-1])), values.shape[-1])
            np.testing.assert_array_equal(info.dequantize(), values)
            offset, length, mtime = info.ref.payload.rsplit(":", 3)[1:]
            assert int(length) == info.nbytes and int(mtime) == path.stat().st_mtime_ns
            assert info.ref.tensor == name and info.ref.format == str(info.storage).split("[")[0]
        assert ckpt.metadata["llama.block_count"] == 2
        assert ckpt.metadata["tokenizer.ggml.tokens"] == ["<s>", "hello", "wörld"]
        with pytest.raises(CheckpointError, match="is packed"):
            ckpt["token_embd.weight"].array()
        with pytest.raises(CheckpointError, match="no tensor 'nope'"):
            ckpt["nope"]
    assert ckpt.tensors == {}


def test_metadata_and_bytes_equal_gguf_reader(small_gguf):
    path, _ = small_gguf
    reader = gguf.GGUFReader(str(path))
    ckpt = open_gguf(path)
    assert ckpt.metadata == {k: f.contents() for k, f in reader.fields.items()}
    for t in reader.tensors:
        mine = ckpt[t.name].sources[0]
        assert np.array_equal(np.asarray(mine).reshape(-1).view(np.uint8),
                              np.asarray(t.data).reshape(-1).view(np.uint8))


def test_plugin_claims_gguf_and_passes_on_other_files(small_gguf, tmp_path):
    path, _ = small_gguf
    pm = PluginManager(load_entry_points=False)
    pm.register(plugin, name="poot_quant")
    assert set(poot_quant.formats()) <= set(pm.formats())
    assert pm.open_checkpoint(str(path)).kind == "gguf"
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert pm.open_checkpoint(str(other)) is None
    assert pm.open_checkpoint(str(path), "pytorch") is None


def _header_end(path: Path) -> int:
    ckpt = open_gguf(path)
    return min(int(i.ref.payload.rsplit(":", 3)[1]) for i in ckpt.tensors.values())


def test_truncated_files_are_refused(small_gguf, tmp_path):
    path, expect = small_gguf
    data = path.read_bytes()
    header = _header_end(path)
    cut_points = sorted({1, 4, 8, 23, 24, 40, 100, header // 2, header - 1, header + 10,
                         len(data) - 1})
    for cut in cut_points:
        damaged = tmp_path / f"cut{cut}.gguf"
        damaged.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=str(damaged.name)):
            poot_quant.open_checkpoint(damaged, "gguf")
    damaged.write_bytes(data[:-1])
    with pytest.raises(CheckpointError, match="truncated: tensor 'output.weight'"):
        open_gguf(damaged)
    damaged.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        open_gguf(damaged)


def test_flipped_header_bytes_never_crash(small_gguf, tmp_path):
    """Every header byte inverted in turn: a CheckpointError or a file whose every tensor
    lies inside it; never another exception, a hang or an out-of-bounds view."""
    path, _ = small_gguf
    data = path.read_bytes()
    damaged = tmp_path / "flip.gguf"
    refused = 0
    for pos in range(_header_end(path)):
        damaged.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1:])
        try:
            ckpt = open_gguf(damaged)
        except CheckpointError as exc:
            assert str(damaged) in str(exc)
            refused += 1
            continue
        for info in ckpt.tensors.values():
            offset, length = (int(x) for x in info.ref.payload.rsplit(":", 3)[1:3])
            assert offset + length <= len(data) and info.nbytes == length
    assert refused > 50


def _patch_tensor_info(data: bytes, name: str, field: str, value: int) -> bytes:
    """Rewrite the n_dims-th dim or the type id of tensor `name` in a GGUF header."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    offset = at + 4 if field == "ne0" else at + 4 + 8 * n_dims
    fmt = "<Q" if field == "ne0" else "<I"
    return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt):]


def test_unknown_type_and_bad_shapes_are_refused(small_gguf, tmp_path):
    path, _ = small_gguf
    data = path.read_bytes()
    damaged = tmp_path / "bad.gguf"
    damaged.write_bytes(_patch_tensor_info(data, "blk.0.attn_q.weight", "type", 99))
    with pytest.raises(CheckpointError, match="'blk.0.attn_q.weight' has unknown GGML type id 99"):
        open_gguf(damaged)
    damaged.write_bytes(_patch_tensor_info(data, "blk.0.attn_q.weight", "type", int(Q.IQ2_XXS)))
    with pytest.raises(CheckpointError, match="stored as IQ2_XXS, which poot_quant cannot"):
        open_gguf(damaged)
    damaged.write_bytes(_patch_tensor_info(data, "blk.0.attn_q.weight", "ne0", 500))
    with pytest.raises(CheckpointError, match="500 values per row, not a multiple of its block"):
        open_gguf(damaged)
    damaged.write_bytes(_patch_tensor_info(data, "token_embd.weight", "ne0", 1 << 40))
    with pytest.raises(CheckpointError, match="truncated: tensor 'token_embd.weight'"):
        open_gguf(damaged)


@pytest.fixture
def smollm2(smollm2_gguf):
    return smollm2_gguf


def test_smollm2_layout_and_values(smollm2):
    ckpt = poot_quant.open_checkpoint(smollm2)
    assert len(ckpt.tensors) == 272 and ckpt.metadata["llama.block_count"] == 30
    emb, q, k, norm = (ckpt[n] for n in ("token_embd.weight", "blk.0.attn_q.weight",
                                         "blk.0.attn_k.weight", "blk.0.attn_norm.weight"))
    assert (emb.shape, emb.packed.format) == ((49152, 576), "gguf:Q8_0")
    assert (q.shape, q.packed.format) == ((576, 576), "gguf:Q4_1")
    assert (k.shape, k.packed.format) == ((192, 576), "gguf:Q4_1")  # 3 KV heads x 64
    assert (norm.shape, norm.dtype.value) == ((576,), "f32")
    # (GGUFReader agrees with this reader byte for byte on written files, above; on this
    # file it alone takes seconds, so the gguf package checks the decode of the bytes)
    want = gguf.quants.dequantize(np.asarray(k.sources[0]), Q.Q4_1)
    assert np.array_equal(k.dequantize(), want)
    assert np.abs(want).max() < 10 and np.abs(emb.dequantize()[:100]).max() < 10


def test_smollm2_open_stays_below_file_size_in_memory(smollm2):
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss of the forking (pytest) process into
    # the child across exec, while the high-water mark of the new address space starts fresh
    code = ("import sys, poot_quant; c = poot_quant.open_checkpoint(sys.argv[1]); "
            "print(next(int(line.split()[1]) * 1024 for line in open('/proc/self/status') "
            "if line.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code, str(smollm2)], capture_output=True,
                         text=True, check=True)
    assert int(out.stdout) < smollm2.stat().st_size, out.stdout
