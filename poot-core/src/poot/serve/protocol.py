"""OpenAI request bodies checked into one `Generation`, or refused with a RequestError.

Fields follow the OpenAI API (chat and legacy completions); `top_k`, `repetition_penalty`
and `ignore_eos` are accepted as extensions, as other OpenAI-compatible servers do, and
`response_format` takes two more types, "regex" and "grammar" (Lark). A field the server
does not know, or one whose value it cannot honour (echo, best_of > 1, frequency/presence
penalties the sampler does not have), is refused by name rather than ignored, as OpenAI
refuses an unrecognized argument; a value that changes nothing (`"echo": false`,
`"tools": []`) is accepted. Every refusal is a RequestError (HTTP 400, or 404 for an
unknown model), whatever JSON a field holds. docs/serving.md lists every field.

A request that names no `max_tokens` (nor, in chat, `max_completion_tokens`) gets
`Limits.default_max_tokens` of its endpoint: 16 for /v1/completions (OpenAI's default),
DEFAULT_CHAT_MAX_TOKENS for chat (`poot serve --default-max-tokens` sets both), and never
more than the room its prompt leaves in the context.
"""
from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from poot.errors import ChatTemplateError, CheckpointError, RequestError
from poot.models.sampling import CANDIDATES
from poot.serve.tools import Tools, check_choice, check_tools

#: the chat roles the template is handed ("developer" is OpenAI's newer name for system)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
MAX_STOPS = 4
#: the most choices (`n`) one request may ask for
MAX_N = 16
#: the most alternatives per token: `top_logprobs` (chat), `logprobs` (completions), as OpenAI
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5
#: the answer length of a request that names none (see the module docstring)
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 1024


@dataclass
class Generation:
    """What one request asks the engine for, checked."""

    kind: str                              # "chat" | "completion"
    model: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    n: int = 1                             # choices, each its own sequence
    logprobs: int | None = None            # alternatives per token reported (None: off)
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    grammar: str | None = None             # llguidance's grammar the answer must match
    tools: Tools | None = None             # chat: the answer may be tool calls
    #: speculative decoding (poot.serve.speculation): None as the server does, False off
    speculate: bool | None = None
    #: Predicted Outputs: the token ids of the text the answer is expected to repeat
    prediction: list[int] | None = None
    #: chat with images (poot.serve.images): each image's part, in order, and the positions
    #: in prompt_ids that take its rows; the app sets `pixels` (key, pixels or None)
    images: list = field(default_factory=list)
    image_positions: list[list[int]] = field(default_factory=list)
    pixels: list = field(default_factory=list)
    sampling: dict = field(init=False)

    def __post_init__(self):
        self.sampling = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                             repetition_penalty=self.repetition_penalty, seed=self.seed)

    def constraint(self, tokenizer):
        """A new matcher of `grammar` for one sequence (None without a grammar)."""
        if self.grammar is None:
            return None
        from poot.serve.grammar import Constraint

        return Constraint(self.grammar, tokenizer)


@dataclass(frozen=True)
class Limits:
    """What the loaded model and its pool can hold."""

    model: str               # the one model name the server answers to
    max_seq: int             # positions per sequence (prompt + generated)
    pool_tokens: int         # the KV pool's token slots (one sequence may not exceed them)
    vocab: int               # token ids the model embeds
    adapters: tuple[str, ...] = ()  # loaded LoRA adapters, answered to by name as models
    #: endpoint kind ("completion", "chat") -> max_tokens of a request that names none
    default_max_tokens: Mapping[str, int] = field(default_factory=lambda: {
        "completion": DEFAULT_COMPLETION_MAX_TOKENS, "chat": DEFAULT_CHAT_MAX_TOKENS})
    speculate: bool = False  # the server speculates (`poot serve --speculate`)
    #: the model's image tokens (poot.models.vision.config.ImageTokens; None: text only)
    image_tokens: object = None
    image_urls: bool = False  # remote image URLs are fetched (`--allow-image-urls`)


# -- the fields of each endpoint: name -> checker(value, name) ------------------------------
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 60, 60, 6, 4


def _shown(v) -> str:
    """A value as a refusal quotes it: short, however long or deeply nested."""
    return _REPR.repr(v)


