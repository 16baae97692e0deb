"""A vision-language checkpoint's tensors, split: the language model's as a view the
decoder's loaders read (HF text names), the tower's and connector's as a WeightSource.

Idefics3 (SmolVLM) saves `model.text_model.*`, `lm_head.weight`, `model.vision_model.*` and
`model.connector.modality_projection.proj.weight`. For Gemma 3, every transformers spelling
is read: 4.x saved `language_model.model.*`,
`vision_tower.vision_model.*` and `multi_modal_projector.*`; 5.x (5.25 checked) saves the
tower as `vision_tower.*` (no `vision_model.`), the rest as 4.x did; and the module paths of
4.52 and later, should a tool save them as they are, are `model.language_model.*`,
`model.vision_tower.vision_model.*` (or without `vision_model.`),
`model.multi_modal_projector.*` and `lm_head.weight`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from poot.dtypes import DType
from poot.errors import CheckpointError
from poot.ir.types import TensorType
from poot.models.weights import DenseSpec

#: checkpoint prefix -> the prefix poot reads it under ("model.": the text model's HF names)
_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
             ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."),
             ("vision_tower.vision_model.", "vision."),
             ("model.vision_tower.vision_model.", "vision."),
             ("vision_tower.", "vision."), ("model.vision_tower.", "vision."),
             ("multi_modal_projector.", "projector."),
             ("model.multi_modal_projector.", "projector."))
#: Idefics3's, the same way
_IDEFICS3_PREFIXES = (("model.text_model.", "model."), ("lm_head.", "lm_head."),
                      ("model.vision_model.", "vision."), ("model.connector.", "connector."))
#: the connector's norm stores w of a (1 + w) RMSNorm, as the text model's do
_OFFSET_NORMS = ("projector.mm_soft_emb_norm.weight",)


def split(tensors: dict, where: str, prefixes=_PREFIXES, family: str = "Gemma 3"
          ) -> tuple[dict, dict]:
    """(text tensors by HF text name, vision tensors by "vision."/"projector."/"connector."
    name)."""
    text, vision = {}, {}
    for name, info in tensors.items():
        for old, new in prefixes:
            if name.startswith(old):
                key = new + name[len(old):]
                (text if new in ("model.", "lm_head.") else vision)[key] = info
                break
        else:
            raise CheckpointError(f"{where}: tensor {name!r} is neither the language model's, "
                                  f"the vision tower's nor the projector's (a {family} "
                                  f"vision-language folder per config.json)")
    return text, vision


class TextView:
    """The checkpoint as the text model's loaders see it: its text tensors under HF text
    names and the text config; `vision` holds what the tower needs."""

    def __init__(self, checkpoint, text_config: dict, tensors: dict, vision):
        self.path, self.kind = checkpoint.path, checkpoint.kind
        self.metadata, self.tensors = text_config, tensors
        self.vision = vision
        self._checkpoint = checkpoint

    def __repr__(self) -> str:
        return f"<text view of {self._checkpoint!r}>"

    def close(self) -> None:
        self.tensors = {}
        self.vision.tensors = {}
        self._checkpoint.close()


@dataclass
class VisionWeights:
    """WeightSource over the tower's and connector's dense tensors; `arrays` maps const
    labels to arrays (norm and bias vectors widened to f32; the connector's norm as 1 + w)."""

    tensors: dict
    where: str = ""
    arrays: dict = field(default_factory=dict)
    #: names stored as w of a (1 + w) norm (an mmproj stores 1 + w itself: none)
    offset_norms: tuple = _OFFSET_NORMS

    def has(self, name: str) -> bool:
        return name in self.tensors

    def spec(self, name: str) -> DenseSpec:
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError(f"{self.where}: the vision tower lacks tensor {name!r}")
        if getattr(info, "packed", None) is not None or info.dtype is None or info.dtype.is_int:
            raise CheckpointError(f"{self.where}: vision tensor {name!r} is packed or integer "
                                  f"({info.storage!r}); poot reads dense vision towers")
        array, dtype, ref = info.sources[0], info.dtype, info.ref
        offset = name in self.offset_norms
        if len(info.shape) == 1 and dtype is not DType.F32 or offset:
            array = np.asarray(array, np.float32)
            dtype = DType.F32
            tag = ":f32"
            if offset:
                array = array + np.float32(1.0)
                tag = "+1"
            ref = type(ref)(ref.checkpoint, ref.tensor + tag, f"{ref.payload}{tag}", "f32")
        self.arrays[ref.tensor] = array
        return DenseSpec(TensorType(tuple(info.shape), dtype), ref)


@dataclass
class VisionParts:
    """What a vision-language checkpoint holds beyond its text model."""

    config: object              # poot.models.vision.config.VisionConfig
    tokens: object              # poot.models.vision.config.ImageTokens or TileTokens
    tensors: dict
    folder: Path                # the checkpoint the tower comes from (an mmproj: its file)
    #: how pixels are prepared, where the tower's file says (an mmproj); None: the folder's
    #: preprocessor_config.json
    processing: object = None
    offset_norms: tuple = _OFFSET_NORMS

    def weights(self) -> VisionWeights:
        return VisionWeights(self.tensors, str(self.folder), offset_norms=self.offset_norms)


def open_vision(checkpoint, max_seq: int | None = None):
    """(a TextView of the checkpoint, the text model's LlamaConfig) for a vision-language
    folder: Gemma 3 or Idefics3 by config.json's model_type."""
    from poot.models import config as C
    from poot.models.vision.config import read_gemma3, read_idefics3

    where = str(checkpoint.path)
    if checkpoint.metadata.get("model_type") == "idefics3":
        from dataclasses import replace

        from poot.models.vision.preprocess import read_tiling

        text_cfg, vision_cfg, tokens = read_idefics3(checkpoint.metadata, where)
        tokens = replace(tokens, tiling=read_tiling(Path(checkpoint.path),
                                                    vision_cfg.image_size))
        text, vision = split(checkpoint.tensors, where, _IDEFICS3_PREFIXES, "Idefics3")
    else:
        from dataclasses import replace

        from poot.models.vision.preprocess import read_processing

        text_cfg, vision_cfg, tokens = read_gemma3(checkpoint.metadata, where)
        processing = read_processing(Path(checkpoint.path), vision_cfg.image_size)
        if processing.pan_and_scan is not None:   # the prompt depends on each image's size
            tokens = replace(tokens, tiling=processing)
        text, vision = split(checkpoint.tensors, where)
    parts = VisionParts(vision_cfg, tokens, vision, Path(checkpoint.path))
    view = TextView(checkpoint, text_cfg, text, parts)
    config = C.from_hf(text_cfg, text, max_seq)
    return view, config
