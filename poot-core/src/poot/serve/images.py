"""Images in `poot serve`: OpenAI `image_url` content parts read, decoded and encoded, and
an image request's prefill and decode steps (poot.models.vision).

The HTTP side reads each part (a base64 data URL; a remote http(s) URL only where the
server allows them, fetched with a size cap and a timeout) and decodes its pixels off the
event loop, so a bad image is a 400 before the request is queued. The scheduler's thread
encodes the pixels (the rows of an image whose bytes it saw lately come from its cache,
keyed by their SHA-256) and runs the request on a dense session of its own: the whole
prompt in one prefill step with the image rows in the hosted slots and each image's soft
tokens seeing each other both ways (poot.models.vision.chat.HostedPrompt), then one decode
step per turn beside the paged batch, its logits sampled on the host. The paged steps
carry no hosted slots, so one image request runs at a time. A Qwen2.5-VL prompt's tokens
take their M-RoPE positions in that step, and its decode steps the prompt's shift.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from poot.errors import ImageError, RequestError

#: the largest remote image fetched (bytes), and how long a fetch may take (seconds)
MAX_FETCH_BYTES = 16 << 20
FETCH_TIMEOUT_S = 10.0


@dataclass
class ImagePart:
    """One image of a request: its file's bytes, or (remote) its URL until fetched."""

    name: str                   # where the request holds it, for errors
    data: bytes | None = None
    url: str | None = None


def image_part(part, where: str, allow_urls: bool) -> ImagePart:
    """A checked {"type": "image_url", "image_url": {"url": ...}} content part."""
    spec = part.get("image_url")
    if isinstance(spec, str):
        spec = {"url": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str) or \
            set(spec) - {"url", "detail"}:
        raise RequestError(f"{where}.image_url must be an object with a url string",
                           param=where)
    url = spec["url"]
    if url.startswith("data:"):
        return ImagePart(where, data=data_url(url, where))
    if url.startswith(("http://", "https://")):
        if not allow_urls:
            raise RequestError(f"{where}: this server takes images as base64 data URLs "
                               f"only (start it with --allow-image-urls to fetch remote "
                               f"ones)", param=where)
        return ImagePart(where, url=url)
    raise RequestError(f"{where}: an image url must be a data: URL or http(s), got "
                       f"{url[:40]!r}", param=where)


def data_url(url: str, where: str) -> bytes:
    """The bytes of a data:image/...;base64,... URL."""
    head, comma, payload = url.partition(",")
    kind = head[len("data:"):].split(";")
    if not comma or not kind[0].startswith("image/") or "base64" not in kind[1:]:
        raise RequestError(f"{where}: not a base64 image data URL (want "
                           f"data:image/...;base64,...), got {head[:40]!r}", param=where)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{where}: the data URL's payload is not base64",
                           param=where) from None


