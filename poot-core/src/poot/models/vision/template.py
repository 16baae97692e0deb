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
