"""Tool calls in chat: the request's `tools` and `tool_choice` checked, shown to the model,
and its answer read back as `tool_calls`.

Showing the tools: a chat template that uses the `tools` variable (Hugging Face's
convention: Qwen, Hermes, Llama 3.1, Mistral templates) gets them as the list of OpenAI
tool objects; one that does not (SmolLM2's, the fuzzer's) gets a system message, first
or prepended to the request's own, that lists them as JSON and asks for Hermes' syntax.
Assistant turns that made calls are rendered as the template writes them if it uses
`tool_calls`, else as Hermes text in their content.

Reading calls back (tool_choice "auto"), by the syntax the template implies:
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more,
  any text around them the message's content;
- Mistral: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} (the marker is a
  control token, so the decoded text may start at the list);
- Llama 3: the whole answer one JSON object {"name", "parameters" or "arguments"}, after an
  optional `<|python_tag|>`.
A call to a function the request did not offer, or arguments that are not a JSON object,
leaves the answer as content. tool_choice "required" or a named function forces the answer
through the grammar engine (poot.serve.grammar) to one JSON object {"name", "arguments"},
the arguments valid against that function's `parameters` schema, in any template's case.
"""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping

from poot.errors import RequestError

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
#: the system text that shows tools to a template without a `tools` variable
INSTRUCTIONS = (
    "You may call one or more functions to assist with the user query. The functions are "
    "listed as JSON within <tools></tools>:\n<tools>\n{tools}\n</tools>\nTo call a function, "
    "answer with a JSON object of its name and arguments within <tool_call></tool_call> "
    "tags:\n<tool_call>\n{{\"name\": NAME, \"arguments\": ARGUMENTS}}\n</tool_call>")


def check_tools(v, name: str = "tools") -> list[dict]:
    """The request's `tools`: a list of {"type": "function", "function": {"name",
    "description", "parameters", "strict"}}."""
    if not isinstance(v, list):
        raise RequestError(f"{name} must be a list of tool objects", param=name)
    out, seen = [], set()
    for i, tool in enumerate(v):
        where = f"{name}[{i}]"
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or \
                set(tool) - {"type", "function"} or not isinstance(fn, Mapping):
            raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": "
                               f"{{...}}}}", param=name)
        if set(fn) - {"name", "description", "parameters", "strict"}:
            raise RequestError(f"{where}.function takes name, description, parameters and "
                               f"strict", param=name)
        fname = fn.get("name")
        if not isinstance(fname, str) or not NAME.fullmatch(fname) or fname in seen:
            raise RequestError(f"{where}.function.name must be a unique name of 1 to 64 "
                               f"letters, digits, _ or -", param=name)
        if not isinstance(fn.get("description", ""), str) or \
                not isinstance(fn.get("parameters", {}), Mapping):
            raise RequestError(f"{where}.function.description must be a string and "
                               f"parameters a JSON schema object", param=name)
        seen.add(fname)
        out.append({"type": "function", "function": dict(fn)})
    return out


def check_choice(v, name: str = "tool_choice"):
    """"none" | "auto" | "required" | the name of one function ({"type": "function",
    "function": {"name"}})."""
    if v in ("none", "auto", "required"):
        return v
    fn = v.get("function") if isinstance(v, Mapping) else None
    if isinstance(v, Mapping) and v.get("type") == "function" and set(v) == {"type",
                                                                            "function"} \
            and isinstance(fn, Mapping) and set(fn) == {"name"} and \
            isinstance(fn["name"], str):
        return {"name": fn["name"]}
    raise RequestError(f"{name} must be \"none\", \"auto\", \"required\" or {{\"type\": "
                       f"\"function\", \"function\": {{\"name\": ...}}}}", param=name)


