"""The chat template rendered for one image turn: a user message (after an optional system
message) as (text, is_content) parts, and their token ids with the template's text taking
its control tokens and the message's text staying text. Each family places its image tokens
between them (poot.models.vision.chat, poot.models.vision.idefics3).
"""
from __future__ import annotations

from poot.errors import RequestError


def user_parts(tokenizer, prompt: str, system: str | None = None
               ) -> tuple[list[tuple[str, bool]], int]:
    """(the chat's rendered (text, is_content) parts for one user message after an optional
    system message, the index of the user's content among them)."""
    from poot.errors import ChatTemplateError
    from poot.models.chat import render_chat_parts

    if not isinstance(prompt, str) or not prompt:
        raise RequestError("a prompt with images must be non-empty text")
    msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": prompt}]
    try:
        parts = render_chat_parts(tokenizer.chat_template, msgs,
                                  bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                                  add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise RequestError(str(exc)) from exc
    return parts, max(k for k, (_, is_content) in enumerate(parts) if is_content)


def encode_parts(tokenizer, parts) -> list[int]:
    """Template text with its control tokens, message contents as plain text."""
    ids: list[int] = []
    for text, is_content in parts:
        ids += tokenizer.encode_text(text) if is_content else \
            tokenizer.encode(text, add_special=False)
    return ids


def listed_parts(tokenizer, prompt: str, system: str | None, images: int,
                 placeholder: str) -> list[tuple[str, bool]] | None:
    """The chat rendered with each message's content as a list of parts (`images` image
    parts, then the text, in the user's), as templates written for content lists take them
    (SmolVLM's, which spells each image part `placeholder`): (text, is_content) parts as
    user_parts gives; None where the template does not render content lists so (one
    placeholder per image in its own text, the texts verbatim)."""
    import re
    import secrets

    from poot.errors import ChatTemplateError, CheckpointError
    from poot.models.chat import _compile

    texts = [prompt] if system is None else [system, prompt]
    nonce = secrets.token_hex(8)
    while any(nonce in t for t in texts):
        nonce = secrets.token_hex(8)

    def render(contents):
        msgs = [{"role": "user", "content": [{"type": "image"}] * images +
                 [{"type": "text", "text": contents[-1]}]}]
        if system is not None:
            msgs.insert(0, {"role": "system", "content": [{"type": "text",
                                                           "text": contents[0]}]})
        try:
            return _compile(tokenizer.chat_template or "").render(
                messages=msgs, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                add_generation_prompt=True)
        except (ChatTemplateError, CheckpointError):
            raise
        except Exception:  # a template written for string contents fails on lists
            return None

    marked = render([f"\ue000{nonce}-{n}\ue001" for n in range(len(texts))])
    if marked is None:
        return None
    pieces = re.split(f"\ue000{nonce}-(\\d+)\ue001", marked)
    if pieces[1::2] != [str(n) for n in range(len(texts))]:
        return None
    parts = [(piece, False) if k % 2 == 0 else (texts[int(piece)], True)
             for k, piece in enumerate(pieces)]
    if "".join(t for t, _ in parts) != render(texts) or \
            sum(t.count(placeholder) for t, c in parts if not c) != images or \
            placeholder in parts[-1][0]:
        return None
    return [p for p in parts if p[0]]