def _is_number(v) -> bool:
    # an int is finite however large (math.isfinite would overflow converting it)
    return not isinstance(v, bool) and (isinstance(v, int) or
                                        (isinstance(v, float) and math.isfinite(v)))


def _number(lo: float, hi: float, lo_open: bool = False):
    def check(v, name):
        if not _is_number(v) or v < lo or v > hi or (lo_open and v == lo):
            side = "(" if lo_open else "["
            raise RequestError(f"{name} must be a number in {side}{lo}, {hi}], got {_shown(v)}",
                               param=name)
        return float(v)
    return check


def _int(lo: int, hi: int | None = None):
    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise RequestError(f"{name} must be an integer {rng}, got {_shown(v)}", param=name)
        return v
    return check


def _bool(v, name):
    if not isinstance(v, bool):
        raise RequestError(f"{name} must be true or false, got {_shown(v)}", param=name)
    return v


def _string(v, name):
    if not isinstance(v, str):
        raise RequestError(f"{name} must be a string, got {type(v).__name__}", param=name)
    return _text(v, name)


def _text(v: str, name: str) -> str:
    """A string that is valid Unicode: JSON can carry a lone surrogate (\\ud800), which no
    tokenizer encodes."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{name} holds a lone surrogate (\\u{ord(v[_bad_at(v)]):04x}), "
                           f"which is not Unicode text", param=name) from None
    return v


def _bad_at(v: str) -> int:
    return next(i for i, c in enumerate(v) if 0xD800 <= ord(c) <= 0xDFFF)


def _same(a, b) -> bool:
    """JSON equality without Python's bool-is-int (true is not 1) and for any value,
    hashable or not."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _only(allowed, why: str):
    """A field accepted only at the value(s) that change nothing."""
    def check(v, name):
        if not any(_same(v, a) for a in allowed):
            raise RequestError(f"{name}={_shown(v)} is not supported: {why}", param=name)
        return None
    return check


def _stop(v, name):
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
            not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"{name} must be a non-empty string or a list of up to {MAX_STOPS} "
                           f"non-empty strings, got {_shown(v)}", param=name)
    return tuple(_text(s, name) for s in stops)


def _stream_options(v, name):
    if not isinstance(v, Mapping) or set(v) - {"include_usage"}:
        raise RequestError(f"{name} must be an object with only include_usage, got {_shown(v)}",
                           param=name)
    return _bool(v.get("include_usage", False), f"{name}.include_usage")


def _choices(v, name):
    """n: an integer in [1, MAX_N] (a whole float too: JSON's 2.0 is 2)."""
    return _int(1, MAX_N)(int(v) if _is_number(v) and v == int(v) else v, name)


def _logit_bias(v, name):
    """{"token id": bias in [-100, 100]}, the ids checked against the vocabulary later."""
    if not isinstance(v, Mapping):
        raise RequestError(f"{name} must be an object mapping token ids to numbers, got "
                           f"{_shown(v)}", param=name)
    out = {}
    for key, bias in v.items():
        if not (isinstance(key, str) and key.isdigit() and key.isascii()):
            raise RequestError(f"{name} keys must be token ids, got {_shown(key)}", param=name)
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise RequestError(f"{name}[{key!r}] must be a number in [-100, 100], got "
                               f"{_shown(bias)}", param=name)
        out[int(key)] = float(bias)
    return out


#: response_format types -> the fields each takes besides "type"
FORMATS = {"text": set(), "json_object": set(), "json_schema": {"json_schema"},
           "regex": {"regex"}, "grammar": {"grammar"}}


