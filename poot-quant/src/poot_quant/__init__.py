"""poot_quant: packed weight formats and memory-mapped checkpoint loaders for poot.

    import poot_quant
    poot_quant.formats()                      # ['awq:int4', 'fp8:e4m3', ..., 'nvfp4']
    fmt = poot_quant.get("gguf:Q4_K")
    w = fmt.dequantize([raw_bytes], (n, k))   # float32 [N, K]
    ckpt = poot_quant.open_checkpoint("model.gguf")   # or a safetensors folder

Each format satisfies `poot.formats.WeightFormat`; `PackedWeight` is the IR's
descriptor class itself (re-exported, not redefined).
"""
from __future__ import annotations

from poot.formats import PackedWeight, SourceSpec

from poot_quant.checkpoint import Checkpoint, TensorInfo, open_checkpoint
from poot_quant.registry import ALL_FORMATS, formats, get

__all__ = ["ALL_FORMATS", "Checkpoint", "PackedWeight", "SourceSpec", "TensorInfo", "formats",
           "get", "open_checkpoint"]
