"""Structured outputs in `poot serve` (`response_format`: json_schema, json_object, and the
regex extension) through the openai client, on the fuzzer's tiny Llama (random weights, a
byte vocabulary, so the grammar alone makes its answers well formed): every answer parses
and validates against its schema, whole, streamed and as n choices; a constrained request
does not hold up a plain one beside it; a schema llguidance cannot use is a 400 in
OpenAI's error shape. A constrained request draws in the step graph under its token mask
(no decode step reads logits back) and gets the text the host path gives (the same request
with logprobs, whose steps read the logits back and mask them on the host); the mask's
words written into the slot allow what the host's mask allows. json_object with a
logit_bias draws in the graph too. The extra plans are made in the background. One server
for the module."""
from __future__ import annotations

import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai
import pytest
from serve_process import openai_client, serve, tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

MODEL = "smollm2"
ASK = [{"role": "user", "content": "describe a person"}]
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colour": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            "home": {"type": "object",
                     "properties": {"floor": {"type": "integer", "minimum": -2,
                                              "maximum": 9},
                                    "lit": {"type": "boolean"}},
                     "required": ["floor", "lit"], "additionalProperties": False},
        },
        "required": ["name", "age", "colour", "tags", "home"],
        "additionalProperties": False,
    },
    "array of enums": {"type": "array", "items": {"enum": ["a", "bb", 3, None]},
                       "minItems": 1, "maxItems": 4},
    "numbers": {"type": "object", "properties": {
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "count": {"type": "integer", "minimum": 10, "maximum": 99}},
        "required": ["ratio", "count"], "additionalProperties": False},
    "array of objects": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9},
            "unit": {"enum": ["kg", "m"]},
            "value": {"anyOf": [{"type": "integer", "minimum": -50, "maximum": 50},
                                {"type": "null"}]}},
        "required": ["id", "unit", "value"], "additionalProperties": False}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tiny = tiny_llama(tmp_path_factory.mktemp("tiny"), 256)
    with serve(tiny, "--max-batch", "4", "--max-seq", "256") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_answers_validate_against_their_schema(client, name):
    schema = SCHEMAS[name]
    got = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=200,
                                         temperature=1.0, seed=5, n=2,
                                         response_format=schema_format(schema))
    for choice in got.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=200, temperature=1.0, seed=9, stream=True,
        response_format=schema_format(schema)))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_answers_an_object(server, client):
    """json_object with a logit bias: bias and mask both in the step graph (no step reads
    logits back), the host path's text (the same request with logprobs)."""
    # the bias makes this random model close its strings and objects soon
    closers = {str(seeds.byte_vocab()[0].index(ch)): 6 for ch in '"}'}
    for seed in range(3):
        def ask(**extra):
            before = server.wait_idle()
            got = client.chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=200, temperature=1.0, seed=seed,
                logit_bias=closers, response_format={"type": "json_object"}, **extra)
            after = server.wait_idle()
            return got, {k: after[k] - before[k] for k in ("host_steps", "masked_steps")}
        got, steps = ask()
        assert isinstance(json.loads(got.choices[0].message.content), dict)
        assert steps == {"host_steps": 0, "masked_steps": got.usage.completion_tokens - 1}
        host, steps = ask(logprobs=True)
        assert steps["masked_steps"] == 0
        assert host.choices[0].message.content == got.choices[0].message.content


def test_the_extra_plans_are_made_in_the_background(server):
    """/stats names the host-logits and masked decode plans made, every batch size's in
    the end, whatever requests came."""
    deadline = time.monotonic() + 120
    while (s := server.stats())["extra_plans"] != {"host": s["decode_batches"],
                                                   "masked": s["decode_batches"]} \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s["ready"] and s["extra_plans"] == {"host": [1, 2, 4], "masked": [1, 2, 4]}


def test_regex_extension_and_completions_endpoint(client):
    got = client.completions.create(model=MODEL, prompt="code:", max_tokens=20,
                                    temperature=1.0, seed=1, extra_body={
                                        "response_format": {"type": "regex",
                                                            "regex": "[0-9]{3}-[a-z]{2}"}})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", got.choices[0].text)
    assert got.choices[0].finish_reason == "stop"


