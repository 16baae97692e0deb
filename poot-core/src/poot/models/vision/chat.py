"""Images in a chat: the image tokens placed in the prompt, the encoder's rows written at
their positions through the hosted embedding rows of the prefill steps.

Gemma 3's processor puts each image where the conversation has it (among a message's
texts, in any user turn) and expands its <start_of_image> to "\\n\\n", <start_of_image>,
`mm_tokens_per_image` image soft tokens, <end_of_image>, "\\n\\n"; where its config asks for
pan and scan, an image with crops becomes "Here is the original image " and that block, then
" and here are some crops to help you see better " and one such block per crop, joined by
spaces. The soft tokens' ids are placeholders: the step reads the image's rows (the whole
image's, then each crop's) at their positions instead. As in Gemma 3, each block's soft
tokens also see each other both ways (hosted spans): the whole prompt is prefilled in one
step (its length rounded up to `PREFILL_ROUND`), so no block is cut.
Idefics3 (SmolVLM) tiles its images and places their tokens as poot.models.vision.idefics3
says; its attention stays causal, so its prompts prefill in the model's usual chunks.
Qwen2.5-VL sizes each image's tokens by its own grid (poot.models.vision.qwen25vl_chat),
and its text model turns them by their M-RoPE positions (poot.models.mrope).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from poot.errors import BindError, RequestError
from poot.models import hosted_rows
from poot.models.vision.config import TileTokens
from poot.models.vision.qwen25vl_config import Qwen25Tokens
from poot.models.vision.template import IMAGE, image_segments, user_turn

#: an image prompt's prefill step is its length rounded up to this (fewer plans to build)
PREFILL_ROUND = 64
#: images whose rows an ImageChat keeps
CACHED_IMAGES = 16


#: the text around each image's tokens in Gemma 3's processor
AROUND = "\n\n"
#: the text Gemma 3's processor writes around an image with pan-and-scan crops
ORIGINAL, CROPS = "Here is the original image ", " and here are some crops to help you see better "


def gemma_texts(crops: int) -> list[str]:
    """The text before, between and after the token blocks of a Gemma 3 image with
    `crops` crops (crops + 1 blocks: the whole image, then each crop)."""
    if not crops:
        return [AROUND, AROUND]
    between = [AROUND + CROPS + AROUND] + [AROUND + " " + AROUND] * (crops - 1)
    return [ORIGINAL + AROUND, *between, AROUND]


def gemma_ids(tokenizer, tokens, segments: Sequence, crops: Sequence[int]
              ) -> tuple[list[int], list[list[int]]]:
    """(the token ids of the segments (poot.models.vision.template) with each image's
    blocks, the positions of each image's soft tokens in order). The text before and after
    an image joins the segment beside it, as the processor's expanded prompt is tokenized
    (one "\\n\\n\\n" token after "user\\n" in Gemma's vocabulary, not "\\n" and "\\n\\n")."""
    from poot.models.chat import encode_piece

    if sum(s is IMAGE for s in segments) != len(crops):
        raise RequestError(f"the prompt holds {sum(s is IMAGE for s in segments)} images, "
                           f"{len(crops)} given")
    ids: list[int] = []
    positions: list[list[int]] = []
    owed = ""            # the text after the last image, joining the next segment
    for j, seg in enumerate(segments):
        if seg is not IMAGE:
            text, is_content = seg
            if j + 1 < len(segments) and segments[j + 1] is IMAGE:
                text += gemma_texts(crops[len(positions)])[0]
            ids += encode_piece(tokenizer, owed + text, is_content)
            owed = ""
            continue
        texts = gemma_texts(crops[len(positions)])
        if j == 0 or segments[j - 1] is IMAGE:
            ids += tokenizer.encode(owed + texts[0], add_special=False)
        where: list[int] = []
        for b in range(len(texts) - 1):
            if b:
                ids += tokenizer.encode(texts[b], add_special=False)
            ids.append(tokens.boi)
            where += range(len(ids), len(ids) + tokens.count)
            ids += [tokens.soft] * tokens.count + [tokens.eoi]
        positions.append(where)
        owed = texts[-1]
    if owed:
        ids += tokenizer.encode(owed, add_special=False)
    return ids, positions


def chat_ids(tokenizer, tokens, prompt: str, images: int, system: str | None = None
             ) -> tuple[list[int], list[int]]:
    """(the chat's token ids with `images` image blocks before the user's text, the
    position of each image's first soft token)."""
    ids, positions = image_chat_ids(tokenizer, tokens, prompt, [(0, 0)] * images, system)
    return ids, [where[0] for where in positions]


def read_image_processing(vision):
    """How the checkpoint's processor prepares pixels (poot.models.vision.preprocess)."""
    from poot.models.vision.preprocess import read_processing

    if vision.processing is not None:     # stated beside the tower (an mmproj's keys)
        return vision.processing
    tiling = getattr(vision.tokens, "tiling", None)
    return tiling if tiling is not None else read_processing(vision.folder,
                                                             vision.config.image_size)


def prepare(source, processing, name: str | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """(the tower's inputs [T, C, H, W], the (rows, cols) of its tile or crop grid: (0, 0)
    for the image alone) of an image (a path, or its file's bytes)."""
    from poot.models.vision.preprocess import TileProcessing, frames, tiles
    from poot.models.vision.qwen25vl_preprocess import Qwen25Processing, qwen25_patches

    if isinstance(processing, TileProcessing):
        return tiles(source, processing, name)
    if isinstance(processing, Qwen25Processing):   # patch rows, the (rows, cols) of patches
        return qwen25_patches(source, processing, name)
    return frames(source, processing, name)


def image_grids(tokens, images: Sequence[tuple[bytes, str]], processing=None
                ) -> list[tuple[int, int]]:
    """The tile or crop grid of each image (its file's bytes, its name) as `processing` cuts
    it (None: as the image tokens' tiling does, Idefics3's; else the image alone), from its
    header: what the prompt's tokens depend on before the pixels are decoded."""
    from poot.models.vision.preprocess import image_grid, image_size

    if isinstance(tokens, Qwen25Tokens):      # the patch grid each image is resized to
        from poot.models.vision.qwen25vl_preprocess import header_grid

        return [header_grid(data, name, processing or tokens.tiling)
                for data, name in images]
    processing = processing or getattr(tokens, "tiling", None)
    if processing is None:
        return [(0, 0)] * len(images)
    out = []
    for data, name in images:
        w, h = image_size(data, name)
        out.append(image_grid(h, w, processing))
    return out


def image_chat_ids(tokenizer, tokens, messages: str | Sequence[dict], grids,
                   system: str | None = None) -> tuple[list[int], list[list[int]]]:
    """(the conversation's token ids with each image's tokens where it stands, the
    positions that take each image's rows, in order) as the processor of the family whose
    image tokens `tokens` are places them; one tile or crop grid per image. `messages`:
    their contents may list text and image parts (poot.models.vision.template), or a user
    message's text with the images before it (after the optional `system` message)."""
    if isinstance(messages, str):
        messages = user_turn(messages, len(grids), system)
    if isinstance(tokens, TileTokens):
        from poot.models.vision import idefics3

        segments = image_segments(tokenizer, messages, tokens.image_text)
        return idefics3.chat_ids(tokenizer, tokens, segments, grids)
    if isinstance(tokens, Qwen25Tokens):
        from poot.models.vision import qwen25vl_chat

        segments = image_segments(tokenizer, messages, qwen25vl_chat.PLACEHOLDER)
        return qwen25vl_chat.chat_ids(tokenizer, tokens, segments, grids)
    segments = image_segments(tokenizer, messages, tokenizer.tokens[tokens.boi])
    return gemma_ids(tokenizer, tokens, segments, [r * c for r, c in grids])


def placed(tokens, positions, rows) -> tuple[dict[int, np.ndarray], dict[int, int]]:
    """(position -> hosted row, position -> span id: one per run of consecutive image
    positions from 1 (an image's block, each crop's), where the family's image tokens see
    each other both ways; else none)."""
    hosted, spans = {}, {}
    span = 0
    for k, (where, image) in enumerate(zip(positions, rows, strict=True)):
        if len(where) != len(image):
            raise BindError(f"image {k + 1} has {len(image)} rows for {len(where)} tokens")
        hosted.update(zip(where, image))
        if tokens.both_ways:
            for p in where:
                span += p - 1 not in spans
                spans[p] = span
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
                raise BindError(f"image block {min(cut)}'s tokens cross a prefill step's "
                                f"end")
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
            raise RequestError(f"{model.checkpoint.path} has no vision tower (a Gemma 3, "
                               f"Idefics3 or Qwen2.5-VL HF folder has vision_config in "
                               f"config.json; a GGUF takes its vision projector GGUF with "
                               f"--mmproj)")
        if model.kv != "dense" or model.tp is not None:
            raise RequestError("images are fed through a dense KV cache on one rank; drop "
                               "--kv paged and --tp")
        if model._sessions:
            raise RequestError("attach images before the model's first generation")
        model.hosted_prefill = True
        self.model, self.vision, self.progress = model, vision, progress
        self.processing = read_image_processing(vision)
        if isinstance(vision.tokens, Qwen25Tokens):
            from poot.models.vision.qwen25vl import Qwen25Encoder as VisionEncoder
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
        for key, name, px, grid in prepared:
            if px is not None and key not in self.cache:
                self.cache[key] = self.encoder.encode(px, grid) if isinstance(
                    self.vision.tokens, Qwen25Tokens) else self.encoder.encode(px)
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

    def prompt(self, prompt: str | Sequence[dict], images: Sequence,
               system: str | None = None
               ) -> tuple[list[int], dict[int, np.ndarray], dict[int, int]]:
        """(token ids, position -> hosted row, position -> span id: one per image block,
        Gemma 3 only) of a chat turn with `images` before the text `prompt`, or of a
        conversation `prompt` (messages whose contents list text and image parts,
        poot.models.vision.template) with `images` where its image parts stand."""
        return self._prompt(prompt, images, system)[:3]

    def _prompt(self, prompt, images: Sequence, system: str | None):
        """prompt's three, and the M-RoPE positions [3, T] and shift of an M-RoPE model's
        prompt (else None, 0)."""
        if not images:
            raise RequestError("no image given")
        prepared = self._prepared(images)
        grids = [grid for *_, grid in prepared]
        ids, positions = image_chat_ids(self.model.tokenizer, self.vision.tokens, prompt,
                                        grids, system)
        if len(ids) >= self.model.config.max_seq:
            raise RequestError(f"{len(images)} image(s) and the text take {len(ids)} tokens; "
                               f"this model was loaded with room for "
                               f"{self.model.config.max_seq} (load with a larger max_seq)")
        rope = (None, 0)
        if isinstance(self.vision.tokens, Qwen25Tokens):
            from poot.models.vision.qwen25vl_chat import prompt_positions

            rope = prompt_positions(len(ids), positions, grids, self.vision.tokens.merge)
        return (ids, *placed(self.vision.tokens, positions, self._rows(prepared)), *rope)

    def generate(self, prompt: str | Sequence[dict], images: Sequence = (), *,
                 system: str | None = None, stream: bool = False,
                 **sampling) -> str | Iterator[str]:
        """Model.generate for a user message `prompt` with `images` (paths, or image files'
        bytes) before it, or a conversation with them where its image parts stand (as
        `prompt` takes them), through the chat template; no images: the message alone (the
        attached model's prefill plans take hosted rows, so its text prompts go through
        here too)."""
        model = self.model
        rope = (None, 0)
        if images:
            ids, hosted, spans, *rope = self._prompt(prompt, images, system)
        elif isinstance(self.vision.tokens, (TileTokens, Qwen25Tokens)):
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
            turned = None
            if model.config.mrope is not None:   # the prompt's M-RoPE positions, its shift
                from poot.models.vision.qwen25vl_chat import MRopeStepper

                where = rope[0] if rope[0] is not None else np.tile(np.arange(len(ids)),
                                                                    (3, 1))
                turned = MRopeStepper(session, where, rope[1])
            stepper = HostedPrompt(session, hosted, model.config.dim, len(ids), spans, chunk)
            try:
                yield from pieces
            finally:
                stepper.release()
                if turned is not None:
                    turned.release()

        return run() if stream else "".join(run())
