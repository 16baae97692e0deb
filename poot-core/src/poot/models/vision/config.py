"""A vision-language config.json read into the text model's config (a dict for
poot.models.config.from_hf) and the tower's: Gemma 3 (Gemma3ForConditionalGeneration, a
gemma3_text model) and Idefics3 (Idefics3ForConditionalGeneration, SmolVLM: a llama model).

transformers writes only the keys that differ from each sub-config's defaults, so the
defaults of the text and vision sub-configs fill the rest, as transformers reads them.
Every other key is read, known not to change the forward pass, or refused by name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from poot.checked import Values
from poot.errors import CheckpointError

#: top-level keys that do not change the forward pass
_IGNORED = {"architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
            "initializer_range", "_name_or_path", "bos_token_id", "eos_token_id",
            "pad_token_id", "use_cache", "text_config", "vision_config"}
_READ = {"mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
         "image_token_id", "boi_token_id", "eoi_token_id", "tie_word_embeddings"}
#: Gemma3TextConfig's defaults that poot reads (the RoPE and layer-pattern ones only where
#: the config names none in transformers 5's spelling)
_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                  "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "head_dim": 256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                  "query_pre_attn_scalar": 256, "sliding_window": 4096,
                  "tie_word_embeddings": True}
_TEXT_ROPE_DEFAULTS = {"rope_theta": 1e6, "rope_local_base_freq": 10000.0}
#: SiglipVisionConfig's defaults
_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                    "num_attention_heads": 12, "num_channels": 3, "image_size": 224,
                    "patch_size": 16, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}
#: Idefics3VisionConfig's defaults (the same SigLIP tower, other sizes)
_IDEFICS3_VISION_DEFAULTS = {**_VISION_DEFAULTS, "hidden_size": 1152, "num_attention_heads": 16,
                             "patch_size": 32}
_VISION_IGNORED = {"model_type", "torch_dtype", "dtype", "attention_dropout", "architectures",
                   "initializer_range", "_name_or_path", "transformers_version",
                   "vision_use_head"}   # Gemma 3 reads the last hidden state, not the head
_VISION_ACTS = ("gelu_pytorch_tanh", "gelu_tanh")
#: generous bounds for untrusted sizes
MAX_DIM, MAX_LAYERS, MAX_IMAGE = 1 << 14, 256, 1 << 13


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP tower and its connector (`connector`: Gemma 3's or Idefics3's) to a language
    model of width `text_dim`."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    image_size: int
    patch: int
    text_dim: int
    channels: int = 3
    eps: float = 1e-6
    mm_tokens: int = 256          # rows per image (per tile) out of the connector
    connector: str = "gemma3"     # "gemma3": pool, norm, project; "idefics3": shuffle, project
    scale: int = 1                # Idefics3's pixel-shuffle factor (patches per side per row)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens)

    @property
    def pool(self) -> int:
        """The average pooling's kernel (and stride) in patches."""
        return self.patches_per_side // self.tokens_per_side


@dataclass(frozen=True)
class ImageTokens:
    """How the prompt marks an image: begin, `count` soft tokens (the rows), end; the soft
    tokens see each other both ways. `tiling`: the folder's ImageProcessing where it pans
    and scans (each crop another block of the image), else None."""

    boi: int
    eoi: int
    soft: int
    count: int
    tiling: object = None
    both_ways: ClassVar[bool] = True


def is_vision_config(cfg: Any) -> bool:
    return isinstance(cfg, dict) and "vision_config" in cfg


