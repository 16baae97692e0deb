"""Qwen2.5-VL's image processor (Qwen2VLImageProcessor) with Pillow: each image resized to
its own size, both sides multiples of patch x merge pixels and its area within
[min_pixels, max_pixels] (`smart_resize`), with bicubic filtering; rescaled, normalized
(CLIP's mean and std unless the config says otherwise), repeated over the tower's
temporal patch frames, and flattened into one row per patch, each merge x merge block of
patches consecutive (the order the tower's merger reads them in).

Settings from preprocessor_config.json (min_pixels / max_pixels, or size.shortest_edge /
size.longest_edge, transformers 5's spelling), or the image_processor that transformers 5
nests in processor_config.json; decoding and its refusals are poot.models.vision.preprocess's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from poot.checked import Values
from poot.errors import ImageError
from poot.models.vision.preprocess import _config, _normalized, _scaling, image_size, open_rgb

#: CLIP's mean and std, the processor's defaults
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: the widest aspect ratio the processor takes
MAX_RATIO = 200
#: the most pixels an image is resized to, whatever the config says (its tokens must fit)
MAX_AREA = 1 << 26
_READ = {"min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"}


@dataclass(frozen=True)
class Qwen25Processing:
    """How pixels are prepared (the defaults: Qwen2.5-VL's processor)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch: int = 14
    temporal: int = 2
    merge: int = 2
    resample: int = 3                 # PIL.Image.Resampling: 3 is BICUBIC
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = CLIP_MEAN
    std: tuple[float, ...] | None = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch * self.merge


def read_qwen25_processing(folder: Path, vision) -> Qwen25Processing:
    """The folder's processor settings (absent: the processor's defaults), checked against
    the tower's patch, temporal patch and merge sizes."""
    v = _config(folder, _READ)
    d = Qwen25Processing(patch=vision.patch, temporal=vision.temporal, merge=vision.merge)
    if v is None:
        return d
    if not v.flag("do_resize", True):
        v.fail("do_resize", False, "is not implemented: images are resized to the tower's "
                                   "grid")
    size = Values(v.mapping("size", None) or {}, f"{v.file} size")
    if set(size.values) - {"shortest_edge", "longest_edge", "min_pixels", "max_pixels"}:
        v.fail("size", size.values, "must give shortest_edge and longest_edge (pixels)")
    lo = v.integer("min_pixels", size.values.get("shortest_edge",
                                                 size.values.get("min_pixels", d.min_pixels)),
                   lo=1, hi=MAX_AREA)
    hi = v.integer("max_pixels", size.values.get("longest_edge",
                                                 size.values.get("max_pixels", d.max_pixels)),
                   lo=lo, hi=MAX_AREA)
    for key, want in (("patch_size", vision.patch), ("temporal_patch_size", vision.temporal),
                      ("merge_size", vision.merge)):
        if v.integer(key, want, lo=1, hi=1 << 10) != want:
            v.fail(key, v.values[key], f"differs from the vision tower's {want}")
    return Qwen25Processing(lo, hi, d.patch, d.temporal, d.merge,
                            v.integer("resample", 3, lo=0, hi=5),
                            *_scaling(v, list(CLIP_MEAN)))


def smart_resize(height: int, width: int, p: Qwen25Processing) -> tuple[int, int]:
    """(height, width) of the resized image: each side the nearest multiple of the factor
    (ties to even, as Python rounds), scaled down or up in ratio where the area leaves
    [min_pixels, max_pixels], as Qwen2VLImageProcessor computes it."""
    f = p.factor
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ImageError(f"a {width} x {height} image is wider than the {MAX_RATIO}:1 aspect "
                         f"ratio Qwen2.5-VL's processor takes")
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > p.max_pixels:
        beta = math.sqrt(height * width / p.max_pixels)
        h = max(f, math.floor(height / beta / f) * f)
        w = max(f, math.floor(width / beta / f) * f)
    elif h * w < p.min_pixels:
        beta = math.sqrt(p.min_pixels / (height * width))
        h = math.ceil(height * beta / f) * f
        w = math.ceil(width * beta / f) * f
    return h, w


def image_grid(height: int, width: int, p: Qwen25Processing) -> tuple[int, int]:
    """(grid_h, grid_w) in patches of an image of that size once resized."""
    h, w = smart_resize(height, width, p)
    return h // p.patch, w // p.patch


def patchify(pixels: np.ndarray, p: Qwen25Processing) -> np.ndarray:
    """[C, H, W] -> [grid_h*grid_w, C*temporal*patch*patch]: merge x merge blocks of patches
    row by row, each block's patches row by row, each patch's values in (c, frame, y, x)
    order (the image repeated over the frames), a Conv3d kernel's order read as a matrix."""
    c, h, w = pixels.shape
    m, s, t = p.merge, p.patch, p.temporal
    gh, gw = h // s, w // s
    x = pixels.reshape(c, gh // m, m, s, gw // m, m, s).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t, s, s))
    return np.ascontiguousarray(x.reshape(gh * gw, c * t * s * s), np.float32)


def qwen25_patches(source, processing: Qwen25Processing, name: str | None = None
                   ) -> tuple[np.ndarray, tuple[int, int]]:
    """(the patch rows of the image (a path, or its file's bytes), its (grid_h, grid_w))."""
    p = processing
    img = open_rgb(source, name)
    h, w = smart_resize(img.height, img.width, p)
    if img.size != (w, h):
        img = img.resize((w, h), resample=p.resample)
    return patchify(_normalized(img, p), p), (h // p.patch, w // p.patch)


def header_grid(data: bytes, name: str, p: Qwen25Processing) -> tuple[int, int]:
    """(grid_h, grid_w) of an image file from its header, nothing decoded."""
    w, h = image_size(data, name)
    return image_grid(h, w, p)