def _prediction(v, name):
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts};
    the text."""
    if not isinstance(v, Mapping) or v.get("type") != "content" or set(v) - {"type", "content"}:
        raise RequestError(f"{name} must be {{\"type\": \"content\", \"content\": ...}}, "
                           f"got {_shown(v)}", param=name)
    text = _content(v.get("content"), name)
    if not text:
        raise RequestError(f"{name}.content must not be empty", param=f"{name}.content")
    return text


def _response_format(v, name):
    """(type, spec): the grammar is made once the tokenizer is known (`_grammar`)."""
    kind = v.get("type") if isinstance(v, Mapping) else None
    if kind not in FORMATS:
        raise RequestError(f"{name}.type must be one of {sorted(FORMATS)}, got {_shown(v)}",
                           param=name)
    extra = set(v) - {"type"} - FORMATS[kind]
    if extra or FORMATS[kind] - set(v):
        raise RequestError(f"{name} of type {kind!r} takes "
                           f"{sorted(FORMATS[kind]) or 'no other field'}, got {_shown(v)}",
                           param=name)
    if kind == "json_schema":
        spec = v["json_schema"]
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping) \
                or set(spec) - {"name", "schema", "strict", "description"}:
            raise RequestError(f"{name}.json_schema must be an object with name, schema, "
                               f"strict and description, got {_shown(spec)}",
                               param=f"{name}.json_schema")
        return kind, spec.get("schema", {})
    if kind in ("regex", "grammar"):
        return kind, _string(v[kind], f"{name}.{kind}")
    return kind, None


def _grammar(fmt, tokenizer) -> str | None:
    """The llguidance grammar of a checked response_format (None for plain text)."""
    if fmt is None or fmt[0] == "text":
        return None
    from poot.serve import grammar

    kind, spec = fmt
    if kind == "json_object":
        made = grammar.json_schema_grammar({"type": "object"})
    elif kind == "json_schema":
        made = grammar.json_schema_grammar(dict(spec))
    elif kind == "regex":
        made = grammar.regex_grammar(spec)
    else:
        made = grammar.lark_grammar(spec)
    return grammar.checked(made, tokenizer)


_SAMPLING = {
    "model": _string,
    "max_tokens": _int(1),
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0, lo_open=True),
    "top_k": _int(-1, CANDIDATES),   # the sampler ranks at most CANDIDATES ids
    "repetition_penalty": _number(0.0, 10.0, lo_open=True),
    "seed": _int(0, 2**64 - 1),
    "stop": _stop,
    "stream": _bool,
    "stream_options": _stream_options,
    "ignore_eos": _bool,
    "user": _string,
    "n": _choices,
    "frequency_penalty": _only([0], "the sampler has repetition_penalty instead"),
    "presence_penalty": _only([0], "the sampler has repetition_penalty instead"),
    "logit_bias": _logit_bias,
    "speculate": _bool,
    "prediction": _prediction,
}
_COMPLETION = {**_SAMPLING, "prompt": None, "echo": _only([False], "no echo"),
               "logprobs": _int(0, MAX_COMPLETION_LOGPROBS),
               "response_format": _response_format,
               "best_of": _only([1], "one choice per request"),
               "suffix": _only([], "no insertion")}
_CHAT = {**_SAMPLING, "messages": None, "max_completion_tokens": _int(1),
         "logprobs": _bool, "top_logprobs": _int(0, MAX_TOP_LOGPROBS),
         "response_format": _response_format,
         "tools": check_tools, "tool_choice": check_choice, "parallel_tool_calls": _bool}


def _checked_fields(body, spec: dict, required: tuple[str, ...]) -> dict:
    if not isinstance(body, Mapping):
        raise RequestError(f"the request body must be a JSON object, got "
                           f"{type(body).__name__}")
    unknown = [k for k in body if k not in spec]
    if unknown:
        raise RequestError(f"unrecognized request argument supplied: {unknown[0]}",
                           param=unknown[0])
    for name in required:
        if body.get(name) is None:
            raise RequestError(f"you must provide {name!r}", param=name)
    out = {}
    for name, value in body.items():
        check = spec[name]
        if value is None or check is None:
            out[name] = value
        else:
            out[name] = check(value, name)
    return out


# -- the endpoints ------------------------------------------------------------------------
def parse_completion(body, limits: Limits, tokenizer) -> Generation:
    """POST /v1/completions: `prompt` is a string, a list of one string, or token ids."""
    f = _checked_fields(body, _COMPLETION, ("model", "prompt"))
    _check_model(f["model"], limits)
    ids = _prompt_ids(f["prompt"], tokenizer, limits.vocab)
    f["grammar"] = _grammar(f.get("response_format"), tokenizer)
    _speculation(f, limits, tokenizer)
    return _generation("completion", f, ids, f.get("max_tokens"), limits)


def parse_chat(body, limits: Limits, tokenizer) -> Generation:
    """POST /v1/chat/completions: `messages` rendered by the checkpoint's chat template."""
    from poot.models.chat import chat_ids

    f = _checked_fields(body, _CHAT, ("model", "messages"))
    _check_model(f["model"], limits)
    tools = Tools(f.get("tools") or [], f.get("tool_choice") or
                  ("auto" if f.get("tools") else "none"), tokenizer.chat_template)
    _no_control_text(f.get("tools"), tokenizer, "tools")
    images: list = []
    plain = _messages(f["messages"], tokenizer, images, limits)
    positions: list[list[int]] = []
    if images:
        ids, positions = _image_chat_ids(plain, images, f, limits, tokenizer)
    else:
        messages, variables = tools.messages(plain)
        try:   # a message's text never becomes a control token
            ids = chat_ids(tokenizer, messages, **variables)
        except (ChatTemplateError, CheckpointError) as exc:
            raise RequestError(str(exc), param="messages") from exc
    if tools.forced:
        if f.get("response_format") not in (None, ("text", None)):
            raise RequestError("response_format cannot be given with a tool_choice that "
                               "forces a call", param="response_format")
        from poot.serve import grammar

        f["grammar"] = grammar.checked(grammar.json_schema_grammar(tools.schema(), "tools"),
                                       tokenizer, "tools")
    else:
        f["grammar"] = _grammar(f.get("response_format"), tokenizer)
    f["tools"] = tools if tools.active else None
    max_tokens = f.get("max_completion_tokens") or f.get("max_tokens")
    if f.get("top_logprobs") is not None and not f.get("logprobs"):
        raise RequestError("top_logprobs needs logprobs set to true", param="top_logprobs")
    f["logprobs"] = (f.get("top_logprobs") or 0) if f.get("logprobs") else None
    _speculation(f, limits, tokenizer)
    gen = _generation("chat", f, ids, max_tokens, limits)
    gen.images, gen.image_positions = images, positions
    return gen


