"""Images decoded with Pillow and prepared as the checkpoint's image processor says
(preprocessor_config.json): RGB (transparency composited on white), resized to `size` with
its resampling filter, rescaled, normalized with its mean and std, channels first.

Idefics3's processor (SmolVLM) tiles: the longest edge resized to `size.longest_edge`, then
(`do_image_splitting`) both edges up to multiples of `max_image_size.longest_edge`, the tower's
tile size, cut into tiles row by row and followed by the whole image resized to one tile;
without splitting, the whole image resized to one tile.

The settings come from preprocessor_config.json, or from the image_processor that
transformers 5 nests in processor_config.json.

Gemma 3's processor pans and scans where its config sets `do_pan_and_scan`: an image whose
aspect ratio reaches `pan_and_scan_min_ratio_to_activate` is also cut, along its long edge,
into 2 to `pan_and_scan_max_num_crops` equal crops (as many as the ratio rounded, fewer
where a crop would be narrower than `pan_and_scan_min_crop_size`, none where it still
would), taken from the image as decoded; the whole image and then each crop are resized.

Untrusted files: Pillow's decompression-bomb limit is set here explicitly and checked from
the header before any pixel is decoded, and a file Pillow cannot identify, a truncated or
corrupt one, or a mode that has no RGB form, is one ImageError line naming the file.
"""
from __future__ import annotations

import io
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from poot.checked import Values, load_json
from poot.errors import ImageError
from poot.optional import require

#: the most pixels an image may have (width x height), above which it is refused unread
MAX_PIXELS = 64 * 1024 * 1024
#: the largest image file read
MAX_BYTES = 64 * 1024 * 1024
#: preprocessor_config.json keys that do not change the pixels of a single image
_IGNORED = {"image_processor_type", "processor_class", "image_seq_length",
            "_processor_class", "default_to_square", "data_format", "input_data_format"}
#: the 8-bit modes taken (to RGB); 16-bit, 32-bit integer and float images are refused
#: rather than clipped to 8 bits
MODES = {"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr",
         "LAB", "HSV"}
_READ = {"do_convert_rgb", "do_resize", "size", "resample", "do_rescale", "rescale_factor",
         "do_normalize", "image_mean", "image_std"}


#: Gemma 3's processor keys, beside the common ones
_PAN_READ = {"do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
             "pan_and_scan_min_ratio_to_activate"}
#: the most crops an image may be cut into (each is another image's tokens)
MAX_CROPS = 16
#: Idefics3's processor keys, beside the common ones
_TILING_READ = {"do_image_splitting", "max_image_size", "do_pad", "return_row_col_info"}
#: the largest edge Idefics3's processor resizes to (its 4k cap)
MAX_EDGE = 4096


@dataclass(frozen=True)
class PanAndScan:
    """Gemma 3's pan and scan (the defaults: its processor's)."""

    min_crop: int = 256               # the narrowest crop, in pixels of the decoded image
    max_crops: int = 4
    min_ratio: float = 1.2            # the aspect ratio from which an image is cropped


@dataclass(frozen=True)
class ImageProcessing:
    """How pixels are prepared (the defaults: Gemma 3's processor at 896 x 896)."""

    height: int = 896
    width: int = 896
    resample: int = 2                 # PIL.Image.Resampling: 2 is BILINEAR
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    std: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    pan_and_scan: PanAndScan | None = None


@dataclass(frozen=True)
class TileProcessing:
    """Idefics3's tiling (the defaults: its processor's, for a 364-pixel tower)."""

    longest: int | None = 4 * 364     # the longest edge after the first resize (None: kept)
    tile: int = 364
    split: bool = True
    resample: int = 1                 # PIL.Image.Resampling: 1 is LANCZOS
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    std: tuple[float, ...] | None = (0.5, 0.5, 0.5)


