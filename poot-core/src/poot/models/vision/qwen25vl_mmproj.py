"""Qwen2.5-VL's and Qwen2-VL's vision projector GGUFs (llama.cpp's mmproj, projector types
`qwen2.5vl_merger` and `qwen2vl_merger`) read as the tower a Qwen2.5-VL folder holds: a
Qwen25VisionConfig (`qwen2_vl` set for Qwen2-VL's LayerNorms and QuickGELU MLP), tensors
under HF's names below "vision.", so the tower graph (poot.models.vision.qwen25vl) runs it
beside a `qwen2vl` GGUF language model.

The converter writes the tower's sizes under `clip.vision.*`: for Qwen2.5-VL which blocks
attend the whole image as `n_wa_pattern` (block i is full where (i + 1) is a multiple of
it), the window in pixels as `window_size` (112 where absent, as llama.cpp's clip reads
it) and SiLU through `clip.use_silu`; Qwen2-VL's blocks all attend the whole image and its
activation is llama.cpp's default, QuickGELU (neither use_silu nor use_gelu). The merge
size is `spatial_merge_size` (2 where absent), the pixels' mean and std are the file's.
For Qwen2-VL the converter writes the tower's output width as `feed_forward_length` (its
config's hidden_size), so the MLP's width is read from `v.blk.0.ffn_up.weight`. The
tensors are the folder's split: the Conv3d patch kernel [hidden, C, 2, p, p] as one
[hidden, C, p, p] kernel per frame (`v.patch_embd.weight`, `.weight.1`), each block's q|k|v
projection as attn_q, attn_k and attn_v (weights and biases), the merger's norm as
`v.post_ln`, its two linears as `mm.0` and `mm.2`; Qwen2-VL's fc1 and fc2 as ffn_up and
ffn_down, its norms with biases. They are joined back here (one host copy each), so the
graph reads them as it reads a folder's.

Pixels are resized as Qwen2.5-VL's processor does, within the file's
`image_min_pixels` / `image_max_pixels` where it states them (else the processor's
defaults); the image tokens are the language model's tokenizer's, the M-RoPE sections its
GGUF's.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from poot.checked import Values
from poot.errors import CheckpointError
from poot.ir.types import WeightRef
from poot.models.vision.config import MAX_DIM, MAX_LAYERS
from poot.models.vision.qwen25vl_config import Qwen25Tokens, Qwen25VisionConfig

#: the projector types the converter writes for Qwen2.5-VL and Qwen2-VL
QWEN25, QWEN2 = "qwen2.5vl_merger", "qwen2vl_merger"
#: llama.cpp's clip: the window's side in pixels where the file states none
WINDOW = 112
_K = "clip.vision."
#: the converter's name in a block -> HF's, per projector type
_LAYER = {QWEN25: {"attn_out": "attn.proj", "ffn_gate": "mlp.gate_proj",
                   "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"},
          QWEN2: {"attn_out": "attn.proj", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}}
#: a block's q, k and v, which the folder stores as one qkv projection
_QKV = ("attn_q", "attn_k", "attn_v")
_PATCH = "vision.patch_embed.proj.weight"
_FRAMES = ("v.patch_embd.weight", "v.patch_embd.weight.1")


def read_config(v: Values, text_dim: int, kind: str, tensors: dict) -> Qwen25VisionConfig:
    """The tower of a clip GGUF's `clip.vision.*` keys (and, for Qwen2-VL, its MLP's width
    from `tensors`), for a language model of width `text_dim`."""
    def size(key, hi=MAX_DIM):
        return v.integer(_K + key, lo=1, hi=hi)

    # llama.cpp's clip runs GELU where use_gelu is set, else SiLU where use_silu is, else
    # QuickGELU: Qwen2.5-VL's MLP is SiLU-gated, Qwen2-VL's QuickGELU
    qwen2 = kind == QWEN2
    if v.flag("clip.use_gelu", False):
        v.fail("clip.use_gelu", True, f"(another activation): {kind}'s tower runs "
                                      f"{'QuickGELU' if qwen2 else 'a SiLU-gated MLP'}")
    if v.flag("clip.use_silu", False) == qwen2:
        v.fail("clip.use_silu", v.values.get("clip.use_silu"),
               "must be unset (Qwen2-VL's tower runs QuickGELU)" if qwen2 else
               "must be true (Qwen2.5-VL's tower runs a SiLU-gated MLP)")
    layers = size("block_count", MAX_LAYERS)
    if qwen2 and v.has(_K + "n_wa_pattern"):
        v.fail(_K + "n_wa_pattern", v.values[_K + "n_wa_pattern"],
               "is set, but Qwen2-VL's blocks all attend the whole image")
    every = 1 if qwen2 else v.integer(_K + "n_wa_pattern", lo=1, hi=MAX_LAYERS)
    patch = size("patch_size", 1024)
    merge = v.integer(_K + "spatial_merge_size", 2, lo=1, hi=16)
    up = tensors.get("v.blk.0.ffn_up.weight") if qwen2 else None
    ffn = v.check_int("v.blk.0.ffn_up.weight's rows", up.shape[0], 1, MAX_DIM) \
        if up is not None else size("feed_forward_length")
    c = Qwen25VisionConfig(
        hidden=size("embedding_length"), layers=layers, heads=size("attention.head_count"),
        ffn=ffn, patch=patch,
        temporal=2, merge=merge,
        # no Qwen2-VL block attends by window: its windows only group the rows
        window=4 * patch * merge if qwen2 else
        v.integer(_K + "window_size", WINDOW, lo=1, hi=1 << 14),
        full_blocks=tuple(i for i in range(layers) if (i + 1) % every == 0),
        text_dim=int(text_dim),
        eps=v.number(_K + "attention.layer_norm_epsilon", positive=True, hi=1.0),
        qwen2_vl=qwen2)
    if c.hidden % c.heads or c.head_dim % 4:
        v.fail(_K + "attention.head_count", c.heads, f"must divide embedding_length "
                                                     f"{c.hidden} into heads of a multiple "
                                                     f"of 4 (2-D RoPE)")
    if c.window % c.factor or not c.window_units:
        v.fail(_K + "window_size", c.window, f"must be a multiple of patch_size x "
                                             f"spatial_merge_size {c.factor}")
    dim = v.integer(_K + "projection_dim", text_dim, lo=1, hi=MAX_DIM)
    if dim != text_dim:
        v.fail(_K + "projection_dim", dim, f"differs from the language model's embedding "
                                           f"length {text_dim}")
    return c


def pixel_processing(v: Values, c: Qwen25VisionConfig):
    """Qwen2.5-VL's resize within the file's pixel bounds (the processor's defaults where it
    states none), bicubic, rescaled by 1/255, then the file's mean and std."""
    from poot.models.vision.qwen25vl_preprocess import MAX_AREA, Qwen25Processing

    d = Qwen25Processing()
    mean, std = (tuple(v.number_list(_K + k, max_len=4)) for k in ("image_mean", "image_std"))
    if len(mean) != c.channels or len(std) != c.channels or min(std) <= 0:
        v.fail(_K + "image_std", list(std), f"and image_mean must give {c.channels} values, "
                                            f"std positive")
    lo = v.integer(_K + "image_min_pixels", d.min_pixels, lo=1, hi=MAX_AREA)
    hi = v.integer(_K + "image_max_pixels", max(d.max_pixels, lo), lo=lo, hi=MAX_AREA)
    return Qwen25Processing(lo, hi, c.patch, c.temporal, c.merge, d.resample, 1 / 255,
                            mean, std)