def _image_chat_ids(messages: list[dict], images: list, f: dict, limits: Limits,
                    tokenizer) -> tuple[list[int], list[list[int]]]:
    """(token ids, the positions of each image's rows) of a chat with images: system, user
    and assistant messages, each image where its user message's content parts have it, as
    the family's processor places them (poot.models.vision.chat.image_chat_ids)."""
    from poot.models.vision.chat import image_chat_ids
    from poot.serve.images import grids

    for n, m in enumerate(messages):
        if m["role"] not in ("system", "user", "assistant") or "tool_calls" in m:
            raise RequestError(f"messages[{n}]: a chat with images takes system, user and "
                               f"assistant messages without tool calls", param="messages")
    for name in ("tools", "n", "speculate", "prediction"):
        if f.get(name) not in (None, [], 1, False):
            raise RequestError(f"{name} cannot be combined with images", param=name)
    try:
        return image_chat_ids(tokenizer, limits.image_tokens, messages,
                              grids(limits.image_tokens, images))
    except (ChatTemplateError, CheckpointError) as exc:
        raise RequestError(str(exc), param="messages") from exc


def _speculation(f: dict, limits: Limits, tokenizer) -> None:
    """Check `speculate` and `prediction` against the server and the request's other
    fields, and turn the prediction's text into token ids. A sequence whose logits the host
    reads (logprobs, logit_bias, a grammar) does not speculate, so it cannot be asked to."""
    spec, text = f.get("speculate"), f.get("prediction")
    if spec and not limits.speculate:
        raise RequestError("this server does not speculate (start it with --speculate "
                           "lookup); leave speculate out or give a prediction",
                           param="speculate")
    if text is not None and spec is False:
        raise RequestError("a prediction is used by speculative decoding, which speculate: "
                           "false turns off", param="prediction")
    if spec or text is not None:
        host = [k for k in ("logprobs", "logit_bias", "grammar")
                if f.get(k) is not None and f.get(k) != {}]
        if host:
            name = "response_format" if host[0] == "grammar" else host[0]
            raise RequestError(f"{'prediction' if text is not None else 'speculate'} cannot "
                               f"be combined with {name}: a sequence whose logits the server "
                               f"reads does not speculate",
                               param="prediction" if text is not None else "speculate")
    f["prediction"] = None if text is None else tokenizer.encode(text, add_special=False)