def read_gemma3(cfg: dict, where: str) -> tuple[dict, VisionConfig, ImageTokens]:
    """(the text config as a gemma3_text config.json, the tower's config, the image tokens)."""
    v = Values(cfg, f"{where}/config.json")
    if v.text("model_type", "") != "gemma3":
        raise CheckpointError(f"{where}: config.json model_type {cfg.get('model_type')!r} "
                              f"with a vision_config: poot runs images for gemma3 "
                              f"(Gemma3ForConditionalGeneration) and idefics3 "
                              f"(Idefics3ForConditionalGeneration)")
    unknown = sorted(set(cfg) - _IGNORED - _READ)
    if unknown:
        v.fail(unknown[0], cfg[unknown[0]], "is a gemma3 setting poot does not implement")
    text = dict(v.mapping("text_config", None) or {})
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise CheckpointError(f"{where}: config.json text_config model_type "
                              f"{text['model_type']!r}: Gemma 3's is gemma3_text")
    text["model_type"] = "gemma3_text"
    # transformers 5 keeps the 4.x layer pattern as a private key beside layer_types
    pattern = text.pop("_sliding_window_pattern", None)
    if pattern is not None and "layer_types" not in text:
        text.setdefault("sliding_window_pattern", pattern)
    for key, value in _TEXT_DEFAULTS.items():
        text.setdefault(key, value)
    if "tie_word_embeddings" in cfg:
        text["tie_word_embeddings"] = v.flag("tie_word_embeddings")
    if "rope_parameters" not in text:
        for key, value in _TEXT_ROPE_DEFAULTS.items():
            text.setdefault(key, value)
    vision = _vision(Values(v.mapping("vision_config"), f"{where}/config.json vision_config"),
                     text["hidden_size"])
    mm = v.integer("mm_tokens_per_image", 256, lo=1, hi=MAX_IMAGE * MAX_IMAGE)
    vision = VisionConfig(**{**vision.__dict__, "mm_tokens": mm})
    side = vision.tokens_per_side
    if side * side != mm or vision.patches_per_side % side:
        v.fail("mm_tokens_per_image", mm, f"must be the square of a divisor of the "
                                          f"{vision.patches_per_side} patches per side")
    vocab = text["vocab_size"]
    ids = [v.integer(name, default, lo=0, hi=1 << 31) for name, default in (
        ("boi_token_index", cfg.get("boi_token_id", 255999)),
        ("eoi_token_index", cfg.get("eoi_token_id", 256000)),
        ("image_token_index", cfg.get("image_token_id", 262144)))]
    for name, i in zip(("boi_token_index", "eoi_token_index", "image_token_index"), ids):
        if not isinstance(vocab, int) or i >= vocab:
            v.fail(name, i, f"lies outside the text model's {vocab} embedding rows")
    return text, vision, ImageTokens(*ids, count=mm)


def _vision(v: Values, text_dim, defaults=_VISION_DEFAULTS, ignored=_VISION_IGNORED
            ) -> VisionConfig:
    unknown = sorted(set(v.values) - set(defaults) - ignored)
    if unknown:
        v.fail(unknown[0], v.values[unknown[0]], "is a SigLIP setting poot does not implement")
    d = {**defaults, **{k: x for k, x in v.values.items() if x is not None}}
    vd = Values(d, v.file)

    def size(key, hi=MAX_DIM):
        return vd.integer(key, lo=1, hi=hi)

    if d["hidden_act"] not in _VISION_ACTS:
        v.fail("hidden_act", d["hidden_act"], f"poot runs SigLIP with {_VISION_ACTS[0]}")
    c = VisionConfig(hidden=size("hidden_size"), layers=size("num_hidden_layers", MAX_LAYERS),
                     heads=size("num_attention_heads"), ffn=size("intermediate_size"),
                     image_size=size("image_size", MAX_IMAGE), patch=size("patch_size"),
                     channels=size("num_channels", 4),
                     eps=vd.number("layer_norm_eps", positive=True, hi=1.0),
                     text_dim=int(text_dim))
    if c.hidden % c.heads:
        v.fail("num_attention_heads", c.heads, f"must divide hidden_size {c.hidden}")
    if c.image_size % c.patch:
        v.fail("patch_size", c.patch, f"must divide image_size {c.image_size}")
    return c


@dataclass(frozen=True)
class TileTokens:
    """How Idefics3's prompt marks an image: per tile, `count` image tokens (id `image`,
    the rows' placeholders) between marker tokens the tokenizer has by these spellings
    (poot.models.vision.idefics3); how many tiles an image has, `tiling` says (the
    folder's poot.models.vision.preprocess.TileProcessing). Attention stays causal."""

    image: int
    count: int
    image_text: str = "<image>"
    around: str = "<fake_token_around_image>"
    global_image: str = "<global-img>"
    tiling: object = None
    both_ways: ClassVar[bool] = False


#: Idefics3Config's top-level keys poot reads, and those that do not change the forward pass
_IDEFICS3_READ = {"scale_factor", "image_token_id", "tie_word_embeddings", "text_config",
                  "vision_config"}
_IDEFICS3_IGNORED = _IGNORED | {"_attn_implementation_autoset", "use_export_friendly",
                                "_pad_token_id"}
#: top-level copies of the text model's sizes (SmolVLM's config.json), checked against it
_TEXT_COPIES = ("vocab_size", "hidden_size")
#: LlamaConfig's defaults (the text_config transformers reads for Idefics3; its RoPE base
#: only where the config names no rope_parameters, transformers 5's spelling)
_LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 32, "num_attention_heads": 32,
                   "max_position_embeddings": 2048, "rms_norm_eps": 1e-6}