def test_a_constrained_request_does_not_hold_up_a_plain_one(server, client):
    def constrained(seed):
        return client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=200, temperature=1.0, seed=seed,
            response_format=schema_format(SCHEMAS["numbers"])).choices[0].message.content

    def plain(temperature=0.0):
        # greedy, or a seeded draw: either gives the text it gives alone, its rows drawn
        # beside constrained ones under a mask that allows every id
        return client.completions.create(model=MODEL, prompt="abc", max_tokens=30,
                                         temperature=temperature, seed=4,
                                         extra_body={"ignore_eos": True})

    before = server.wait_idle()
    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(constrained, s) for s in (1, 2)] + \
            [pool.submit(plain, t) for t in (0.0, 1.0)]
        answers = [j.result() for j in jobs]
    masked = server.wait_idle()["masked_steps"] - before["masked_steps"]
    for text in answers[:2]:
        jsonschema.validate(json.loads(text), SCHEMAS["numbers"])
    for got, t in zip(answers[2:], (0.0, 1.0)):
        assert got.usage.completion_tokens == 30
        assert got.choices[0].text == plain(t).choices[0].text
    assert masked > 0
    stats = server.wait_idle()
    assert stats["failed"] == 0 and stats["free_blocks"] == stats["pool_blocks"]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_a_constrained_request_draws_in_the_graph_as_the_host_would(server, client, name):
    schema = SCHEMAS[name]

    def ask(temperature, **extra):
        before = server.wait_idle()
        got = client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=200, temperature=temperature, seed=11,
            response_format=schema_format(schema), **extra)
        after = server.wait_idle()
        steps = {k: after[k] - before[k] for k in ("host_steps", "masked_steps")}
        return got, steps

    for temperature in (0.0, 1.0):
        graph, steps = ask(temperature)
        text = graph.choices[0].message.content
        jsonschema.validate(json.loads(text), schema)
        # the first token comes from the prefill's logits; every other one from a masked
        # decode step that reads back the token ids alone
        assert steps == {"host_steps": 0,
                         "masked_steps": graph.usage.completion_tokens - 1}, steps
        host, steps = ask(temperature, logprobs=True)
        assert steps["host_steps"] == host.usage.completion_tokens - 1 > 0
        assert steps["masked_steps"] == 0
        assert host.choices[0].message.content == text


def test_mask_words_in_the_slot_allow_what_the_host_mask_allows(tmp_path):
    import numpy as np
    from poot.models.sample_graph import mask_words
    from poot.models.tokenizer import Tokenizer
    from poot.serve import grammar

    tok = Tokenizer.from_gguf(str(tiny_llama(tmp_path, 64)))
    n = tok.vocab_size
    assert n % 32, "the byte vocabulary's last word is partly past it"
    made = grammar.checked(grammar.json_schema_grammar(SCHEMAS["numbers"]), tok)
    for width in (n, n + 40, n - 40):      # the model's logits: as many ids, more, fewer
        c = grammar.Constraint(made, tok)
        for ch in '{"ratio":0.5':
            words = np.zeros(mask_words(width), np.uint32)
            c.write_mask(words)
            z = np.zeros(width, np.float32)
            c.mask(z)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:width]
            np.testing.assert_array_equal(bits == 1, np.isfinite(z))
            assert not bits[n:].any() and 0 < bits.sum() < min(n, width)
            c.accept(tok.encode_text(ch)[0])


@pytest.mark.parametrize("fmt", [
    schema_format({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
    schema_format({"type": "string", "pattern": "("}),
    {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
    {"type": "regex", "regex": "(unclosed"},
    {"type": "grammar", "grammar": "start: nothing_defined"},
    {"type": "xml"},
    {"type": "json_object", "schema": {}},
])
def test_a_schema_llguidance_cannot_use_is_a_400(client, fmt):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                       response_format=fmt)
    body = err.value.body
    assert body["type"] == "invalid_request_error" and body["message"]
    assert body["param"].startswith("response_format")