@dataclass
class Embedding:
    """What one /v1/embeddings request asks for, checked."""

    model: str
    inputs: list[list[int]]        # each input's token ids
    base64: bool = False           # encoding_format "base64": little-endian float32 bytes


#: the most inputs one embeddings request may hold
MAX_INPUTS = 256


def _encoding(v, name):
    if v not in ("float", "base64") or not isinstance(v, str):
        raise RequestError(f"{name} must be \"float\" or \"base64\", got {_shown(v)}",
                           param=name)
    return v


_EMBEDDING = {"model": _string, "input": None, "user": _string, "encoding_format": _encoding,
              "dimensions": _only([], "the model's own width only")}


def parse_embedding(body, limits: Limits, tokenizer) -> Embedding:
    """POST /v1/embeddings: `input` is a string, a list of strings, a list of token ids or a
    list of such lists; each fits the context."""
    f = _checked_fields(body, _EMBEDDING, ("model", "input"))
    _check_model(f["model"], limits)
    if f["model"] != limits.model:
        raise RequestError("embeddings come from the base model, not a LoRA adapter",
                           param="model")
    given = f["input"]
    ids_list = isinstance(given, list) and given and all(
        isinstance(t, int) and not isinstance(t, bool) for t in given)
    items = [given] if isinstance(given, str) or ids_list else given
    if not isinstance(items, list) or not 0 < len(items) <= MAX_INPUTS:
        raise RequestError(f"input must be a string, a token id list, or a list of 1 to "
                           f"{MAX_INPUTS} of either", param="input")
    inputs = []
    for item in items:
        ids = _prompt_ids(item, tokenizer, limits.vocab, "input")
        if len(ids) > limits.max_seq:
            raise RequestError(f"an input has {len(ids)} tokens; this model's maximum "
                               f"context length is {limits.max_seq}", param="input",
                               code="context_length_exceeded")
        inputs.append(ids)
    return Embedding(f["model"], inputs, f.get("encoding_format") == "base64")


def _check_model(name: str, limits: Limits) -> None:
    if name != limits.model and name not in limits.adapters:
        served = ", ".join(repr(x) for x in (limits.model, *limits.adapters))
        raise RequestError(f"the model {_shown(name)} does not exist; this server serves "
                           f"{served}", status=404, param="model",
                           code="model_not_found")


def _prompt_ids(prompt, tokenizer, vocab: int, param: str = "prompt") -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError(f"{param} must not be empty", param=param)
        return tokenizer.encode(_text(prompt, param))
    if isinstance(prompt, list) and prompt and \
            all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < vocab for t in prompt):
            raise RequestError(f"{param} token ids must lie in [0, {vocab})", param=param)
        return list(prompt)
    raise RequestError(f"{param} must be a non-empty string, a list of one string, or a list "
                       f"of token ids", param=param)