def _config(folder: Path, read: set) -> Values | None:
    """The folder's image-processor settings (None: absent), its unknown keys refused:
    preprocessor_config.json, or else the image_processor that transformers 5 nests in
    processor_config.json."""
    file = Path(folder) / "preprocessor_config.json"
    if file.is_file():
        v = Values(load_json(file), file)
    else:
        file = Path(folder) / "processor_config.json"
        nested = Values(load_json(file), file).mapping("image_processor", None) \
            if file.is_file() else None
        if nested is None:
            return None
        v = Values(nested, f"{file} image_processor")
    unknown = sorted(set(v.values) - _IGNORED - _READ - read)
    if unknown:
        v.fail(unknown[0], v.values[unknown[0]], "is an image-processor setting poot does "
                                                 "not implement")
    if not v.flag("do_convert_rgb", True):
        v.fail("do_convert_rgb", False, "is not implemented: the tower takes RGB images")
    return v


def _scaling(v: Values, mean_default) -> tuple:
    """(rescale factor, mean, std): None where the processor does not."""
    rescale = v.number("rescale_factor", 1 / 255, positive=True) \
        if v.flag("do_rescale", True) else None
    mean = std = None
    if v.flag("do_normalize", True):
        mean, std = (tuple(v.number_list(k, mean_default)) for k in ("image_mean", "image_std"))
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            v.fail("image_std", list(std), "and image_mean must give 3 values, std positive")
    return rescale, mean, std


def read_tiling(folder: Path, image_size: int) -> TileProcessing:
    """The folder's Idefics3 preprocessor_config.json (absent: its processor's defaults at
    the tower's image size)."""
    v = _config(folder, _TILING_READ)
    if v is None:
        return TileProcessing(4 * image_size, image_size)
    longest = None
    if v.flag("do_resize", True):
        size = Values(v.mapping("size", {"longest_edge": 4 * image_size}), f"{v.file} size")
        if set(size.values) != {"longest_edge"}:
            v.fail("size", size.values, "must give longest_edge (Idefics3's processor)")
        longest = size.integer("longest_edge", lo=1, hi=MAX_EDGE)
    tile = Values(v.mapping("max_image_size", {"longest_edge": image_size}),
                  f"{v.file} max_image_size")
    if set(tile.values) != {"longest_edge"} or \
            tile.integer("longest_edge", lo=1, hi=MAX_EDGE) != image_size:
        v.fail("max_image_size", tile.values, f"must be the tower's image_size {image_size} "
                                              f"as longest_edge")
    return TileProcessing(longest, image_size, v.flag("do_image_splitting", True),
                          v.integer("resample", 1, lo=0, hi=5), *_scaling(v, [0.5] * 3))


def read_processing(folder: Path, image_size: int) -> ImageProcessing:
    """The folder's preprocessor_config.json (absent: Gemma 3's processor at the tower's
    image size)."""
    v = _config(folder, _PAN_READ)
    if v is None:
        return ImageProcessing(image_size, image_size)
    if not v.flag("do_resize", True):
        v.fail("do_resize", False, "is not implemented: the tower takes images of one size")
    size = Values(v.mapping("size", {}), f"{v.file} size")
    if set(size.values) - {"height", "width"}:
        v.fail("size", size.values, "must give height and width")
    h, w = (size.integer(k, image_size, lo=1, hi=1 << 13) for k in ("height", "width"))
    if (h, w) != (image_size, image_size):
        v.fail("size", size.values, f"differs from the tower's image_size {image_size}")
    resample = v.integer("resample", 2, lo=0, hi=5)
    return ImageProcessing(h, w, resample, *_scaling(v, [0.5] * 3), _pan_and_scan(v))


def _pan_and_scan(v: Values) -> PanAndScan | None:
    """The config's pan and scan (None: off), its settings within range whether on or not."""
    d = PanAndScan()
    pas = PanAndScan(v.integer("pan_and_scan_min_crop_size", d.min_crop, lo=1, hi=MAX_EDGE),
                     v.integer("pan_and_scan_max_num_crops", d.max_crops, lo=2, hi=MAX_CROPS),
                     v.number("pan_and_scan_min_ratio_to_activate", d.min_ratio, lo=1.0,
                              hi=float(MAX_EDGE)))
    return pas if v.flag("do_pan_and_scan", False) else None


