"""safetensors folders written with the safetensors package: plain, GPTQ, AWQ, FP8, NVFP4,
MXFP4 and sharded checkpoints; damaged files and inconsistent shapes."""
from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import poot_quant
import pytest
from poot.errors import CheckpointError
from poot_quant.safetensors_dir import write_folder


def make_folder(path, tensors: dict, config: dict | None = None, shards: int = 1):
    return write_folder(path, tensors, config, shards)


def test_plain_folder_with_bf16_is_memory_mapped(tmp_path, rng):
    values = {"embed.weight": rng.standard_normal((7, 5)).astype(ml_dtypes.bfloat16),
              "norm.weight": rng.standard_normal(5).astype(np.float32),
              "head.weight": rng.standard_normal((3, 5)).astype(np.float16),
              "pos": np.arange(4, dtype=np.int32)}
    folder = make_folder(tmp_path / "plain", values, {"model_type": "llama", "hidden_size": 5},
                         shards=2)
    ckpt = poot_quant.open_checkpoint(folder)
    assert ckpt.kind == "safetensors" and ckpt.metadata["hidden_size"] == 5
    assert set(ckpt.tensors) == set(values)
    for name, v in values.items():
        info = ckpt[name]
        arr = info.array()
        assert info.dtype.numpy == v.dtype and info.shape == v.shape
        assert isinstance(arr.base, np.memmap) or isinstance(arr, np.memmap)
        assert np.array_equal(arr.view(np.uint8), v.view(np.uint8))
        assert info.ref.payload.endswith(str((folder / info.ref.checkpoint).stat().st_mtime_ns))


def quantized_folder(tmp_path, rng, name, attrs, tensor_names, config):
    fmt = poot_quant.get(name)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    sources = fmt.quantize(w, **attrs)
    tensors = dict(zip(tensor_names, sources, strict=False))
    tensors["model.norm.weight"] = np.ones(128, np.float32)
    folder = make_folder(tmp_path / name.replace(":", "_"), tensors, config)
    return folder, fmt.dequantize(sources, w.shape, **attrs)


P = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("name,attrs,names,qconfig,want_attrs", [
    ("gptq:int4", {"group_size": 32, "act_order": True, "sym": False},
     [f"{P}.qweight", f"{P}.qzeros", f"{P}.scales", f"{P}.g_idx"],
     {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False},
     {"group_size": 32, "act_order": True, "sym": False, "version": "v1"}),
    ("gptq:int8", {"group_size": 64, "version": "v2"},
     [f"{P}.qweight", f"{P}.qzeros", f"{P}.scales"],
     {"quant_method": "gptq", "bits": 8, "group_size": 64, "checkpoint_format": "gptq_v2"},
     {"group_size": 64, "sym": True, "version": "v2"}),
    ("awq:int4", {"group_size": 64}, [f"{P}.qweight", f"{P}.qzeros", f"{P}.scales"],
     {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"},
     {"group_size": 64, "version": "gemm"}),
])
def test_gptq_and_awq_folders(tmp_path, rng, name, attrs, names, qconfig, want_attrs):
    folder, want = quantized_folder(tmp_path, rng, name, attrs, names,
                                    {"quantization_config": qconfig})
    ckpt = poot_quant.open_checkpoint(folder)
    assert set(ckpt.tensors) == {f"{P}.weight", "model.norm.weight"}
    info = ckpt[f"{P}.weight"]
    assert info.packed.format == name and info.shape == (32, 128)
    assert info.packed.attr_dict == want_attrs
    assert np.array_equal(info.dequantize(), want)


def test_gptq_trivial_g_idx_is_dropped(tmp_path, rng):
    fmt = poot_quant.get("gptq:int4")
    sources = fmt.quantize(rng.standard_normal((8, 64)).astype(np.float32), group_size=32)
    tensors = dict(zip(["l.qweight", "l.qzeros", "l.scales"], sources, strict=True))
    tensors["l.g_idx"] = (np.arange(64) // 32).astype(np.int32)
    folder = make_folder(tmp_path / "g", tensors, {"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}})
    info = poot_quant.open_checkpoint(folder)["l.weight"]
    assert "act_order" not in info.packed.attr_dict and len(info.sources) == 3


@pytest.mark.parametrize("name,attrs,names,config", [
    ("fp8:e4m3", {"scale": "block"}, [f"{P}.weight", f"{P}.weight_scale_inv"],
     {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}),
    ("fp8:e4m3", {"scale": "channel"}, [f"{P}.weight", f"{P}.weight_scale"], {}),
    ("fp8:e5m2", {"scale": "tensor"}, [f"{P}.weight", f"{P}.weight_scale"], {}),
    ("nvfp4", {}, [f"{P}.weight", f"{P}.weight_scale", f"{P}.weight_scale_2"], {}),
])
def test_fp8_and_nvfp4_folders(tmp_path, rng, name, attrs, names, config):
    folder, want = quantized_folder(tmp_path, rng, name, attrs, names, config)
    info = poot_quant.open_checkpoint(folder)[f"{P}.weight"]
    assert info.packed.format == name and info.packed.attr_dict.get("scale") == attrs.get("scale")
    assert np.array_equal(info.dequantize(), want)


def test_mxfp4_expert_stack(tmp_path, rng):
    fmt = poot_quant.get("mxfp4")
    w = rng.standard_normal((2 * 6, 64)).astype(np.float32)
    blocks, scales = fmt.quantize(w)
    tensors = {"mlp.experts.down_proj_blocks": blocks.reshape(2, 6, 2, 16),
               "mlp.experts.down_proj_scales": scales.view(np.uint8).reshape(2, 6, 2)}
    ckpt = poot_quant.open_checkpoint(make_folder(tmp_path / "mx", tensors))
    info = ckpt["mlp.experts.down_proj"]
    assert info.shape == (2, 6, 64) and info.packed.shape == (12, 64)
    assert np.array_equal(info.dequantize(), fmt.dequantize([blocks, scales], (12, 64))
                          .reshape(2, 6, 64))


def test_damaged_files_are_refused(tmp_path, rng):
    folder = make_folder(tmp_path / "ok", {"a.weight": rng.standard_normal((4, 8)).astype(
        np.float32), "b.weight": np.ones(3, np.float16)})
    file = folder / "model.safetensors"
    data = file.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    bad = tmp_path / "bad"
    bad.mkdir()
    target = bad / "model.safetensors"
    cases = {
        "not even the 8-byte": data[:5],
        "header length": struct.pack("<Q", len(data)) + data[8:],
        "corrupted JSON": data[:8] + b"}" + data[9:],
        "truncated: tensor": data[:-3],
    }
    for message, content in cases.items():
        target.write_bytes(content)
        with pytest.raises(CheckpointError, match=message) as exc:
            poot_quant.open_checkpoint(bad)
        assert str(target) in str(exc.value)
    header = json.loads(data[8:8 + header_len])
    for patch, message in [({"dtype": "F64"}, "dtype F64"), ({"shape": [5, 8]}, "do not hold"),
                           ({"data_offsets": [0, 1 << 40]}, "do not hold"),
                           ({"shape": "x"}, "shape = 'x' is a string, not a list")]:
        edited = {**header, "a.weight": {**header["a.weight"], **patch}}
        text = json.dumps(edited).encode()
        target.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + header_len:])
        with pytest.raises(CheckpointError, match=message):
            poot_quant.open_checkpoint(bad)


def test_inconsistent_packed_tensors_are_refused(tmp_path, rng):
    fmt = poot_quant.get("gptq:int4")
    qweight, qzeros, scales = fmt.quantize(rng.standard_normal((16, 64)).astype(np.float32),
                                           group_size=32)
    qconfig = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}
    folder = make_folder(tmp_path / "noconf", {"l.qweight": qweight, "l.qzeros": qzeros,
                                                "l.scales": scales})
    with pytest.raises(CheckpointError, match="no gptq/awq quantization_config"):
        poot_quant.open_checkpoint(folder)
    folder = make_folder(tmp_path / "noscales", {"l.qweight": qweight, "l.qzeros": qzeros},
                         qconfig)
    with pytest.raises(CheckpointError, match="no companion 'l.scales'"):
        poot_quant.open_checkpoint(folder)
    folder = make_folder(tmp_path / "shape", {"l.qweight": qweight, "l.qzeros": qzeros,
                                              "l.scales": scales[:, :8]}, qconfig)
    with pytest.raises(CheckpointError, match="tensor 'l.weight' .*'l.scales' is f16"):
        poot_quant.open_checkpoint(folder)
    folder = make_folder(tmp_path / "gidx", {"l.qweight": qweight, "l.qzeros": qzeros,
                                             "l.scales": scales,
                                             "l.g_idx": np.full(64, 7, np.int32)}, qconfig)
    with pytest.raises(CheckpointError, match="holds groups outside"):
        poot_quant.open_checkpoint(folder)


def test_bf16_fp8_scales_are_widened_exactly(tmp_path, rng):
    fmt = poot_quant.get("fp8:e4m3")
    weight, scale = fmt.quantize(rng.standard_normal((8, 32)).astype(np.float32),
                                 scale="channel")
    scale16 = scale.astype(ml_dtypes.bfloat16)
    folder = make_folder(tmp_path / "bf", {"l.weight": weight, "l.weight_scale": scale16})
    info = poot_quant.open_checkpoint(folder)["l.weight"]
    assert info.sources[1].dtype == np.float32
    want = fmt.dequantize([weight, scale16.astype(np.float32)], (8, 32), scale="channel")
    assert np.array_equal(info.dequantize(), want)