def tensor_names(c: Qwen25VisionConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """mmproj tensor name -> (poot's name, or a joined tensor's part's; its shape in numpy
    order)."""
    d, f, p, k = c.hidden, c.ffn, c.patch, c.hidden * c.merge * c.merge
    norms = ("weight", "bias") if c.qwen2_vl else ("weight",)     # LayerNorm or RMSNorm
    layer = _LAYER[QWEN2 if c.qwen2_vl else QWEN25]
    out = {name: (f"{_PATCH}.{t}", (d, c.channels, p, p)) for t, name in enumerate(_FRAMES)}
    out.update({f"v.post_ln.{n}": (f"vision.merger.ln_q.{n}", (d,)) for n in norms})
    out.update({"mm.0.weight": ("vision.merger.mlp.0.weight", (k, k)),
                "mm.0.bias": ("vision.merger.mlp.0.bias", (k,)),
                "mm.2.weight": ("vision.merger.mlp.2.weight", (c.text_dim, k)),
                "mm.2.bias": ("vision.merger.mlp.2.bias", (c.text_dim,))})
    shapes = {"ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}
    for i in range(c.layers):
        b = f"vision.blocks.{i}."
        for n in norms:
            out[f"v.blk.{i}.ln1.{n}"] = (f"{b}norm1.{n}", (d,))
            out[f"v.blk.{i}.ln2.{n}"] = (f"{b}norm2.{n}", (d,))
        for g in (*_QKV, *layer):
            w = shapes.get(g, (d, d))
            ours = b + layer.get(g, g.replace("_", "."))
            out[f"v.blk.{i}.{g}.weight"] = (ours + ".weight", w)
            out[f"v.blk.{i}.{g}.bias"] = (ours + ".bias", w[:1])
    return out


def _joined(parts: list, name: str, axis: int):
    """One tensor of the parts' values (`axis` 0: stacked by rows; 2: as the kernel's
    frames), under its own identity; f32 unless the parts share a dtype."""
    from poot.dtypes import DType

    same = len({p.dtype for p in parts}) == 1
    arrays = [np.asarray(p.sources[0]) if same else p.dequantize() for p in parts]
    array = np.stack(arrays, axis) if axis else np.concatenate(arrays, 0)
    first = parts[0]
    ref = WeightRef(first.ref.checkpoint, name, "+".join(p.ref.payload for p in parts),
                    first.ref.format if same else "f32")
    return replace(first, name=name, shape=tuple(array.shape),
                   dtype=first.dtype if same else DType.F32, sources=(array,), ref=ref)


def join(tensors: dict, c: Qwen25VisionConfig) -> dict:
    """The checked tensors (poot's names, the parts apart) with the patch kernel's frames
    and each block's q, k and v joined as the folder stores them."""
    out = dict(tensors)
    frames = [out.pop(f"{_PATCH}.{t}") for t in range(len(_FRAMES))]
    out[_PATCH] = _joined(frames, _PATCH, 2)
    for i in range(c.layers):
        attn = f"vision.blocks.{i}.attn."
        for kind in ("weight", "bias"):
            parts = [out.pop(f"{attn}{g[-1]}.{kind}") for g in _QKV]
            out[f"{attn}qkv.{kind}"] = _joined(parts, f"{attn}qkv.{kind}", 0)
    return out


def image_tokens(tokenizer, config, c: Qwen25VisionConfig, processing, where: str):
    """The image tokens the language model's tokenizer spells (each one token), with its
    M-RoPE sections."""
    from poot.models.vision.qwen25vl_chat import END, PAD, START

    def token(text):
        ids = tokenizer.encode(text, add_special=False)
        if len(ids) != 1:
            raise CheckpointError(f"{where}: the language model's tokenizer has no {text} "
                                  f"token (a Qwen-VL projector's image prompt needs it)")
        return ids[0]

    return Qwen25Tokens(token(PAD), token(START), token(END), config.mrope, c.merge,
                        tiling=processing)


def open_parts(ckpt, v: Values, kind: str, config, tokenizer, path: Path):
    """The VisionParts of a Qwen2.5-VL or Qwen2-VL mmproj (opened as `ckpt`, its keys `v`,
    its projector type `kind`) for a qwen2vl language model (its LlamaConfig and
    Tokenizer)."""
    from poot.models.vision.mmproj_tensors import check_tensors
    from poot.models.vision.weights import VisionParts

    c = read_config(v, config.dim, kind, ckpt.tensors)
    processing = pixel_processing(v, c)
    tensors = join(check_tensors(ckpt.tensors, tensor_names(c), str(path)), c)
    return VisionParts(c, image_tokens(tokenizer, config, c, processing, str(path)), tensors,
                       path, processing=processing, offset_norms=())
