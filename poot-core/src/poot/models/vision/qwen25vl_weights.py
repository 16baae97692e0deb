"""A Qwen2.5-VL folder's tensors split into the text model's (a Qwen2, HF text names) and
the tower's ("vision."): transformers 4.x saves `model.*` (text), `visual.*` and
`lm_head.weight`; 5.x saves `model.language_model.*`, `model.visual.*` and `lm_head.weight`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from poot.models.vision.weights import TextView, VisionParts, split

#: checkpoint prefix -> the prefix poot reads it under, the longer spellings first
_PREFIXES = (("model.visual.", "vision."), ("visual.", "vision."),
             ("model.language_model.", "model."), ("model.", "model."),
             ("lm_head.", "lm_head."))


def open_qwen25vl(checkpoint, max_seq: int | None = None):
    """(a TextView of the checkpoint, the text model's LlamaConfig with its M-RoPE
    sections)."""
    from poot.models import config as C
    from poot.models.vision.qwen25vl_config import read_qwen25vl
    from poot.models.vision.qwen25vl_preprocess import read_qwen25_processing

    where = str(checkpoint.path)
    text_cfg, vision_cfg, tokens = read_qwen25vl(checkpoint.metadata, where)
    text, vision = split(checkpoint.tensors, where, _PREFIXES, "Qwen2.5-VL")
    processing = read_qwen25_processing(Path(checkpoint.path), vision_cfg)
    # each image's token count depends on its size, as where an image is tiled
    tokens = replace(tokens, tiling=processing)
    parts = VisionParts(vision_cfg, tokens, vision, Path(checkpoint.path), processing,
                        offset_norms=())
    view = TextView(checkpoint, text_cfg, text, parts)
    config = replace(C.from_hf(text_cfg, text, max_seq), mrope=tokens.sections)
    return view, config
