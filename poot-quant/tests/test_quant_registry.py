"""Public names, the descriptor class, the plugin hooks and checkpoint-level refusals."""
from __future__ import annotations

import numpy as np
import poot.formats
import poot_quant
import pytest
from poot.errors import CheckpointError, FormatError
from poot.plugin import PluginManager
from poot_quant import plugin

EXPECTED = {f"gguf:{t}" for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                                  "Q5_K", "Q6_K", "IQ4_NL", "MXFP4")} | {
    "gptq:int4", "gptq:int8", "awq:int4", "fp8:e4m3", "fp8:e5m2", "nvfp4", "mxfp4"}


def test_public_names():
    assert poot_quant.formats() == sorted(EXPECTED)
    assert poot_quant.PackedWeight is poot.formats.PackedWeight
    for name in poot_quant.formats():
        fmt = poot_quant.get(name)
        assert fmt.name == name
        assert all(callable(getattr(fmt, m)) for m in ("roles", "dequantize", "decode_expr",
                                                        "quantize"))
    with pytest.raises(FormatError, match="unknown packed weight format 'gguf:Q9_9'.*awq:int4"):
        poot_quant.get("gguf:Q9_9")


def test_descriptor_roles_and_decode(rng):
    fmt = poot_quant.get("gptq:int4")
    desc = poot_quant.PackedWeight("gptq:int4", (16, 64), {"group_size": 32, "sym": False})
    w = rng.standard_normal(desc.shape).astype(np.float32)
    sources = fmt.quantize(w, **desc.attr_dict)
    roles = fmt.roles(desc.shape, desc.attr_dict)
    assert [r.role for r in roles] == ["qweight", "qzeros", "scales"]
    assert [s.shape for s in sources] == [r.type.shape for r in roles]
    assert np.abs(fmt.dequantize(sources, desc.shape, **desc.attr_dict) - w).max() < 0.5


def test_plugin_hooks_register_every_format():
    pm = PluginManager(load_entry_points=False)
    pm.register(plugin, name="poot_quant")
    table = pm.formats()
    assert EXPECTED <= set(table) and all(table[n] is poot_quant.get(n) for n in EXPECTED)


def test_checkpoint_refusals(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        poot_quant.open_checkpoint(tmp_path / "missing.gguf")
    with pytest.raises(CheckpointError, match="neither a GGUF file nor a safetensors"):
        poot_quant.open_checkpoint(tmp_path)
    text = tmp_path / "model.gguf"
    text.write_text("not a gguf")
    with pytest.raises(CheckpointError, match="is not a GGUF file .it starts with text"):
        poot_quant.open_checkpoint(text, "gguf")


def test_unknown_attributes_are_refused():
    with pytest.raises(FormatError, match="unknown attribute.*group_sz.*reads: act_order"):
        poot_quant.get("gptq:int4").roles((8, 64), {"group_sz": 32})
    with pytest.raises(FormatError, match="gguf:Q4_0: unknown attribute.*reads: none"):
        poot_quant.get("gguf:Q4_0").dequantize([np.zeros((1, 18), np.uint8)], (1, 32), scale=2)
