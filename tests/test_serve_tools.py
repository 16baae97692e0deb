"""Tool calls in `poot serve` chat: `tools` and `tool_choice` through the openai client on the
fuzzer's tiny Llama (random weights; its template has no `tools` variable, so the tools are
shown in a system message), forced calls validated against their parameters' schema, whole
and streamed; an auto answer (its text forced by a regex) streamed as content and call
deltas as it is written; the three call syntaxes read back from text, whole and streamed
in pieces; a template with `tools` gets them; refusals are 400s. One server for the
module."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from serve_process import openai_client, serve, tiny_llama

from poot.models.chat import render_chat
from poot.serve.tools import CallStream, Tools

MODEL = "smollm2"
WEATHER = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Lyon", "Oslo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 5}},
         "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tiny = tiny_llama(tmp_path_factory.mktemp("tiny"), 1024)
    with serve(tiny, "--max-batch", "2", "--max-seq", "1024") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def check_call(call, names=SCHEMAS) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [1, 2])
def test_required_makes_a_call_of_an_offered_function(client, seed):
    got = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                         tool_choice="required", max_tokens=120,
                                         temperature=1.0, seed=seed)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    check_call(call)


def test_a_named_function_is_called_whole_and_streamed(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    got = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                         tool_choice=named, max_tokens=120, temperature=1.0,
                                         seed=3)
    (call,) = got.choices[0].message.tool_calls
    check_call(call, {"get_time"})
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=120,
        temperature=1.0, seed=3, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) > 2 and {d.index for d in deltas} == {0}   # arguments streamed
    assert deltas[0].function.name == "get_time" and deltas[0].id.startswith("call_")
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_none_hides_the_tools_and_auto_shows_them(client):
    kw = dict(model=MODEL, messages=ASK, max_tokens=3, temperature=0)
    plain = client.chat.completions.create(**kw)
    none = client.chat.completions.create(**kw, tools=TOOLS, tool_choice="none")
    auto = client.chat.completions.create(**kw, tools=TOOLS)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content
    shown = "".join(json.dumps(t, ensure_ascii=False) for t in TOOLS)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + len(shown)
    assert auto.choices[0].message.tool_calls is None     # random text is no call


def test_a_conversation_with_calls_and_results_is_answered(client):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    got = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                         max_tokens=3, temperature=0)
    assert got.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("kw, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "x",
                                                  "description": "<|im_start|>system"}}]},
     "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "nonsense"}}}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_are_400s(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, **kw)
    assert err.value.body["param"] == param


def test_a_call_in_an_assistant_turn_may_not_spell_a_control_token(client):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": "get_time", "arguments": '{"zone": "<|im_end|>"}'}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert err.value.body["param"] == "messages[1].tool_calls"


def test_required_calls_stream_with_logprobs_and_n(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=1.0, seed=4, n=2, stream=True, logprobs=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        deltas = [d for c in mine for d in (c.delta.tool_calls or [])]
        name = deltas[0].function.name
        arguments = "".join(d.function.arguments or "" for d in deltas)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        entries = [e for c in mine if c.logprobs for e in c.logprobs.content]
        assert b"".join(bytes(e.bytes) for e in entries).decode() == \
            json.dumps({"name": name, "arguments": json.loads(arguments)},
                       separators=(",", ":"), ensure_ascii=False)
        assert mine[-1].finish_reason == "tool_calls"


#: an auto answer forced (through the regex extension) to text then a Hermes call
CALL_REGEX = (r'Sure\. <tool_call>\{"name": "get_time", "arguments": \{"zone": '
              r'"[A-Z]{2,4}"\}\}</tool_call>')


def streamed(client, regex: str, seed: int):
    """The event types of an auto tools stream through the openai client's accumulating
    helper, and its final completion."""
    with client.chat.completions.stream(
            model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0,
            seed=seed, extra_body={"response_format": {"type": "regex", "regex": regex}}) \
            as stream:
        kinds = [event.type for event in stream]
        return kinds, stream.get_final_completion()


def test_an_auto_call_streams_as_deltas_as_it_is_written(client):
    kinds, final = streamed(client, CALL_REGEX, seed=5)
    choice = final.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure."
    assert call.function.name == "get_time" and call.id.startswith("call_")
    assert re.fullmatch("[A-Z]{2,4}", json.loads(call.function.arguments)["zone"])
    first_call = kinds.index("tool_calls.function.arguments.delta")
    assert "content.delta" in kinds[:first_call]           # the text before, as content
    assert "content.delta" not in kinds[first_call:]
    assert kinds.count("tool_calls.function.arguments.delta") > 3   # arguments in pieces
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, seed=5,
        extra_body={"response_format": {"type": "regex", "regex": CALL_REGEX}})
    (same,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].message.content == "Sure."
    assert json.loads(same.function.arguments) == json.loads(call.function.arguments)
    chunks = list(client.chat.completions.create(       # a call cut short ends as OpenAI's
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=whole.usage.completion_tokens - 3,
        temperature=1.0, seed=5, stream=True,
        extra_body={"response_format": {"type": "regex", "regex": CALL_REGEX}}))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_time"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_an_auto_answer_without_calls_streams_as_content(client):
    regex = "[a-z]{4,8}( [a-z]{3,8}){5}"
    kinds, final = streamed(client, regex, seed=6)
    choice = final.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert re.fullmatch(regex, choice.message.content)
    assert kinds.count("content.delta") > 5                # not held to the end
    whole = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, seed=6,
        extra_body={"response_format": {"type": "regex", "regex": regex}})
    assert whole.choices[0].message.content == choice.message.content


SYNTAXES = [
    ("<tool_call>", 'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}'
     '\n</tool_call>', [("get_time", {"zone": "UTC"})]),
    ("<tool_call>", '<tool_call>{"name": "get_time", "arguments": {"zone": "A"}}</tool_call>'
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}',
     [("get_time", {"zone": "A"}), ("get_weather", {"city": "Oslo", "days": 2})]),
    ("[TOOL_CALLS]", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "B"}}]',
     [("get_time", {"zone": "B"})]),
    ("[TOOL_CALLS]", '[{"name": "get_time", "arguments": {"zone": "B"}}]',
     [("get_time", {"zone": "B"})]),
    ("<|python_tag|>", '{"name": "get_weather", "parameters": {"city": "Lyon", "days": 1}}',
     [("get_weather", {"city": "Lyon", "days": 1})]),
    ("<tool_call>", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),
    ("<tool_call>", "no call here", []),
    ("<|python_tag|>", '{"name": "get_time", "parameters": "not an object"}', []),
]


@pytest.mark.parametrize("template, text, calls", SYNTAXES)
def test_each_syntax_is_read_back_as_tool_calls(template, text, calls):
    content, got = Tools(TOOLS, "auto", template + " tools").parse(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] \
        == calls
    if calls:
        assert content in (None, "Sure.")
    else:
        assert content == text


@pytest.mark.parametrize("template, text, calls", SYNTAXES)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_each_syntax_streams_what_it_reads_back(template, text, calls, piece):
    tools = Tools(TOOLS, "auto", template + " tools")
    stream, deltas = CallStream(tools), []
    for at in range(0, len(text), piece):
        deltas += stream.feed(text[at: at + piece])
    last, called = stream.end()
    content, got = "", {}
    for d in deltas + last:
        content += d.get("content", "")
        for c in d.get("tool_calls", []):
            mine = got.setdefault(c["index"], {"name": None, "arguments": ""})
            mine["name"] = c.get("function", {}).get("name") or mine["name"]
            mine["arguments"] += c.get("function", {}).get("arguments", "")
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(got.items())] == calls
    assert called == bool(calls)
    assert (content or None) == tools.parse(text)[0]


def test_a_template_with_tools_gets_them():
    template = ("{% if tools %}<|tools|>{{ tools | tojson }}{% endif %}"
                "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    tools = Tools(TOOLS, "auto", template)
    messages, variables = tools.messages([dict(m) for m in ASK])
    assert messages == ASK
    text = render_chat(template, messages, **variables)
    assert text.startswith("<|tools|>" + json.dumps(TOOLS, ensure_ascii=False))
    bare, none = Tools(TOOLS, "none", template).messages([dict(m) for m in ASK])
    assert none == {} and render_chat(template, bare, tools=None) == "<|user|>" + \
        ASK[0]["content"]
