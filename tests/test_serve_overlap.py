"""The scheduler's overlapped greedy steps (Engine(overlap=True), the default): each step is
launched before the last one's tokens are streamed, its input tokens fed on the device. On
the real SmolLM2 (in process): answers, finish reasons and token counts equal those of an
engine that waits for every step, a sequence ending at a stop string mid-batch drops the
step launched after its end (on the compiled cpu backend: the scheduling is the same on
every backend), and the pool is whole again afterwards, after a cancellation too (on the
reference backend, whose slow steps leave the test time to cancel mid-answer)."""
from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "One, two, three,", "def fibonacci(n):",
           "The quick brown fox"]
LENGTHS = [4, 7, 9, 6]


def load_smollm2(path, backend: str):
    from poot.models.runner import load

    return load(str(path), backend, kv="paged", max_seq=64, prefill_tokens=16)


@pytest.fixture(scope="module")
def cpu_model(smollm2_gguf):
    return load_smollm2(smollm2_gguf, "cpu")


@pytest.fixture(scope="module")
def model(smollm2_gguf):
    return load_smollm2(smollm2_gguf, "reference")


def engine(model, overlap: bool):
    from poot.serve.engine import Engine

    e = Engine(model, name="m", max_batch=4, max_queue=8, prefill_batch=4, overlap=overlap)
    # the engines of a test share the model's session: every plan is made before either
    # loop runs, so that one engine's idle planning never runs beside the other's steps
    e.warm(wait=True)
    e.start()
    return e


class Answer:
    def __init__(self):
        self.text, self.end, self.done = "", None, threading.Event()
        self.pieces = 0

    def __call__(self, event):
        if event.kind == "text":
            self.text += event.text
            self.pieces += 1
        else:
            self.end = (event.kind, event.finish_reason, event.completion_tokens)
            self.done.set()


def ask_all(e, model, stops) -> list[tuple]:
    from poot.serve.protocol import Generation

    answers = [Answer() for _ in PROMPTS]
    for p, n, stop, a in zip(PROMPTS, LENGTHS, stops, answers):
        e.submit(Generation("completion", "m", model.tokenizer.encode(p), n, temperature=0.0,
                            stop=stop), a)
    for a in answers:
        assert a.done.wait(300)
    return [(a.text, *a.end) for a in answers]


def idle(e) -> dict:
    for _ in range(600):
        s = e.stats()
        if s["active"] == 0 and s["queued"] == 0:
            return s
        time.sleep(0.05)
    raise AssertionError(f"the engine did not go idle: {e.stats()}")


def test_overlapped_steps_answer_as_waited_ones_and_free_the_pool(cpu_model):
    model = cpu_model
    waited, overlapped = engine(model, False), engine(model, True)
    try:
        plain = ask_all(waited, model, [()] * len(PROMPTS))
        # a stop string inside the longest answer: that sequence ends while the others run
        text = plain[2][0]
        stop = text[len(text) // 2:][:3]
        stops = [(), (), (stop,), ()]
        want = ask_all(waited, model, stops)
        assert want[2][2] == "stop" and want[2][3] < LENGTHS[2]
        start = overlapped.stats()
        got = ask_all(overlapped, model, stops)
        assert got == want
        s = idle(overlapped)
        assert s["overlapped_steps"] > start["overlapped_steps"]
        assert s["free_blocks"] == s["pool_blocks"]
        assert waited.stats()["overlapped_steps"] == 0
    finally:
        waited.close()
        overlapped.close()


def test_a_cancelled_overlapped_sequence_frees_its_blocks(model):
    from poot.serve.protocol import Generation

    e = engine(model, True)
    try:
        a, b = Answer(), Answer()
        long = e.submit(Generation("completion", "m", model.tokenizer.encode(PROMPTS[0]), 40,
                                   temperature=0.0, ignore_eos=True), a)
        e.submit(Generation("completion", "m", model.tokenizer.encode(PROMPTS[1]), 12,
                            temperature=0.0, ignore_eos=True), b)
        for _ in range(6000):
            if a.pieces >= 4:
                break
            time.sleep(0.01)
        e.cancel(long)
        assert b.done.wait(300) and b.end[2] == 12
        s = idle(e)
        assert s["cancelled"] == 1 and not a.done.is_set()
        assert s["free_blocks"] == s["pool_blocks"]
        assert s["overlapped_steps"] > 0
    finally:
        e.close()
