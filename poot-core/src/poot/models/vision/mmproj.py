"""A vision projector GGUF (`mmproj`, as llama.cpp's converter writes it beside a language
model's GGUF) read as the tower and connector a vision-language folder holds: the same
VisionConfig, the same tensor names under "vision."/"projector."/"connector.", so the same
encoder graph runs it.

The file is a `clip` GGUF: `clip.projector_type` (or `clip.vision.projector_type`) gemma3
or idefics3 (qwen2.5vl_merger, qwen2vl_merger: poot.models.vision.qwen25vl_mmproj), the
tower's sizes under `clip.vision.*`, the pixels' mean and std, the
connector's scale factor (Gemma 3: patches per side over rows per side, 4 where absent;
Idefics3: the pixel shuffle's, 2 where absent) and Idefics3's longest edge before tiling
(`clip.vision.preproc_image_size`). Tensors keep HF's layouts in numpy order (the kernel
[hidden, C, p, p], projections [out, in], Gemma 3's input projection [hidden, text_dim]);
Gemma 3's soft-embedding norm is stored as 1 + w (the converter adds the one). The image
tokens come from the language model's tokenizer; the rows' width must be its embedding's.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from poot.checked import Values
from poot.errors import CheckpointError, RequestError
from poot.models.vision.config import MAX_DIM, MAX_IMAGE, MAX_LAYERS, VisionConfig
from poot.models.vision.mmproj_tensors import check_tensors

#: projector type -> the language model family (LlamaConfig.arch) it feeds (Qwen2.5-VL's
#: and Qwen2-VL's: poot.models.vision.qwen25vl_mmproj)
FAMILIES = {"gemma3": "gemma3", "idefics3": "llama", "qwen2.5vl_merger": "qwen2vl",
            "qwen2vl_merger": "qwen2vl"}
#: the connector's scale factor where the file writes none (the converter omits Gemma 3's
#: default)
_SCALE_DEFAULTS = {"gemma3": 4, "idefics3": 2}
#: mmproj name -> poot's name, per layer ("{}")
_LAYER = [("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
          ("attn_v", "self_attn.v_proj"), ("attn_out", "self_attn.out_proj"),
          ("ln1", "layer_norm1"), ("ln2", "layer_norm2"), ("ffn_up", "mlp.fc1"),
          ("ffn_down", "mlp.fc2")]
#: Idefics3's processor resamples with LANCZOS, Gemma 3's with BILINEAR (PIL's numbers)
_LANCZOS, _BILINEAR = 1, 2
_K = "clip.vision."


def tensor_names(c: VisionConfig, projector: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """mmproj tensor name -> (poot's name, its shape in numpy order)."""
    d, f, p, n = c.hidden, c.ffn, c.patch, c.patches_per_side ** 2
    out = {"v.patch_embd.weight": ("vision.embeddings.patch_embedding.weight",
                                   (d, c.channels, p, p)),
           "v.patch_embd.bias": ("vision.embeddings.patch_embedding.bias", (d,)),
           "v.position_embd.weight": ("vision.embeddings.position_embedding.weight", (n, d)),
           "v.post_ln.weight": ("vision.post_layernorm.weight", (d,)),
           "v.post_ln.bias": ("vision.post_layernorm.bias", (d,))}
    shapes = {"ffn_up": ((f, d), (f,)), "ffn_down": ((d, f), (d,))}
    for i in range(c.layers):
        for g, hf in _LAYER:
            w, b = shapes.get(g, ((d,), (d,)) if g.startswith("ln") else ((d, d), (d,)))
            out[f"v.blk.{i}.{g}.weight"] = (f"vision.encoder.layers.{i}.{hf}.weight", w)
            out[f"v.blk.{i}.{g}.bias"] = (f"vision.encoder.layers.{i}.{hf}.bias", b)
    if projector == "gemma3":
        out["mm.soft_emb_norm.weight"] = ("projector.mm_soft_emb_norm.weight", (d,))
        out["mm.input_projection.weight"] = ("projector.mm_input_projection_weight",
                                             (d, c.text_dim))
    else:
        out["mm.model.fc.weight"] = ("connector.modality_projection.proj.weight",
                                     (c.text_dim, d * c.scale * c.scale))
    return out


def projector_type(v: Values) -> tuple[str, str]:
    """(the key that names it, the projector type) of a clip GGUF's metadata."""
    if v.values.get("general.architecture") != "clip":
        v.fail("general.architecture", v.values.get("general.architecture"),
               "is not clip: not a vision projector GGUF (mmproj)")
    if not v.flag("clip.has_vision_encoder", True):
        v.fail("clip.has_vision_encoder", False, "(an audio projector): poot reads images")
    key = "clip.projector_type" if v.has("clip.projector_type") else _K + "projector_type"
    kind = v.text(key)
    if kind not in FAMILIES:
        v.fail(key, kind, f"is a projector poot does not run (it runs "
                          f"{', '.join(sorted(FAMILIES))})")
    return key, kind


def read_config(v: Values, kind: str, text_dim: int) -> VisionConfig:
    """The tower and connector of a clip GGUF's `clip.vision.*` keys, for a language model
    of width `text_dim`."""
    def size(key, hi=MAX_DIM):
        return v.integer(_K + key, lo=1, hi=hi)

    for key, gelu in (("clip.use_silu", False), ("clip.use_gelu", True)):
        if v.flag(key, gelu) != gelu:
            v.fail(key, not gelu, "(another activation): poot runs SigLIP with GELU (tanh)")
    c = VisionConfig(hidden=size("embedding_length"), layers=size("block_count", MAX_LAYERS),
                     heads=size("attention.head_count"), ffn=size("feed_forward_length"),
                     image_size=size("image_size", MAX_IMAGE), patch=size("patch_size"),
                     eps=v.number(_K + "attention.layer_norm_epsilon", positive=True, hi=1.0),
                     text_dim=int(text_dim), connector=kind)
    if c.hidden % c.heads:
        v.fail(_K + "attention.head_count", c.heads, f"must divide embedding_length {c.hidden}")
    if c.image_size % c.patch:
        v.fail(_K + "patch_size", c.patch, f"must divide image_size {c.image_size}")
    dim = v.integer(_K + "projection_dim", text_dim, lo=1, hi=MAX_DIM)
    if dim != text_dim:
        v.fail(_K + "projection_dim", dim, f"differs from the language model's embedding "
                                           f"length {text_dim}")
    side = c.patches_per_side
    scale = v.integer(_K + "projector.scale_factor", _SCALE_DEFAULTS[kind], lo=1, hi=side)
    if side % scale:
        v.fail(_K + "projector.scale_factor", scale, f"must divide the {side} patches per side")
    # Gemma 3's kernel is VisionConfig.pool, read from the rows per side
    return replace(c, mm_tokens=(side // scale) ** 2, scale=scale if kind == "idefics3" else 1)


def pixel_processing(v: Values, c: VisionConfig):
    """How pixels are prepared: Gemma 3's resize to the tower's size, or Idefics3's tiling
    after a resize of the longest edge to `preproc_image_size`; rescaled by 1/255, then the
    file's mean and std."""
    from poot.models.vision.preprocess import MAX_EDGE, ImageProcessing, TileProcessing

    mean, std = (tuple(v.number_list(_K + k, max_len=4)) for k in ("image_mean", "image_std"))
    if len(mean) != c.channels or len(std) != c.channels or min(std) <= 0:
        v.fail(_K + "image_std", list(std), f"and image_mean must give {c.channels} values, "
                                            f"std positive")
    if c.connector == "gemma3":
        return ImageProcessing(c.image_size, c.image_size, _BILINEAR, 1 / 255, mean, std)
    longest = v.integer(_K + "preproc_image_size", 4 * c.image_size, lo=1, hi=MAX_EDGE)
    return TileProcessing(longest, c.image_size, True, _LANCZOS, 1 / 255, mean, std)


def image_tokens(tokenizer, c: VisionConfig, processing, where: str):
    """The image tokens the language model's tokenizer spells (each one token)."""
    from poot.models.vision.config import ImageTokens, TileTokens

    def token(text, fallback=None):
        ids = tokenizer.encode(text, add_special=False)
        if len(ids) == 1:
            return ids[0]
        if fallback is not None:
            return fallback
        raise CheckpointError(f"{where}: the language model's tokenizer has no {text} token "
                              f"(a {c.connector} projector's image prompt needs it)")

    if c.connector == "idefics3":
        return TileTokens(token("<image>"), c.mm_tokens, tiling=processing)
    boi = token("<start_of_image>")
    # text-only Gemma 3 vocabularies lack the soft token: its rows replace the placeholder's
    # embedding, so the image's start token stands in for it
    return ImageTokens(boi, token("<end_of_image>"), token("<image_soft_token>", boi),
                       count=c.mm_tokens)


def open_mmproj(path: str | Path, config, tokenizer):
    """The VisionParts of an mmproj GGUF for a language model (its LlamaConfig and
    Tokenizer); refuses a projector poot does not run, one for another family or width."""
    from poot.models.loader import open_checkpoint
    from poot.models.vision.weights import VisionParts

    path = Path(path)
    if not path.is_file():
        raise RequestError(f"--mmproj {path}: no such file")
    ckpt = open_checkpoint(path)
    v = Values(ckpt.metadata, path)
    key, kind = projector_type(v)
    if config.arch != FAMILIES[kind]:
        v.fail(key, kind, f"feeds a {FAMILIES[kind]} language model; this one is "
                          f"{config.arch}")
    if FAMILIES[kind] == "qwen2vl":
        from poot.models.vision.qwen25vl_mmproj import open_parts

        return open_parts(ckpt, v, kind, config, tokenizer, path)
    c = read_config(v, kind, config.dim)
    processing = pixel_processing(v, c)
    tensors = check_tensors(ckpt.tensors, tensor_names(c, kind), str(path))
    return VisionParts(c, image_tokens(tokenizer, c, processing, str(path)), tensors, path,
                       processing=processing, offset_norms=())


def attach(model, path: str | Path) -> None:
    """Give a loaded language model (a GGUF, or a text-only folder) the vision tower of an
    mmproj GGUF, before its first generation (poot.models.vision.chat.ImageChat and `poot
    serve` read `model.checkpoint.vision`)."""
    if getattr(model.checkpoint, "vision", None) is not None:
        raise RequestError(f"--mmproj {path}: {model.checkpoint.path} has its own vision "
                           f"tower")
    if model.config.arch not in FAMILIES.values():
        raise RequestError(f"--mmproj {path}: {model.checkpoint.path} is a "
                           f"{model.config.arch} model; poot runs images with gemma3 "
                           f"(Gemma 3), llama (Idefics3 / SmolVLM) and qwen2vl "
                           f"(Qwen2-VL, Qwen2.5-VL) language models")
    model.checkpoint.vision = open_mmproj(path, model.config, model.tokenizer)