_LLAMA_ROPE_DEFAULTS = {"rope_theta": 10000.0}
#: transformers 4.x's PretrainedConfig attributes, which SmolVLM's sub-configs carry whole
#: (not only where they differ): generation defaults, bookkeeping and encoder-decoder
#: switches that neither a Llama's nor a SigLIP tower's forward pass reads
_PRETRAINED_INERT = {
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "torch_dtype",
    "dtype", "use_bfloat16", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size", "add_cross_attention",
    "tie_encoder_decoder", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "architectures", "finetuning_task", "id2label", "label2id",
    "tokenizer_class", "prefix", "bos_token_id", "pad_token_id", "eos_token_id",
    "sep_token_id", "decoder_start_token_id", "task_specific_params", "problem_type",
    "_name_or_path", "transformers_version", "_commit_hash", "_attn_implementation_autoset"}
#: text_config keys SmolVLM's checkpoints carry from their training code: ones that leave
#: the forward pass alone, and ones that change it unless false
_TEXT_EXTRAS = _PRETRAINED_INERT | {"_flash_attn_2_enabled", "is_llama_config",
                                    "neftune_noise_alpha", "perceiver_config",
                                    "pixel_shuffle_factor", "transformers.js_config"}
_TEXT_OFF = ("qk_layer_norms", "use_resampler", "rope_interleaved")
_IDEFICS3_VISION_IGNORED = _VISION_IGNORED | _PRETRAINED_INERT | {
    "use_export_friendly", "max_image_size", "size", "tie_word_embeddings", "use_base_siglip",
    "projection_class", "ignore_index"}


def read_idefics3(cfg: dict, where: str) -> tuple[dict, VisionConfig, TileTokens]:
    """(the text config as a llama config.json, the tower's config, the image tokens) of an
    Idefics3 (SmolVLM) folder: the SigLIP tower, a pixel shuffle by `scale_factor` and a
    projection without bias, then a Llama text model."""
    v = Values(cfg, f"{where}/config.json")
    unknown = sorted(set(cfg) - _IDEFICS3_IGNORED - _IDEFICS3_READ - set(_TEXT_COPIES))
    if unknown:
        v.fail(unknown[0], cfg[unknown[0]], "is an idefics3 setting poot does not implement")
    given = v.mapping("text_config", None)
    text = dict(given or {"rms_norm_eps": 1e-5})
    if text.setdefault("model_type", "llama") != "llama":
        raise CheckpointError(f"{where}: config.json text_config model_type "
                              f"{text['model_type']!r}: poot runs Idefics3 with llama")
    tv = Values(text, f"{where}/config.json text_config")
    for key in _TEXT_OFF:
        if text.pop(key, False):
            tv.fail(key, True, "is not implemented")
    for key in _TEXT_EXTRAS:
        text.pop(key, None)
    for key, value in _LLAMA_DEFAULTS.items():
        text.setdefault(key, value)
    for key in _TEXT_COPIES:
        if key in cfg and cfg[key] != text[key]:
            v.fail(key, cfg[key], f"differs from text_config's {text[key]!r}")
    if "rope_parameters" not in text:
        for key, value in _LLAMA_ROPE_DEFAULTS.items():
            text.setdefault(key, value)
    # the language model's head is tied as the top-level config says (Idefics3's default:
    # not), as transformers builds Idefics3ForConditionalGeneration
    text["tie_word_embeddings"] = v.flag("tie_word_embeddings",
                                         bool(text.get("tie_word_embeddings", False)))
    vision = _vision(Values(v.mapping("vision_config", None) or {},
                            f"{where}/config.json vision_config"), text["hidden_size"],
                     _IDEFICS3_VISION_DEFAULTS, _IDEFICS3_VISION_IGNORED)
    scale = v.integer("scale_factor", 2, lo=1, hi=64)
    side = vision.patches_per_side
    if side % scale:
        v.fail("scale_factor", scale, f"must divide the {side} patches per side")
    count = (side // scale) ** 2
    vision = VisionConfig(**{**vision.__dict__, "mm_tokens": count, "connector": "idefics3",
                             "scale": scale})
    image = v.integer("image_token_id", 128257, lo=0, hi=1 << 31)
    vocab = text["vocab_size"]
    if not isinstance(vocab, int) or image >= vocab:
        v.fail("image_token_id", image, f"lies outside the text model's {vocab} embedding rows")
    return text, vision, TileTokens(image, count)
