"""The chat template rendered for a conversation with images: messages whose content is a
string or a list of text and image parts ({"type": "text", "text": ...}, {"type":
"image"}), as segments in order: (text, is_content) pieces, the template's text taking its
control tokens and the messages' text staying text, and IMAGE where each image stands.
Each family expands its images' tokens there (poot.models.vision.chat,
poot.models.vision.idefics3).

A template written for content lists (Gemma 3's and SmolVLM's own) renders each image part
as its `placeholder`, where the images stand among the texts; one written for string
contents gets each message's texts joined, with every image where its part was.
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

from poot.errors import ChatTemplateError, CheckpointError, RequestError

#: an image's place among the segments
IMAGE = None
#: the roles a conversation with images takes
ROLES = ("system", "user", "assistant")


def user_turn(prompt: str, images: int, system: str | None = None) -> list[dict]:
    """One user message of `images` images, then the text `prompt` (after an optional
    system message): the usual message of `poot run --image`."""
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("a prompt with images must be non-empty text")
    msgs = [{"role": "system", "content": system}] if system is not None else []
    return msgs + [{"role": "user", "content": [{"type": "image"}] * images +
                    [{"type": "text", "text": prompt}]}]


def expand_images(tokenizer, segments: Sequence, grids: Sequence, block, image: int
                  ) -> tuple[list[int], list[list[int]]]:
    """(the token ids of the segments with each image's `block(grid)` ids where it stands,
    one grid per image; the positions of each image's tokens of id `image`, in order)."""
    from poot.models.chat import encode_piece

    n = sum(s is IMAGE for s in segments)
    if n != len(grids):
        raise RequestError(f"the prompt holds {n} images, {len(grids)} given")
    ids: list[int] = []
    positions: list[list[int]] = []
    for seg in segments:
        if seg is not IMAGE:
            ids += encode_piece(tokenizer, *seg)
            continue
        b = block(grids[len(positions)])
        positions.append([len(ids) + j for j, t in enumerate(b) if t == image])
        ids += b
    return ids, positions


def _pieces(messages: Sequence[dict]) -> list[list[str | None]]:
    """Each message's content as its texts, None for each image, in order."""
    out = []
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"message {n} must be an object whose role is one of {ROLES}")
        content = m.get("content")
        if isinstance(content, str):
            out.append([content])
            continue
        pieces: list[str | None] = []
        for p in content if isinstance(content, list) else [None]:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "image":
                pieces.append(IMAGE)
            elif kind == "text" and isinstance(p.get("text"), str):
                pieces.append(p["text"])
            else:
                raise RequestError(f"message {n}'s content must be a string or a list of "
                                   f"text and image parts")
        if not pieces:
            raise RequestError(f"message {n}'s content is an empty list")
        out.append(pieces)
    return out


def image_segments(tokenizer, messages: Sequence[dict], placeholder: str) -> list:
    """The rendered conversation (with the generation prompt) as segments: (text,
    is_content) pairs and IMAGE, empty texts dropped."""
    pieces = _pieces(messages)
    nonce = secrets.token_hex(8)
    texts = [t for ps in pieces for t in ps if t is not None]
    while any(nonce in t for t in texts):
        nonce = secrets.token_hex(8)
    try:
        segments = _listed(tokenizer, messages, pieces, placeholder, nonce)
        if segments is None:
            segments = _joined(tokenizer, messages, pieces, nonce)
    except ChatTemplateError as exc:   # the template's refusal of these messages
        raise RequestError(str(exc)) from exc
    return [s for s in segments if s is IMAGE or s[0]]


def _render(tokenizer, messages):
    from poot.models.chat import compile_template

    return compile_template(tokenizer.chat_template or "").render(
        messages=messages, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
        add_generation_prompt=True)


def _images_after(pieces: list) -> list[int]:
    """How many message texts stand before each image (pieces: texts or segments)."""
    out, texts = [], 0
    for p in pieces:
        if p is IMAGE:
            out.append(texts)
        else:
            texts += isinstance(p, str) or p[1]
    return out


def _listed(tokenizer, messages, pieces, placeholder: str, nonce: str) -> list | None:
    """The segments from the template rendering content lists, each image part as
    `placeholder`; None where it does not render them so (it fails on lists, changes the
    texts, or writes the placeholders elsewhere than the images stand)."""
    from poot.models.chat import placed

    texts = [t for ps in pieces for t in ps if t is not None]

    def render(text_of):
        msgs, k = [], 0
        for m, ps in zip(messages, pieces):
            content = []
            for p in ps:
                if p is IMAGE:
                    content.append({"type": "image"})
                else:
                    content.append({"type": "text", "text": text_of(k)})
                    k += 1
            msgs.append({**m, "content": content})
        try:
            return _render(tokenizer, msgs)
        except (ChatTemplateError, CheckpointError):
            raise
        except Exception:  # a template written for string contents fails on lists
            return None

    marked = render(lambda k: f"\ue000{nonce}-{k}\ue001")
    if marked is None:
        return None
    split = re.split(f"\ue000{nonce}-(\\d+)\ue001", marked)
    if split[1::2] != [str(k) for k in range(len(texts))]:
        return None
    whole = render(lambda k: texts[k])
    if whole is None:
        return None
    parts, at = [], 0
    for k, piece in enumerate(split):
        # each text as the template placed it: as it is or trimmed (jinja's trim filter)
        shown = piece if k % 2 == 0 else placed(texts[int(piece)], whole, at, split[k + 1])
        if shown is None or not whole.startswith(shown, at):
            return None
        parts.append((shown, k % 2 == 1))
        at += len(shown)
    if at != len(whole):
        return None
    segments: list = []
    for text, is_content in parts:
        if is_content:
            segments.append((text, True))
            continue
        for j, piece in enumerate(text.split(placeholder)):
            segments += [IMAGE] * (j > 0) + [(piece, False)]
    flat = [p for ps in pieces for p in ps]
    if _images_after(segments) != _images_after(flat):
        return None
    return segments


def _joined(tokenizer, messages, pieces, nonce: str) -> list:
    """The segments from the template rendering string contents: each message's texts
    joined, a private-use mark where each image stands, the marks cut out of the contents
    the template placed."""
    from poot.models.chat import render_chat_parts

    marks, msgs = 0, []
    for m, ps in zip(messages, pieces):
        content = ""
        for p in ps:
            if p is IMAGE:
                content += f"\ue002{nonce}-{marks}\ue003"
                marks += 1
            else:
                content += p
        msgs.append({**m, "content": content})
    parts = render_chat_parts(tokenizer.chat_template, msgs, bos_token=tokenizer.bos_token,
                              eos_token=tokenizer.eos_token, add_generation_prompt=True)
    segments: list = []
    seen: list[str] = []
    for text, is_content in parts:
        split = re.split(f"\ue002{nonce}-(\\d+)\ue003", text)
        if len(split) > 1 and not is_content:
            raise CheckpointError("the chat template moves an image out of its message")
        for j, piece in enumerate(split):
            if j % 2:
                seen.append(piece)
                segments.append(IMAGE)
            else:
                segments.append((piece, is_content))
    if seen != [str(k) for k in range(marks)]:
        raise CheckpointError(f"the chat template placed {len(seen)} of {marks} images, or "
                              f"not in order")
    return segments