def fetch(url: str, where: str) -> bytes:
    """A remote image's bytes, at most MAX_FETCH_BYTES, within FETCH_TIMEOUT_S."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as r:
            data = r.read(MAX_FETCH_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ImageError(f"{where}: could not fetch {url[:80]} ({exc})") from None
    if len(data) > MAX_FETCH_BYTES:
        raise ImageError(f"{where}: {url[:80]} has more than the {MAX_FETCH_BYTES} bytes "
                         f"poot fetches for an image")
    return data


def grids(tokens, parts: list[ImagePart]) -> list[tuple[int, int]]:
    """Each image's tile, crop or patch grid (poot.models.vision.chat.image_grids), read from
    the header of its bytes where the model cuts or sizes its images (Idefics3's tiles,
    Gemma 3's pan and scan, Qwen2.5-VL's grids): its prompt's length depends on it, so such a model takes no remote image, whose
    bytes come only once the request is queued."""
    from poot.models.vision.chat import image_grids

    tiling = getattr(tokens, "tiling", None)
    if tiling is not None:
        remote = next((p for p in parts if p.data is None), None)
        if remote is not None:
            raise RequestError(f"{remote.name}: this model cuts its images into tiles or "
                               f"crops, or sizes their grids, and its prompt depends on their "
                               f"sizes: send them as base64 data URLs",
                               param=remote.name)
    return image_grids(tokens, [(p.data, p.name) for p in parts])


class ServedImages:
    """A vision model's encoder and its rows of the images seen lately (by the SHA-256 of
    their bytes), with the counters /stats shows."""

    def __init__(self, model, cached: int | None = None):
        from poot.models.vision.chat import CACHED_IMAGES, read_image_processing
        from poot.models.vision.encoder import VisionEncoder

        vision = model.checkpoint.vision
        self.model, self.vision = model, vision
        self.processing = read_image_processing(vision)
        #: Qwen2.5-VL's tower runs per image grid
        self.by_grid = vision.config.connector == "qwen25vl"
        if self.by_grid:
            from poot.models.vision.qwen25vl import Qwen25Encoder as VisionEncoder
        self.encoder = VisionEncoder(vision.config, vision.weights(), model.backend,
                                     model.device)
        self.capacity = CACHED_IMAGES if cached is None else cached
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.counters = dict(images=0, image_cache_hits=0, images_encoded=0,
                             image_encode_s=0.0)
        self._session = None

    def prepare(self, parts: list[ImagePart]) -> list[tuple[str, tuple]]:
        """Each image's (key, (pixels, grid)): fetched where remote, then decoded (even an image
        whose rows are cached: the bytes are checked whatever the cache holds, and its rows
        may be evicted before the request runs). Any thread; a bad image raises ImageError
        (a 400)."""
        from poot.models.vision.chat import prepare
        from poot.models.vision.preprocess import read

        out = []
        for part in parts:
            data = part.data if part.url is None else fetch(part.url, part.name)
            data, name = read(data, part.name)
            key = hashlib.sha256(data).hexdigest()
            out.append((key, prepare(data, self.processing, name)))
        return out

    def rows(self, prepared: list[tuple[str, tuple]]) -> list[np.ndarray]:
        """The rows [tokens, dim] of each prepared image (the scheduler's thread)."""
        out = []
        for key, (px, grid) in prepared:
            self.counters["images"] += 1
            if key in self.cache:
                self.counters["image_cache_hits"] += 1
            else:
                self.cache[key] = self.encoder.encode(px, grid) if self.by_grid else \
                    self.encoder.encode(px)
                self.counters["images_encoded"] += 1
                self.counters["image_encode_s"] += self.encoder.seconds
            self.cache.move_to_end(key)
            out.append(self.cache[key])
        while len(self.cache) > max(self.capacity, len(prepared)):
            self.cache.popitem(last=False)
        return out

    def session(self, weights):
        """The dense session image requests run on (made on first use), sharing the
        served weights `weights` (None: its own upload)."""
        if self._session is None:
            from poot.runtime.session import Session

            m = self.model

            def graph(tokens: int, batch: int):
                # prefill steps take the hosted rows and spans; the decode step reads
                # every row's logits (the host samples an image request's tokens)
                return m.step_graph(tokens, batch, "dense",
                                    logits="rows" if tokens > 1 else "all",
                                    hosted_rows=tokens > 1)

            s = Session(graph, m.bound_consts, kv="dense", capacity=m.config.max_seq,
                        prefill_tokens=m.prefill_tokens, target=(m.backend, m.device))
            m._fit_features(s)     # the LoRA adapter slot and the expert pager, as served
            self._session = s
        if weights is not None and self._session.weights is None and \
                not self._session.executors:
            self._session.weights = weights
        return self._session

    def prefill(self, seq, gen) -> np.ndarray:
        """Feed an image request's prompt (its rows at their positions) to its open
        sequence of the dense session in one step; the logits after its last token."""
        from poot.models.vision.chat import PREFILL_ROUND, HostedPrompt, placed

        s, ids = self._session, gen.prompt_ids
        hosted, spans = placed(self.vision.tokens, gen.image_positions, self.rows(gen.pixels))
        chunk = min(-(-len(ids) // PREFILL_ROUND) * PREFILL_ROUND, self.model.config.max_seq)
        turned = None
        if self.model.config.mrope is not None:   # the prompt's positions; decode's shift
            from poot.models.mrope import SHIFT
            from poot.models.vision.qwen25vl_chat import MRopeStepper, prompt_positions

            where, shift = prompt_positions(len(ids), gen.image_positions,
                                            [grid for _, (_, grid) in gen.pixels],
                                            self.vision.tokens.merge)
            s.row_slots[SHIFT][seq] = shift
            turned = MRopeStepper(s, where, shift)
        stepper = HostedPrompt(s, hosted, self.model.config.dim, len(ids), spans, chunk)
        try:
            return s.prefill(seq, ids)
        finally:
            stepper.release()
            if turned is not None:
                turned.release()