def _messages(messages, tokenizer, images: list | None = None,
              limits: Limits | None = None) -> list[dict]:
    """The messages as the template takes them: role and content, an assistant's
    `tool_calls` (arguments as objects, as templates expect them) and a tool result's
    `tool_call_id`; a user message's image parts go to `images` (poot.serve.images)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    out = []
    for n, m in enumerate(messages):
        where = f"messages[{n}]"
        if not isinstance(m, Mapping):
            raise RequestError(f"{where} must be an object", param=where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(f"{where}.role must be one of {sorted(ROLES)}, got "
                               f"{_shown(role)}", param=f"{where}.role")
        allowed = {"role", "content", "name"} | FIELDS_OF_ROLE.get(role, set())
        extra = set(m) - allowed
        if extra:
            raise RequestError(f"{where} has unsupported field {sorted(extra)[0]!r}",
                               param=where)
        calls = m.get("tool_calls")
        content = m.get("content")
        found = images if role == "user" and images is not None else None
        msg = {"role": ROLES[role],
               "content": "" if calls and content is None else
               _content(content, where, found, limits)}
        if calls:
            msg["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
            _no_control_text(msg["tool_calls"], tokenizer, f"{where}.tool_calls")
        if "tool_call_id" in m:
            msg["tool_call_id"] = _string(m["tool_call_id"], f"{where}.tool_call_id")
        out.append(msg)
    return out


#: the message fields of some roles besides role, content and name
FIELDS_OF_ROLE = {"assistant": {"tool_calls"}, "tool": {"tool_call_id"}}


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list", param=where)
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or \
                not isinstance(fn.get("arguments"), str):
            raise RequestError(f"{where} holds a call without function.name and "
                               f"function.arguments (a JSON string)", param=where)
        try:
            args = json.loads(fn["arguments"])
        except ValueError:
            raise RequestError(f"{where}: function.arguments is not JSON",
                               param=where) from None
        out.append({"id": _string(call.get("id", ""), where), "type": "function",
                    "function": {"name": _text(fn["name"], where), "arguments": args}})
    return out


def _no_control_text(value, tokenizer, param: str) -> None:
    """Refuse template text (tools, tool calls) that spells a control token: the template
    renders it as its own text, where the spelling would become the token."""
    if not value:
        return
    text = json.dumps(value, ensure_ascii=False)
    for i in tokenizer.special_ids:
        spelling = tokenizer.tokens[i]
        if len(spelling) > 1 and spelling in text:
            raise RequestError(f"{param} holds the text of the control token "
                               f"{spelling!r}", param=param)


def _content(content, where: str, images: list | None = None,
             limits: Limits | None = None) -> str | list[dict]:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts; where
    `images` is given (a user message), also {"type": "image_url", ...} parts, appended
    to it (poot.serve.images.ImagePart): such a message's content is then its parts in
    order, {"type": "text", "text": ...} and {"type": "image"} (poot.models.vision.template)."""
    if isinstance(content, str):
        return _text(content, f"{where}.content")
    parts: list[dict] = []
    for k, p in enumerate(content if isinstance(content, list) else [None]):
        kind = p.get("type") if isinstance(p, Mapping) else None
        if kind == "text" and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": _text(p["text"], f"{where}.content[{k}]")})
        elif kind == "image_url" and images is not None:
            images.append(_image(p, f"{where}.content[{k}]", limits))
            parts.append({"type": "image"})
        else:
            break
    else:
        if any(p["type"] == "image" for p in parts):
            return parts
        return "".join(p["text"] for p in parts)
    raise RequestError(f"{where}.content must be a string or a list of text parts"
                       + (" and image_url parts" if images is not None else ""),
                       param=f"{where}.content")


def _image(part, where: str, limits: Limits):
    """An image_url part, refused where the served model takes no images."""
    from poot.serve.images import image_part

    if limits.image_tokens is None:
        raise RequestError(f"the model {limits.model!r} takes no images (it has no vision "
                           f"tower); send text parts only", param=where)
    return image_part(part, where, limits.image_urls)


def _generation(kind: str, f: dict, ids: list[int], max_tokens, limits: Limits) -> Generation:
    n = len(ids)
    room = min(limits.max_seq, limits.pool_tokens) - n
    if room <= 0:
        raise RequestError(f"this model's maximum context length is {limits.max_seq} tokens "
                           f"(KV pool {limits.pool_tokens}); the prompt has {n}",
                           param="messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(room, limits.default_max_tokens[kind])
    elif max_tokens > room:
        raise RequestError(f"this model's maximum context length is {limits.max_seq} tokens; "
                           f"the prompt has {n} and max_tokens asks for {max_tokens} more "
                           f"(at most {room})", param="max_tokens",
                           code="context_length_exceeded")
    bias = f.get("logit_bias") or {}
    outside = [t for t in bias if t >= limits.vocab]
    if outside:
        raise RequestError(f"logit_bias names token id {outside[0]}, outside the vocabulary "
                           f"[0, {limits.vocab})", param="logit_bias")
    top_k = f.get("top_k")
    temperature = f.get("temperature")
    return Generation(
        kind=kind, model=f["model"], prompt_ids=ids, max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=f.get("top_p") or 1.0, top_k=0 if top_k in (None, -1) else top_k,
        repetition_penalty=f.get("repetition_penalty") or 1.0, seed=f.get("seed"),
        stop=f.get("stop") or (), ignore_eos=bool(f.get("ignore_eos")),
        stream=bool(f.get("stream")),
        include_usage=bool(f.get("stream") and f.get("stream_options")),
        n=f.get("n") or 1, logprobs=f.get("logprobs"), logit_bias=bias,
        grammar=f.get("grammar"), tools=f.get("tools"), speculate=f.get("speculate"),
        prediction=f.get("prediction"))