class Tools:
    """The tools of one chat request, as its template shows them and its answer reads."""

    def __init__(self, tools: list[dict], choice, template: str | None):
        self.tools, self.choice = tools, choice
        self.names = {t["function"]["name"] for t in tools}
        if isinstance(choice, dict) and choice["name"] not in self.names:
            raise RequestError(f"tool_choice names the function {choice['name']!r}, which "
                               f"is not among the request's tools", param="tool_choice")
        if (choice == "required" or isinstance(choice, dict)) and not tools:
            raise RequestError("tool_choice asks for a call but the request has no tools",
                               param="tool_choice")
        template = template or ""
        self.in_template = "tools" in template
        self.calls_in_template = "tool_calls" in template
        self.syntax = "mistral" if "[TOOL_CALLS]" in template else \
            "llama3" if "<|python_tag|>" in template or "ipython" in template else "hermes"

    @property
    def active(self) -> bool:
        """The model is shown the tools and its answer may be calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice != "auto"

    def messages(self, messages: list[dict]) -> tuple[list[dict], dict]:
        """The messages and template variables that show the tools."""
        out = [self._turn(m) for m in messages]
        if not self.active:
            return out, {}
        if self.in_template:
            return out, {"tools": self.tools}
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
        text = INSTRUCTIONS.format(tools=listed)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out, {}

    def _turn(self, m: dict) -> dict:
        """An assistant turn's calls as the template can render them."""
        calls = m.get("tool_calls")
        if not calls or self.calls_in_template:
            return m
        text = "\n".join(f"<tool_call>\n{json.dumps(c['function'], ensure_ascii=False)}\n"
                         f"</tool_call>" for c in calls)
        rest = {k: v for k, v in m.items() if k != "tool_calls"}
        return {**rest, "content": (m["content"] + "\n" if m["content"] else "") + text}

    def schema(self) -> dict:
        """The JSON schema of a forced answer: one call of an allowed function."""
        allowed = [t["function"] for t in self.tools
                   if not isinstance(self.choice, dict) or
                   t["function"]["name"] == self.choice["name"]]
        calls = [{"type": "object", "properties": {
            "name": {"const": f["name"]},
            "arguments": f.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}
            for f in allowed]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls) of an answer; no calls: the text is the content."""
        if not self.active:
            return text, []
        if self.forced:
            calls = self._calls([_json(text)])
            return (None, calls) if calls else (text, [])
        if self.syntax == "hermes" and "<tool_call>" in text:
            found = [_json(m.group(1)) for m in HERMES_CALL.finditer(text)]
            calls = self._calls(found)
            if calls:
                content = HERMES_CALL.sub("", text).strip()
                return content or None, calls
            return text, []
        body = text.strip()
        if self.syntax == "mistral":
            body = body.removeprefix("[TOOL_CALLS]").strip()
            found = _json(body)
            calls = self._calls(found if isinstance(found, list) else [])
        elif self.syntax == "llama3":
            calls = self._calls([_json(body.removeprefix("<|python_tag|>").strip())])
        else:
            calls = []
        return (None, calls) if calls else (text, [])

    def _calls(self, found: list) -> list[dict]:
        """OpenAI tool_calls of the parsed objects, or [] unless every one is a call of an
        offered function with object arguments."""
        calls = []
        for obj in found:
            if not isinstance(obj, dict):
                return []
            args = obj.get("arguments", obj.get("parameters"))
            if obj.get("name") not in self.names or not isinstance(args, dict):
                return []
            calls.append({"id": _call_id(), "type": "function",
                          "function": {"name": obj["name"],
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
        return calls


#: the openers of calls: Hermes' tag (before each call, anywhere), and at the answer's start
#: Mistral's marker (before the list of calls) and Llama 3's tag (before its one call)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
OPENERS = {"mistral": ("[TOOL_CALLS]", "["), "llama3": ("<|python_tag|>", "{")}
#: a call's head up to its arguments' "{": {"name": "F", "arguments" (or "parameters"):
#: literals (a tuple: one of them) and None for the function's name, a JSON string
HEAD = ("{", ('"name"',), ":", None, ",", ('"arguments"', '"parameters"'), ":")
NAME_STRING = re.compile(r'"([A-Za-z0-9_-]{1,64})"')
NAME_BEGUN = re.compile(r'"[A-Za-z0-9_-]{0,64}')
NOT_YET, NEVER = None, -1          # what _head and _literals say besides a position


class CallStream:
    """One streamed choice's deltas with tools: its text as content deltas and its calls as
    OpenAI's `tool_calls` deltas, as soon as the syntax shows them. A call is named (index,
    id, function name) once its head `{"name": "F", "arguments": {` has come and F is an
    offered function; its arguments' text is then sent as it comes, to the object's end.
    Text that may still turn out to open a call (a prefix of `<tool_call>` at its end, an
    answer that begins like `[TOOL_CALLS]`, `[` or Llama 3's `{`) is held until that is
    known, and whitespace before and after a call is dropped, as `Tools.parse` drops it.

    A call whose head comes in another form (keys in another order, a function not
    offered) is read whole where it ends (Hermes: at `</tool_call>`; else at the answer's
    end) by `Tools.parse`, then sent as one delta or as content. Unlike a whole answer, a
    stream cannot take back what it sent: a malformed call after good ones comes as content
    and the good ones stand. A forced call (tool_choice "required" or a function) is the
    answer's one object, streamed the same way."""

    def __init__(self, tools: Tools):
        self.tools, self.text, self.at = tools, "", 0   # text[:at] is sent or dropped
        self.calls = 0                     # calls named so far (the next call's index)
        self.sent = False                  # whether any content was sent
        self.state = "element" if tools.forced else \
            "text" if tools.syntax == "hermes" else "open"
        self.framing = "single"            # "hermes" | "list" (Mistral) | "single"
        self.start = 0                     # where the call being read began (its opener)
        self.scan: _ObjectEnd | None = None

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        return self._advance(final=False)

    def end(self) -> tuple[list[dict], bool]:
        """The last deltas, and whether the answer was tool calls."""
        out = self._advance(final=True)
        return out, self.calls > 0

    def _advance(self, final: bool) -> list[dict]:
        """Steps of the state machine while they move; each appends what it can send."""
        out: list[dict] = []
        while getattr(self, "_" + self.state)(out, final):
            pass
        return out

    def _open(self, out, final) -> bool:
        """Mistral's or Llama 3's answer start: calls, or prose."""
        opener, bare = OPENERS[self.tools.syntax]
        rest = self.text[self.at:].lstrip()
        if not final and opener.startswith(rest) and rest != opener:
            return False
        if rest.startswith(opener):
            rest = rest[len(opener):].lstrip()
            if not rest and not final:
                return False
        if not rest.startswith(bare):
            self.state = "prose"
            return True
        self.start, self.at = self.at, len(self.text) - len(rest)
        if bare == "[":
            self.at, self.framing = self.at + 1, "list"
        self.state = "element"
        return True

    def _prose(self, out, final) -> bool:
        """Text read as no call: an answer that does not open with calls, or what follows
        Mistral's or Llama 3's calls."""
        self._content(out, len(self.text), final)
        return False

    def _text(self, out, final) -> bool:
        """Hermes: content up to the next `<tool_call>`."""
        found = self.text.find(HERMES_OPEN, self.at)
        if found < 0:
            held = 0 if final else _held(self.text, self.at, HERMES_OPEN)
            self._content(out, len(self.text) - held, final)
            return False
        self._content(out, found, final, before_call=True)
        self.start, self.at = found, found + len(HERMES_OPEN)
        self.framing, self.state = "hermes", "element"
        return True

    def _element(self, out, final) -> bool:
        """A call's head: the call named once it has come, or read whole where it ends."""
        head = _head(self.text, self.at)
        if head is NOT_YET and not final:
            return self._whole(out, final) if self.framing == "hermes" else False
        if head in (NOT_YET, NEVER) or head[1] not in self.tools.names:
            return self._whole(out, final)
        self.at, name = head
        self.calls += 1
        out.append({"tool_calls": [{"index": self.calls - 1, "id": _call_id(),
                                    "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        self.scan, self.state = _ObjectEnd(self.at), "arguments"
        return True

    def _arguments(self, out, final) -> bool:
        """The arguments object's text as it comes, to its end."""
        stop = self.scan.feed(self.text)
        upto = len(self.text) if stop is None else stop
        if upto > self.at:
            out.append({"tool_calls": [{"index": self.calls - 1,
                                        "function": {"arguments": self.text[self.at:upto]}}]})
            self.at = upto
        if stop is None:
            return False
        self.state = "close"
        return True

    def _close(self, out, final) -> bool:
        """The call object's "}" (and Hermes' `</tool_call>`) after its arguments."""
        closers = ("}", HERMES_CLOSE) if self.framing == "hermes" else ("}",)
        got = _literals(self.text, self.at, closers)
        if got is NOT_YET and not final:
            return False
        if got is NOT_YET:
            self.at = len(self.text)         # the answer ended inside the closer
        elif got != NEVER:
            self.at = got
        self.state = "text" if self.framing == "hermes" else \
            "separator" if self.framing == "list" and got not in (NOT_YET, NEVER) else "prose"
        return True

    def _separator(self, out, final) -> bool:
        """Mistral's list after a call: "," and the next call, or its "]"."""
        got = _literals(self.text, self.at, (",",))
        if got is NOT_YET and not final:
            return False
        if got not in (NOT_YET, NEVER):
            self.at, self.state = got, "element"
            return True
        end = _literals(self.text, self.at, ("]",))
        self.at = end if end not in (NOT_YET, NEVER) else self.at
        self.state = "prose"
        return True

    def _whole(self, out, final) -> bool:
        """A call not streamable as it comes: read whole where it ends, by Tools.parse."""
        if self.framing == "hermes":
            close = self.text.find(HERMES_CLOSE, self.at)
            if close < 0 and not final:
                return False
            end = len(self.text) if close < 0 else close + len(HERMES_CLOSE)
        elif not final:
            return False
        else:
            end = len(self.text)
        # after calls of a list or a forced answer, what is left is no call of its own
        content, calls = self.tools.parse(self.text[self.start:end]) \
            if self.framing == "hermes" or not self.calls else (None, [])
        for c in calls:
            out.append({"tool_calls": [{"index": self.calls, **c}]})
            self.calls += 1
        if not calls:
            if self.framing == "hermes" or not self.calls:
                self.at = self.start         # its opener too is content
            self._content(out, end, final=True)
        self.at = end
        self.state = "text" if self.framing == "hermes" else "prose"
        return True

    def _content(self, out, upto: int, final: bool, before_call: bool = False) -> None:
        """Send text[at:upto] as content. Whitespace at its end waits for more text: it is
        dropped before a call and at the end of an answer that made calls; so is the
        whitespace after a call where no content came before it."""
        piece = self.text[self.at:upto]
        if self.calls and not self.sent:
            kept = piece.lstrip()
            self.at, piece = self.at + len(piece) - len(kept), kept
        if before_call or (final and self.calls):
            piece, self.at = piece.rstrip(), upto
        elif final:
            self.at = upto
        else:
            piece = piece.rstrip()
            self.at += len(piece)
        if piece:
            self.sent = True
            out.append({"content": piece})


class _ObjectEnd:
    """Where a JSON object that starts at `at` ends, read as its text grows (strings and
    their escapes skipped, brackets counted)."""

    def __init__(self, at: int):
        self.pos, self.depth, self.string, self.escape = at, 0, False, False

    def feed(self, text: str) -> int | None:
        """The end (after the closing "}"), or None while it has not come."""
        for i in range(self.pos, len(text)):
            c = text[i]
            if self.string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.string = False
            elif c == '"':
                self.string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return i + 1
        self.pos = len(text)
        return None


def _head(text: str, at: int):
    """A call's head at `at` (whitespace allowed between its parts): (the position of its
    arguments' "{", the function's name); NOT_YET while the text may still become one;
    NEVER where it cannot."""
    i, name = at, None
    for part in (*HEAD, ("{",)):
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return NOT_YET
        if part is None:
            m = NAME_STRING.match(text, i)
            if m is None:
                return NOT_YET if NAME_BEGUN.fullmatch(text, i) else NEVER
            name, i = m.group(1), m.end()
            continue
        options = (part,) if isinstance(part, str) else part
        hit = next((o for o in options if text.startswith(o, i)), None)
        if hit is None:
            return NOT_YET if any(o.startswith(text[i:]) for o in options) else NEVER
        i += len(hit) if part != ("{",) else 0     # the arguments' "{" is theirs
    return i, name


def _literals(text: str, at: int, literals: tuple[str, ...]):
    """The position after `literals` in order (whitespace allowed before each) from `at`;
    NOT_YET while the text may still hold them; NEVER where it does not."""
    i = at
    for lit in literals:
        while i < len(text) and text[i].isspace():
            i += 1
        if text.startswith(lit, i):
            i += len(lit)
        elif lit.startswith(text[i:]):
            return NOT_YET
        else:
            return NEVER
    return i


def _held(text: str, at: int, marker: str) -> int:
    """How many characters at the end of text[at:] may begin `marker`."""
    for k in range(min(len(marker) - 1, len(text) - at), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
