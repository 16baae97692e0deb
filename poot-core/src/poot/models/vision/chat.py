"""Images in a chat: the image tokens placed in the prompt, the encoder's rows written at
their positions through the hosted embedding rows of the prefill steps.

Gemma 3's processor puts each image where the message's content list has it and expands its
<start_of_image> to "\\n\\n", <start_of_image>, `mm_tokens_per_image` image soft tokens,
<end_of_image>, "\\n\\n"; the image comes first in the usual message, so here every image's
block goes before the text of the user's message, in the order given. The soft tokens' ids
are placeholders: the step reads the image's rows at their positions instead. As in Gemma 3,
an image's soft tokens also see each other both ways (hosted spans): the whole prompt is
prefilled in one step (its length rounded up to `PREFILL_ROUND`), so no image is cut.
Idefics3 (SmolVLM) tiles its images and places their tokens as poot.models.vision.idefics3
says; its attention stays causal, so its prompts prefill in the model's usual chunks.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from poot.errors import BindError, RequestError
from poot.models import hosted_rows
from poot.models.vision.config import TileTokens
from poot.models.vision.template import encode_parts, user_parts

#: an image prompt's prefill step is its length rounded up to this (fewer plans to build)
PREFILL_ROUND = 64
#: images whose rows an ImageChat keeps
CACHED_IMAGES = 16


#: the text around each image's tokens in Gemma 3's processor
AROUND = "\n\n"


def chat_ids(tokenizer, tokens, prompt: str, images: int, system: str | None = None
             ) -> tuple[list[int], list[int]]:
    """(the chat's token ids with `images` image blocks before the user's text, the
    position of each image's first soft token)."""
    parts, user = user_parts(tokenizer, prompt, system)
    # the text is tokenized as the processor's expanded prompt would be: the newlines
    # around each image join the template text before and the message's text after (one
    # "\n\n\n" token after "user\n" in Gemma's vocabulary, not "\n" and "\n\n")
    head = parts[:user]
    lead = head.pop()[0] if head and not head[-1][1] else ""   # the template text before
    ids, starts = encode_parts(tokenizer, head), []
    for _ in range(images):
        ids += tokenizer.encode(lead + AROUND, add_special=False) + [tokens.boi]
        starts.append(len(ids))
        ids += [tokens.soft] * tokens.count + [tokens.eoi]
        lead = AROUND
    content = parts[user][0]
    ids += tokenizer.encode_text(lead + content) if images else \
        tokenizer.encode(lead, add_special=False) + tokenizer.encode_text(content)
    ids += encode_parts(tokenizer, parts[user + 1:])
    return ids, starts


def read_image_processing(vision):
    """How the checkpoint's processor prepares pixels (poot.models.vision.preprocess)."""
    from poot.models.vision.preprocess import read_processing

    if vision.processing is not None:     # stated beside the tower (an mmproj's keys)
        return vision.processing
    tiling = getattr(vision.tokens, "tiling", None)
    return tiling if tiling is not None else read_processing(vision.folder,
                                                             vision.config.image_size)


def prepare(source, processing, name: str | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """(the tower's inputs [T, C, H, W], the (rows, cols) of its tile grid: (0, 0) for one
    tile) of an image (a path, or its file's bytes)."""
    from poot.models.vision.preprocess import TileProcessing, pixels, tiles

    if isinstance(processing, TileProcessing):
        return tiles(source, processing, name)
    return pixels(source, processing, name)[None], (0, 0)


def image_grids(tokens, images: Sequence[tuple[bytes, str]]) -> list[tuple[int, int]]:
    """The tile grid of each image (its file's bytes, its name), from its header alone:
    what the prompt's tokens depend on before the pixels are decoded."""
    from poot.models.vision.preprocess import image_size, tile_grid

    tiling = getattr(tokens, "tiling", None)
    if tiling is None:
        return [(0, 0)] * len(images)
    out = []
    for data, name in images:
        w, h = image_size(data, name)
        out.append(tile_grid(h, w, tiling))
    return out


def image_chat_ids(tokenizer, tokens, prompt: str, grids, system: str | None = None
                   ) -> tuple[list[int], list[list[int]]]:
    """(the chat's token ids with an image per tile grid before the user's text, the
    positions that take each image's rows, in order) as the processor of the family
    whose image tokens `tokens` are places them."""
    if isinstance(tokens, TileTokens):
        from poot.models.vision import idefics3

        return idefics3.chat_ids(tokenizer, tokens, prompt, grids, system)
    ids, starts = chat_ids(tokenizer, tokens, prompt, len(grids), system)
    return ids, [list(range(s, s + tokens.count)) for s in starts]


def placed(tokens, positions, rows) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    """(position -> hosted row, position -> span id: the image's number from 1, where the
    family's image tokens see each other both ways; else none)."""
    hosted, spans = {}, {}
    for k, (where, image) in enumerate(zip(positions, rows, strict=True)):
        if len(where) != len(image):
            raise BindError(f"image {k + 1} has {len(image)} rows for {len(where)} tokens")
        hosted.update(zip(where, image))
        if tokens.both_ways:
            spans.update(dict.fromkeys(where, k + 1))
    return hosted, spans


class HostedPrompt:
    """A Session stepper for the prefill of one prompt of `length` tokens: it writes hosted
    rows (absolute position -> row) and span ids (absolute position -> span) into the dense
    prefill steps that cover them (no row: the token's own embedding), refuses a step
    without the hosted slots at a hosted position (the decode plan) and a span cut by a
    step's end, and hands the session back its own stepper and chunk size once the prompt
    is in."""

    def __init__(self, session, rows: Mapping[int, np.ndarray], dim: int, length: int,
                 spans: Mapping[int, int] | None = None, chunk: int | None = None):
        self.session, self.rows, self.dim, self.length = session, dict(rows), dim, length
        self.spans = dict(spans or {})
        self.inner, self.chunk = session.stepper, session.prefill_tokens
        session.stepper = self
        if chunk is not None:
            session.prefill_tokens = chunk

    def __call__(self, ex, slots, real):
        pos = int(np.asarray(slots["pos"]).reshape(-1)[0])
        t = int(np.asarray(slots["tokens"]).shape[-1])
        real = np.asarray(real, bool).reshape(-1)
        end = pos + int(real.sum())
        here = {i: self.rows[pos + i] for i in range(t) if real[i] and pos + i in self.rows}
        spans = {i: self.spans[pos + i] for i in range(t) if real[i] and pos + i in self.spans}
        if hosted_rows.ROWS in ex.slots:
            cut = {s for p, s in self.spans.items() if s in spans.values()
                   and not pos <= p < end}
            if cut:
                raise BindError(f"image {min(cut)}'s tokens cross a prefill step's end")
            slots.update(hosted_rows.slot_values(here, t, self.dim))
            slots.update(hosted_rows.span_values(spans, t))
        elif here:
            raise BindError(f"position {pos + min(here)} holds an image row but runs through "
                            f"a step without hosted rows; end the prompt with text")
        out = self.inner(ex, slots, real) if self.inner is not None else ex.step(slots)
        if end >= self.length:
            self.release()
        return out

    def release(self) -> None:
        """Give the session back its own stepper and chunk size."""
        if self.session.stepper is self:
            self.session.stepper = self.inner
            self.session.prefill_tokens = self.chunk


class ImageChat:
    """A loaded model (poot.load of a vision-language folder) that generates from a
    prompt with images. Make it before the model's first generation: its prefill plans then
    take hosted rows (dense KV, one rank)."""

    def __init__(self, model, progress=None):
        from poot.models.vision.encoder import VisionEncoder

        vision = getattr(model.checkpoint, "vision", None)
        if vision is None:
            raise RequestError(f"{model.checkpoint.path} has no vision tower (a Gemma 3 or "
                               f"Idefics3 HF folder has vision_config in config.json; a GGUF "
                               f"takes its vision projector GGUF with --mmproj)")
        if model.kv != "dense" or model.tp is not None:
            raise RequestError("images are fed through a dense KV cache on one rank; drop "
                               "--kv paged and --tp")
        if model._sessions:
            raise RequestError("attach images before the model's first generation")
        model.hosted_prefill = True
        self.model, self.vision, self.progress = model, vision, progress
        self.processing = read_image_processing(vision)
        self.encoder = VisionEncoder(vision.config, vision.weights(), model.backend,
                                     model.device)
        #: seconds the encoder took per image it ran in the last call (a cached one: none)
        self.image_seconds: list[float] = []
        #: the rows of the last images seen, by the SHA-256 of their files' bytes
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def rows(self, images: Sequence) -> list[np.ndarray]:
        """The language model's rows [tokens, dim] of each image (a path, or its file's
        bytes): every image is read and decoded before any runs, so a bad one refuses the
        request whole; an image whose bytes were seen lately reuses its rows."""
        return self._rows(self._prepared(images))

    def _prepared(self, images: Sequence) -> list[tuple[str, str, np.ndarray | None, tuple]]:
        """Each image's (key: its bytes' SHA-256, name, pixels or None where cached, grid)."""
        import hashlib

        from poot.models.vision.preprocess import read

        out = []
        for data, name in (read(x) for x in images):
            key = hashlib.sha256(data).hexdigest()
            px, grid = prepare(data, self.processing, name)
            out.append((key, name, None if key in self.cache else px, grid))
        return out

    def _rows(self, prepared) -> list[np.ndarray]:
        self.image_seconds = []
        keys = [key for key, *_ in prepared]
        for key, name, px, _ in prepared:
            if px is not None and key not in self.cache:
                self.cache[key] = self.encoder.encode(px)
                self.image_seconds.append(self.encoder.seconds)
                if self.progress:
                    self.progress(f"encoded {name} in {self.encoder.seconds:.2f} s")
        out = []
        for key in keys:
            self.cache.move_to_end(key)
            out.append(self.cache[key])
        while len(self.cache) > max(CACHED_IMAGES, len(set(keys))):
            self.cache.popitem(last=False)
        return out

    def prompt(self, prompt: str, images: Sequence, system: str | None = None
               ) -> tuple[list[int], dict[int, np.ndarray], dict[int, int]]:
        """(token ids, position -> hosted row, position -> span id: the image's number
        from 1, Gemma 3 only) of a chat turn with `images`."""
        if not images:
            raise RequestError("no image given")
        prepared = self._prepared(images)
        ids, positions = image_chat_ids(self.model.tokenizer, self.vision.tokens, prompt,
                                        [grid for *_, grid in prepared], system)
        if len(ids) >= self.model.config.max_seq:
            raise RequestError(f"{len(images)} image(s) and the text take {len(ids)} tokens; "
                               f"this model was loaded with room for "
                               f"{self.model.config.max_seq} (load with a larger max_seq)")
        return (ids, *placed(self.vision.tokens, positions, self._rows(prepared)))

    def generate(self, prompt: str, images: Sequence = (), *, system: str | None = None,
                 stream: bool = False, **sampling) -> str | Iterator[str]:
        """Model.generate for a user message `prompt` with `images` (paths, or image files'
        bytes) before it,
        through the chat template; no images: the message alone (the attached model's
        prefill plans take hosted rows, so its text prompts go through here too)."""
        model = self.model
        if images:
            ids, hosted, spans = self.prompt(prompt, images, system)
        elif isinstance(self.vision.tokens, TileTokens):
            # through the image prompt's rendering: SmolVLM's template takes content lists
            ids, hosted, spans = image_chat_ids(model.tokenizer, self.vision.tokens, prompt, [],
                                                system)[0], {}, {}
        else:
            ids, hosted, spans = model.prompt_ids(prompt, chat=True, system=system), {}, {}
        session = model.session()
        pieces = model.generate(ids, stream=True, **sampling)   # checks its arguments now
        chunk = None
        if spans:   # the whole prompt in one step, within the capacity
            chunk = min(-(-len(ids) // PREFILL_ROUND) * PREFILL_ROUND, model.config.max_seq)

        def run():
            stepper = HostedPrompt(session, hosted, model.config.dim, len(ids), spans, chunk)
            try:
                yield from pieces
            finally:
                stepper.release()

        return run() if stream else "".join(run())
