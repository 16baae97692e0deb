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
            calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                          "function": {"name": obj["name"],
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
        return calls


class CallStream:
    """One streamed choice's deltas with tools. A forced call is streamed as it is written:
    once the answer's head `{"name":"F","arguments":` has come, a delta names the call, and
    each later piece of text is a delta of its arguments (the last character, the object's
    closing brace, held back until the end). Otherwise (tool_choice "auto") the text is held
    until the answer ends, then sent as its calls or as content."""

    HEAD = re.compile(r'\{"name":"([A-Za-z0-9_-]{1,64})","arguments":')

    def __init__(self, tools: Tools):
        self.tools, self.text, self.sent = tools, "", 0
        self.call_id: str | None = None

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        if not self.tools.forced:
            return []
        out = []
        if self.call_id is None:
            head = self.HEAD.match(self.text)
            if head is None:
                return []
            self.call_id, self.sent = "call_" + uuid.uuid4().hex[:24], head.end()
            out.append({"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                        "function": {"name": head.group(1),
                                                     "arguments": ""}}]})
        args = self.text[self.sent: len(self.text) - 1]
        if args:
            self.sent += len(args)
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})
        return out

    def end(self) -> tuple[list[dict], bool]:
        """The last deltas, and whether the answer was tool calls."""
        if self.call_id is not None:
            rest = self.text[self.sent:].removesuffix("}")
            return ([{"tool_calls": [{"index": 0, "function": {"arguments": rest}}]}]
                    if rest else []), True
        content, calls = self.tools.parse(self.text)
        if calls:
            return [{"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}], True
        return [{"content": content}], False


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