def crop_boxes(height: int, width: int, pas: PanAndScan | None
               ) -> tuple[tuple[int, int], list[tuple[int, int, int, int]]]:
    """((rows, cols) of the crops, each crop's (left, top, right, bottom) row by row) of an
    image of that size, as Gemma 3's processor cuts it; ((0, 0), []) where it is not."""
    if pas is None:
        return (0, 0), []
    wide = width >= height
    long, short = (width, height) if wide else (height, width)
    if long / short < pas.min_ratio:
        return (0, 0), []
    n = min(int(math.floor(long / short + 0.5)), long // pas.min_crop)
    n = min(max(2, n), pas.max_crops)
    cols, rows = (n, 1) if wide else (1, n)
    cw, ch = -(-width // cols), -(-height // rows)
    if min(cw, ch) < pas.min_crop:
        return (0, 0), []
    # a crop past the image's edge keeps what the image has (array slicing, no padding)
    return (rows, cols), [(c * cw, r * ch, min((c + 1) * cw, width), min((r + 1) * ch, height))
                          for r in range(rows) for c in range(cols)]


def image_grid(height: int, width: int, processing) -> tuple[int, int]:
    """The (rows, cols) of tiles (Idefics3) or crops (Gemma 3) an image of that size is
    cut into ((0, 0): the image alone)."""
    if isinstance(processing, TileProcessing):
        return tile_grid(height, width, processing)
    return crop_boxes(height, width, processing.pan_and_scan)[0]


def read(source: str | Path | bytes, name: str | None = None) -> tuple[bytes, str]:
    """(the image file's bytes, the name errors give it): `source` is a path, or the bytes
    themselves (a server's decoded upload; `name` then says which)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        name = name or "the image"
    else:
        path = Path(source)
        name = name or str(path)
        try:
            if path.stat().st_size > MAX_BYTES:
                raise ImageError(f"{name}: {path.stat().st_size} bytes is more than the "
                                 f"{MAX_BYTES} poot reads as an image")
            data = path.read_bytes()
        except FileNotFoundError:
            raise ImageError(f"{name}: no such image file") from None
        except OSError as exc:
            raise ImageError(f"{name}: cannot read it ({_one_line(exc)})") from None
    if len(data) > MAX_BYTES:
        raise ImageError(f"{name}: {len(data)} bytes is more than the {MAX_BYTES} poot "
                         f"reads as an image")
    return data, name


@contextmanager
def _opened(source: str | Path | bytes, name: str | None = None):
    """The image (a path, or its file's bytes) opened lazily by Pillow, its size within
    MAX_PIXELS; any failure inside is one ImageError naming it."""
    Image = require("PIL.Image", "pillow")
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    data, path = read(source, name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                if w * h > MAX_PIXELS:
                    raise ImageError(f"{path}: {w} x {h} pixels is more than the "
                                     f"{MAX_PIXELS} poot decodes (a decompression bomb?)")
                yield img, path
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{path}: refused as a decompression bomb ({exc})") from None
    except Image.UnidentifiedImageError:
        raise ImageError(f"{path}: not an image format Pillow reads") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # Pillow's decoder errors
        raise ImageError(f"{path}: corrupt or truncated image ({_one_line(exc)})") from None


def open_rgb(source: str | Path | bytes, name: str | None = None):
    """The image (a path, or its file's bytes) as a decoded RGB PIL image, or an
    ImageError naming it."""
    with _opened(source, name) as (img, path):
        img.load()
        return _rgb(img, path)


def image_size(source: str | Path | bytes, name: str | None = None) -> tuple[int, int]:
    """(width, height) from the image's header, nothing decoded; or an ImageError."""
    with _opened(source, name) as (img, _):
        return img.size


def _rgb(img, path: str):
    """RGB, with transparency composited on white (as transformers' convert_to_rgb)."""
    Image = require("PIL.Image", "pillow")
    if img.mode not in MODES:
        raise ImageError(f"{path}: image mode {img.mode!r} is not supported (8-bit modes "
                         f"only: {', '.join(sorted(MODES))})")
    if img.mode == "RGB":
        return img.copy()
    try:
        rgba = img.convert("RGBA")
    except ValueError as exc:
        raise ImageError(f"{path}: image mode {img.mode!r} has no RGB form "
                         f"({_one_line(exc)})") from None
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def pixels(source: str | Path | bytes, processing: ImageProcessing,
           name: str | None = None) -> np.ndarray:
    """The tower's input [3, H, W] float32 for the image (a path, or its file's bytes)."""
    p = processing
    return _normalized(_resized(open_rgb(source, name), (p.height, p.width), p), p)


def frames(source: str | Path | bytes, processing: ImageProcessing,
           name: str | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """(the tower's inputs [1 + crops, 3, H, W] float32: the whole image, then its pan and
    scan crops row by row; (rows, cols) of the crops, (0, 0) for none) of the image."""
    p = processing
    img = open_rgb(source, name)
    grid, boxes = crop_boxes(img.height, img.width, p.pan_and_scan)
    out = [img, *(img.crop(box) for box in boxes)]
    return np.stack([_normalized(_resized(f, (p.height, p.width), p), p) for f in out]), grid


def _normalized(img, p) -> np.ndarray:
    """[3, H, W] float32: the RGB image rescaled and normalized as `p` says."""
    x = np.asarray(img, np.float32)                        # [H, W, 3]
    if p.rescale is not None:
        x = x * np.float32(p.rescale)
    if p.mean is not None:
        x = (x - np.asarray(p.mean, np.float32)) / np.asarray(p.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def longest_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge at `longest` and the other in ratio, made
    even, then both within MAX_EDGE, as Idefics3's processor computes them."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height
    if width >= height and width > MAX_EDGE:
        width, height = MAX_EDGE, int(MAX_EDGE / ratio)
    elif height > width and height > MAX_EDGE:
        height, width = MAX_EDGE, int(MAX_EDGE * ratio)
    return max(height, 1), max(width, 1)


def tiled_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) rounded up to multiples of `tile`, the longer edge first and the
    other from it in ratio, as Idefics3's processor computes them."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return max(height, tile), max(width, tile)


def _resized(img, size: tuple[int, int], p):
    """The image at (height, width) through the processor's filter."""
    h, w = size
    return img if img.size == (w, h) else img.resize((w, h), resample=p.resample)


def tile_grid(height: int, width: int, p: TileProcessing) -> tuple[int, int]:
    """The (rows, cols) of tiles an image of that size is cut into ((0, 0): one tile)."""
    if not p.split:
        return 0, 0
    if p.longest is not None:
        height, width = longest_size(height, width, p.longest)
    height, width = tiled_size(height, width, p.tile)
    return (height // p.tile, width // p.tile) if max(height, width) > p.tile else (0, 0)


def tiles(source: str | Path | bytes, processing: TileProcessing, name: str | None = None
          ) -> tuple[np.ndarray, tuple[int, int]]:
    """(the tower's inputs [T, 3, tile, tile] float32, (rows, cols) of the tile grid) for
    the image: rows x cols tiles row by row and then the whole image, or (0, 0) and the
    whole image alone where it fits one tile or splitting is off."""
    p, t = processing, processing.tile
    img = open_rgb(source, name)
    grid = tile_grid(img.height, img.width, p)
    if p.longest is not None:
        img = _resized(img, longest_size(img.height, img.width, p.longest), p)
    if not p.split:
        frames = [_resized(img, (t, t), p)]
    else:
        img = _resized(img, tiled_size(img.height, img.width, t), p)
        frames = [img.crop((c * t, r * t, (c + 1) * t, (r + 1) * t))
                  for r in range(grid[0]) for c in range(grid[1])]
        frames.append(_resized(img, (t, t), p))
    return np.stack([_normalized(f, p) for f in frames]), grid
