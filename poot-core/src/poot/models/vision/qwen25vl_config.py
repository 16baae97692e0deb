"""A Qwen2.5-VL config.json (Qwen2_5_VLForConditionalGeneration) read into the text model's
config (a qwen2 config.json dict for poot.models.config.from_hf, its M-RoPE sections apart)
and the vision tower's.

transformers 4.x writes the text model's keys at the top level beside vision_config, its
M-RoPE as rope_scaling {"type": "mrope", "mrope_section": [...]}; 5.x nests them in
text_config, the sections in rope_parameters. Both are read; the defaults fill what a
config leaves out, as transformers reads it. Every other key is read, known not to change
the forward pass of an image or a text, or refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from poot.checked import Values
from poot.errors import CheckpointError
from poot.models.vision.config import MAX_DIM, MAX_LAYERS

#: top-level keys that leave the forward pass alone (4.x's flat text keys aside)
_IGNORED = {"architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
            "initializer_range", "_name_or_path", "bos_token_id", "eos_token_id",
            "pad_token_id", "use_cache", "text_config", "vision_config", "video_token_id",
            "attention_dropout"}
#: the token ids read, with Qwen2.5-VL's defaults
_TOKENS = {"image_token_id": 151655, "vision_start_token_id": 151652,
           "vision_end_token_id": 151653}
#: Qwen2_5_VLTextConfig's defaults that differ from what from_hf assumes
_TEXT_DEFAULTS = {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568,
                  "num_hidden_layers": 80, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-5, "hidden_act": "silu"}
_TEXT_THETA = 1000000.0
#: text keys that are bookkeeping or the sliding window switched off
_TEXT_IGNORED = {"model_type", "initializer_range", "attention_dropout", "use_cache", "dtype",
                 "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id",
                 "max_window_layers", "_name_or_path", "transformers_version",
                 "architectures", "vision_start_token_id", "vision_end_token_id",
                 "vision_token_id", "image_token_id", "video_token_id"}
#: Qwen2_5_VLVisionConfig's defaults (transformers' names; 4.x's aliases mapped below)
_VISION_DEFAULTS = {"depth": 32, "hidden_size": 3584, "hidden_act": "silu",
                    "intermediate_size": 3420, "num_heads": 16, "in_channels": 3,
                    "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                    "window_size": 112, "out_hidden_size": 3584,
                    "fullatt_block_indexes": [7, 15, 23, 31]}
_VISION_ALIASES = {"in_chans": "in_channels", "num_attention_heads": "num_heads",
                   "num_hidden_layers": "depth"}
_VISION_IGNORED = {"model_type", "initializer_range", "torch_dtype", "dtype",
                   "tokens_per_second", "spatial_patch_size", "_name_or_path",
                   "transformers_version", "architectures"}
#: the vision tower's RMSNorm epsilon (fixed in transformers' modules, not configurable)
VISION_EPS = 1e-6


@dataclass(frozen=True)
class Qwen25VisionConfig:
    """Qwen2.5-VL's vision tower: patches of `patch` x `patch` pixels over `temporal` frames,
    `layers` blocks (window attention except the `full_blocks`), the merger of each `merge` x
    `merge` block of patches into one row of width `text_dim`."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    patch: int
    temporal: int
    merge: int
    window: int                     # in pixels: a window is window/patch patches a side
    full_blocks: tuple[int, ...]
    text_dim: int
    channels: int = 3
    rope_base: float = 10000.0
    eps: float = VISION_EPS
    #: Qwen2-VL's tower (from its mmproj): LayerNorms with biases (blocks and merger) and an
    #: MLP of fc1, QuickGELU, fc2; else Qwen2.5-VL's RMSNorms and SiLU-gated MLP
    qwen2_vl: bool = False
    connector: ClassVar[str] = "qwen25vl"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_values(self) -> int:
        """The values of one patch: channels x frames x patch x patch."""
        return self.channels * self.temporal * self.patch * self.patch

    @property
    def window_units(self) -> int:
        """A window's side in merged units (merge x merge patches each)."""
        return self.window // self.merge // self.patch

    @property
    def factor(self) -> int:
        """Image sides are multiples of this many pixels."""
        return self.patch * self.merge


@dataclass(frozen=True)
class Qwen25Tokens:
    """How the prompt marks an image: <|vision_start|>, one <|image_pad|> per merged row,
    <|vision_end|>; attention stays causal. `sections`: the text model's M-RoPE sections
    (rotary pairs per temporal, height and width position); `tiling`: the folder's
    Qwen25Processing, which sizes each image's grid."""

    image: int
    start: int
    end: int
    sections: tuple[int, int, int]
    merge: int = 2
    tiling: object = None
    both_ways: ClassVar[bool] = False


def _text(cfg: dict, v: Values) -> dict:
    """The text model's keys: text_config (5.x) or the top level's (4.x)."""
    given = v.mapping("text_config", None)
    if given is not None:
        text = dict(given)
        if text.get("model_type", "qwen2_5_vl_text") not in ("qwen2_5_vl_text", "qwen2_5_vl"):
            raise CheckpointError(f"{v.file}: text_config model_type {text['model_type']!r}: "
                                  f"Qwen2.5-VL's is qwen2_5_vl_text")
        return text
    return {k: x for k, x in cfg.items() if k not in _IGNORED and k not in _TOKENS}


