"""What a constrained or biased request reads back, counted at the session's steps (the
scheduler in process, on the cpu backend, the fuzzer's tiny Llama): without logprobs, its
decode steps run the masked sampling plan (logit bias and token mask in the graph) and
return token ids alone, so the only logits read back are the prefill's; with logprobs,
each decode step reads the logits back, and the answer is the same."""
from __future__ import annotations

import json
import threading

import jsonschema
import numpy as np
import pytest
from serve_process import tiny_llama


SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3}},
    "required": ["id", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from poot.models.runner import load
    from poot.serve.engine import Engine

    model = load(str(tiny_llama(tmp_path_factory.mktemp("tiny"), 128)), "cpu", kv="paged",
                 max_seq=128, prefill_tokens=16)
    e = Engine(model, name="m", max_batch=2, max_queue=4, prefill_batch=1)
    e.start()
    yield e
    e.close()


class Answer:
    def __init__(self):
        self.text, self.end, self.done = "", None, threading.Event()

    def __call__(self, event):
        if event.kind == "text":
            self.text += event.text
        else:
            self.end = event
            self.done.set()


def ask(engine, monkeypatch, schema=SCHEMA, max_tokens=60,
        **fields) -> tuple[Answer, list[tuple]]:
    """The answer and each step's (plan key, result dtype, result shape)."""
    from poot.serve import grammar
    from poot.serve.protocol import Generation

    s, tok = engine.session, engine.tokenizer
    steps: list[tuple] = []
    run = s._run

    def counted(ex, slots, row_seqs, real):
        out = run(ex, slots, row_seqs, real)
        if any(r is not None for r in row_seqs):     # not the idle loop's rehearsal of a plan
            key = next(k for k, v in s.executors.items() if v is ex)
            steps.append((key, out.result.dtype, out.result.shape))
        return out

    monkeypatch.setattr(s, "_run", counted)
    made = None if schema is None else \
        grammar.checked(grammar.json_schema_grammar(schema), tok)
    answer = Answer()
    engine.submit(Generation("completion", "m", tok.encode_text("data:"), max_tokens, seed=3,
                             grammar=made, **fields), answer)
    assert answer.done.wait(120)
    monkeypatch.undo()
    return answer, steps


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_constrained_request_reads_back_only_token_ids_after_its_prompt(
        engine, monkeypatch, temperature):
    graph, steps = ask(engine, monkeypatch, temperature=temperature)
    assert graph.end.kind == "done" and graph.end.finish_reason == "stop"
    jsonschema.validate(json.loads(graph.text), SCHEMA)
    _decode_steps_read_ids_alone(graph, steps)

    host, steps = ask(engine, monkeypatch, temperature=temperature, logprobs=0)
    decode = [st for st in steps if st[0][0] == 1]
    assert len(decode) == host.end.completion_tokens - 1
    assert all(len(key) == 2 and dtype == np.float32 for key, dtype, _ in decode), decode
    assert host.text == graph.text


def _decode_steps_read_ids_alone(answer, steps) -> None:
    decode = [st for st in steps if st[0][0] == 1]
    assert len(decode) == answer.end.completion_tokens - 1 > 0
    assert all(key[2] == "masked" and dtype == np.int32 and shape == (key[1],)
               for key, dtype, shape in decode), decode
    logits = [st for st in steps if st[1] != np.int32]
    assert logits and all(key[0] > 1 for key, _, _ in logits)     # the prefill's alone


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("schema", [None, SCHEMA], ids=["bias", "bias+schema"])
def test_a_biased_request_reads_back_only_token_ids_after_its_prompt(
        engine, monkeypatch, temperature, schema):
    tok = engine.tokenizer
    # digits and "y" pushed up, "x" down: the bias moves the answer, within the schema too
    bias = {i: 6.0 for i in tok.encode_text("7y9")} | {tok.encode_text("x")[0]: -100.0}
    plain, _ = ask(engine, monkeypatch, schema, 60, temperature=temperature)
    graph, steps = ask(engine, monkeypatch, schema, 60, temperature=temperature,
                       logit_bias=bias)
    assert graph.end.kind == "done"
    _decode_steps_read_ids_alone(graph, steps)
    assert graph.text != plain.text and "x" not in graph.text
    if schema is not None:
        assert graph.end.finish_reason == "stop"
        jsonschema.validate(json.loads(graph.text), schema)

    host, steps = ask(engine, monkeypatch, schema, 60, temperature=temperature,
                      logit_bias=bias, logprobs=0)
    decode = [st for st in steps if st[0][0] == 1]
    assert decode and all(len(key) == 2 and dtype == np.float32 for key, dtype, _ in decode)
    assert host.text == graph.text
