"""The extra plans (the host-logits and masked decode plans only some requests need) are
made by the idle loop after the plans `ready` waits for, without any request asking for
them; a constrained request arriving before they exist is answered as it is once they do,
and no plan is made twice. The scheduler in process, on the cpu backend, the fuzzer's tiny
Llama."""
from __future__ import annotations

import json
import threading
import time

import jsonschema
import pytest
from serve_process import tiny_llama


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                 "maximum": 999},
                                           "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("tiny"), 128))


class Started:
    """An engine as `poot serve` starts one (warm, then serve), with what it planned: the
    plan keys in order, the progress lines, and the extra plans made when it became ready."""

    def __init__(self, checkpoint: str):
        from poot.models.runner import load
        from poot.serve.engine import Engine

        model = load(checkpoint, "cpu", kv="paged", max_seq=128, prefill_tokens=16)
        self.engine = e = Engine(model, name="m", max_batch=2, max_queue=4, prefill_batch=1)
        self.keys: list[tuple] = []
        self.lines: list[str] = []
        self.extra_at_ready = None
        before = e.session.planned

        def planned(key, seconds):
            self.keys.append(key)
            if before is not None:
                before(key, seconds)
        e.session.planned = planned
        e.warm(self.progress)
        e.start()

    def progress(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith("ready:"):
            self.extra_at_ready = self.engine.stats()["extra_plans"]

    def all_extra_made(self, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while (made := self.engine.stats()["extra_plans"]) != \
                {"host": [1, 2], "masked": [1, 2]} and time.monotonic() < deadline:
            time.sleep(0.05)
        return made


def ask(engine, max_tokens: int = 48) -> list[tuple[str, object]]:
    """Two constrained requests at once, one greedy and one seeded: each one's text and
    end."""
    from poot.serve import grammar
    from poot.serve.protocol import Generation

    tok = engine.tokenizer
    made = grammar.checked(grammar.json_schema_grammar(SCHEMA), tok)
    answers = []
    for sampling in (dict(temperature=0.0), dict(temperature=1.0, seed=11)):
        text, end, done = [], [], threading.Event()

        def emit(event, text=text, end=end, done=done):
            if event.kind == "text":
                text.append(event.text)
            else:
                end.append(event)
                done.set()
        engine.submit(Generation("completion", "m", tok.encode_text("data:"), max_tokens,
                                 grammar=made, **sampling), emit)
        answers.append((text, end, done))
    out = []
    for text, end, done in answers:
        assert done.wait(120)
        out.append(("".join(text), end[0]))
    return out


@pytest.fixture(scope="module")
def idle(checkpoint):
    """An engine that no request reaches until every extra plan is made."""
    started = Started(checkpoint)
    yield started
    started.engine.close()


def test_extra_plans_are_made_after_ready_without_a_request(idle):
    e = idle.engine
    made = idle.all_extra_made()
    assert made == {"host": [1, 2], "masked": [1, 2]}
    s = e.stats()
    assert s["ready"] and s["steps"] == 0 and s["masked_steps"] == 0
    # readiness came first: its plans, not the extra ones (those followed it)
    assert idle.extra_at_ready is not None and idle.extra_at_ready != made
    ready_at = next(i for i, line in enumerate(idle.lines) if line.startswith("ready:"))
    after = idle.lines[ready_at:]
    assert any("(masked)" in line for line in after)
    assert any("(host logits)" in line for line in after)
    assert s["plans_made"] == 2 * len(s["decode_batches"]) + len(s["prefill_batches"])
    assert len(idle.keys) == len(set(idle.keys)) == s["plans_made"] + 4
    assert {(1, 1), (1, 2), (1, 1, "masked"), (1, 2, "masked")} <= set(idle.keys)


def test_a_constrained_request_before_the_extra_plans_is_answered_alike(checkpoint, idle):
    early = Started(checkpoint)
    try:
        answers = ask(early.engine)    # at once: the masked plans are not made yet
        assert early.extra_at_ready is None or early.extra_at_ready["masked"] == []
        for text, end in answers:
            assert end.kind == "done" and end.finish_reason == "stop"
            jsonschema.validate(json.loads(text), SCHEMA)
        assert early.engine.stats()["masked_steps"] > 0
        assert early.all_extra_made() == {"host": [1, 2], "masked": [1, 2]}
        assert len(early.keys) == len(set(early.keys))      # none made twice
    finally:
        early.engine.close()
    idle.all_extra_made()
    assert ask(idle.engine) == answers       # the same answers once every plan exists


def test_progress_counts_the_ready_and_the_extra_plans_apart(idle):
    """Each line counts down its own kind to 0: the plans `ready` waits for, then the
    extra ones (the startup line's `plans_waiting` and `extra_plans_waiting`)."""
    idle.all_extra_made()
    ready = [int(line.split("; ")[-1].split()[0]) for line in idle.lines
             if line.endswith("plans to go before ready")]
    extra = [int(line.split("; ")[-1].split()[0]) for line in idle.lines
             if line.endswith("extra plans to go")]
    s = idle.engine.stats()
    assert ready == list(range(s["plans_made"] - 1, -1, -1))
    assert extra == [3, 2, 1, 0] and s["extra_plans_waiting"] == 0


def test_a_plain_request_is_answered_while_the_extra_plans_are_held(checkpoint):
    """The helper's preparation of the extra plans is held inside the first one (its
    `prepare` hook blocks): a plain request is answered meanwhile, none of them made, and
    they follow once the helper goes on."""
    from poot.models.runner import load
    from poot.serve.engine import Engine
    from poot.serve.protocol import Generation

    model = load(checkpoint, "cpu", kv="paged", max_seq=128, prefill_tokens=16)
    e = Engine(model, name="m", max_batch=2, max_queue=4, prefill_batch=1)
    inside, go = threading.Event(), threading.Event()
    prepare = e.extras.prepare

    def held(*key):
        inside.set()
        assert go.wait(120)
        return prepare(*key)
    e.extras.prepare = held
    e.warm(wait=True)
    e.start()
    try:
        assert inside.wait(60)
        assert e.stats()["extra_plans_waiting"] == 4
        text, end, done = [], [], threading.Event()

        def emit(event):
            (text if event.kind == "text" else end).append(event)
            if event.kind != "text":
                done.set()
        e.submit(Generation("completion", "m", e.tokenizer.encode_text("Hello"), 6), emit)
        assert done.wait(60)
        assert end[0].kind == "done" and end[0].completion_tokens == 6
        s = e.stats()
        assert s["extra_plans"] == {"host": [], "masked": []}
        assert s["extra_plans_waiting"] == 4
    finally:
        go.set()
    deadline = time.monotonic() + 60
    while e.stats()["extra_plans_waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert e.stats()["extra_plans"] == {"host": [1, 2], "masked": [1, 2]}
    finally:
        e.close()