def _sections(text: dict, tv: Values) -> tuple[dict, tuple[int, int, int]]:
    """(the rope keys for from_hf, M-RoPE's sections) from rope_scaling / rope_parameters."""
    name = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
    rs = dict(text.pop(name, None) or {})
    text.pop("rope_scaling", None)
    sections = rs.pop("mrope_section", None)
    if not (isinstance(sections, list) and len(sections) == 3 and
            all(isinstance(s, int) and s >= 0 for s in sections)):
        tv.fail(name, sections, "must give mrope_section as three counts of rotary pairs "
                                "(temporal, height, width)")
    kind = rs.pop("rope_type", None) or rs.pop("type", None) or "default"
    rs.pop("type", None)
    if kind not in ("mrope", "default"):
        tv.fail(name, kind, "is a RoPE scaling poot does not implement with M-RoPE")
    theta = rs.pop("rope_theta", text.pop("rope_theta", _TEXT_THETA))
    if rs:
        key = sorted(rs)[0]
        tv.fail(name, {key: rs[key]}, "is a RoPE setting poot does not implement with M-RoPE")
    return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}, tuple(sections)


def read_qwen25vl(cfg: dict, where: str) -> tuple[dict, Qwen25VisionConfig, Qwen25Tokens]:
    """(the text config as a qwen2 config.json, the tower's config, the image tokens)."""
    v = Values(cfg, f"{where}/config.json")
    nested = v.mapping("text_config", None) is not None
    if nested:
        unknown = sorted(set(cfg) - _IGNORED - set(_TOKENS) - {"tie_word_embeddings"})
        if unknown:
            v.fail(unknown[0], cfg[unknown[0]], "is a qwen2_5_vl setting poot does not "
                                                "implement")
    text = _text(cfg, v)
    tv = Values(text, f"{where}/config.json" + (" text_config" if nested else ""))
    rope, sections = _sections(text, tv)
    if text.get("use_sliding_window"):
        tv.fail("use_sliding_window", True, "is not implemented for Qwen2.5-VL")
    for key in ("use_sliding_window", "sliding_window", "layer_types"):
        if key == "layer_types" and any(x != "full_attention" for x in text.get(key) or []):
            tv.fail(key, text[key], "must be full_attention throughout")
        text.pop(key, None)
    for key in _TEXT_IGNORED:
        text.pop(key, None)
    out = {**_TEXT_DEFAULTS, **text, **rope, "model_type": "qwen2"}
    # the head is tied as the top level says (5.x), or the text keys did (4.x: one level)
    out["tie_word_embeddings"] = v.flag("tie_word_embeddings",
                                        bool(text.get("tie_word_embeddings", False)))
    dim, heads = out["hidden_size"], out["num_attention_heads"]
    head_dim = out.get("head_dim") or (dim // heads if isinstance(dim, int) and
                                       isinstance(heads, int) and heads else 0)
    if 2 * sum(sections) != head_dim:
        tv.fail("mrope_section", list(sections), f"must sum to half the head dim {head_dim}")
    vision = _vision(Values(v.mapping("vision_config", None) or {},
                            f"{where}/config.json vision_config"))
    if vision.text_dim != dim:
        v.fail("vision_config", {"out_hidden_size": vision.text_dim},
               f"must be the text model's hidden_size {dim}")
    ids = {k: v.integer(k, d, lo=0, hi=1 << 31) for k, d in _TOKENS.items()}
    vocab = out["vocab_size"]
    for name, i in ids.items():
        if not isinstance(vocab, int) or i >= vocab:
            v.fail(name, i, f"lies outside the text model's {vocab} embedding rows")
    tokens = Qwen25Tokens(ids["image_token_id"], ids["vision_start_token_id"],
                          ids["vision_end_token_id"], sections, vision.merge)
    return out, vision, tokens


def _vision(v: Values) -> Qwen25VisionConfig:
    d = {_VISION_ALIASES.get(k, k): x for k, x in v.values.items() if x is not None}
    rope = d.pop("rope_parameters", None) or {}
    unknown = sorted(set(d) - set(_VISION_DEFAULTS) - _VISION_IGNORED)
    if unknown:
        v.fail(unknown[0], d[unknown[0]], "is a Qwen2.5-VL vision setting poot does not "
                                          "implement")
    d = {**_VISION_DEFAULTS, **d}
    vd = Values(d, v.file)
    if d["hidden_act"] != "silu":
        v.fail("hidden_act", d["hidden_act"], "poot runs Qwen2.5-VL's tower with silu")
    rv = Values(rope if isinstance(rope, dict) else {}, f"{v.file} rope_parameters")
    if rv.text("rope_type", "axial") != "axial" or set(rv.values) - {"rope_type", "rope_theta"}:
        v.fail("rope_parameters", rope, "must be axial RoPE with a rope_theta")

    def size(key, hi=MAX_DIM):
        return vd.integer(key, lo=1, hi=hi)

    full = d["fullatt_block_indexes"]
    layers = size("depth", MAX_LAYERS)
    if not isinstance(full, (list, tuple)) or not all(
            isinstance(i, int) and 0 <= i < layers for i in full):
        v.fail("fullatt_block_indexes", full, f"must list block indices below depth {layers}")
    c = Qwen25VisionConfig(
        hidden=size("hidden_size"), layers=layers, heads=size("num_heads"),
        ffn=size("intermediate_size"), patch=size("patch_size", 1024),
        temporal=size("temporal_patch_size", 16), merge=size("spatial_merge_size", 16),
        window=size("window_size", 1 << 14), full_blocks=tuple(sorted(set(full))),
        text_dim=size("out_hidden_size"), channels=size("in_channels", 4),
        rope_base=rv.number("rope_theta", 10000.0, positive=True))
    if c.hidden % c.heads or c.head_dim % 4:
        v.fail("num_heads", c.heads, f"must divide hidden_size {c.hidden} into heads of a "
                                     f"multiple of 4 (2-D RoPE)")
    if c.window % c.factor or not c.window_units:
        v.fail("window_size", c.window, f"must be a multiple of patch_size x "
                                        f"spatial_merge_size {c.factor}")
    return c
