"""A streamed answer's text: cut before the first stop string, even one spanning tokens,
and never releasing a piece of a stop string before it is known not to be one."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from poot.models.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_gguf)


def pieces(tokenizer, text, stop):
    from poot.models.text_stream import TextStream

    stream = TextStream(tokenizer, stop)
    out = [stream.push(t) for t in tokenizer.encode(text, add_special=False)]
    return out + [stream.flush()], stream.stopped


def test_a_stop_string_spanning_tokens_ends_the_text_before_it(tokenizer):
    out, stopped = pieces(tokenizer, "Hello world. Bye now", ["d. B"])
    assert "".join(out) == "Hello worl" and stopped


def test_a_false_start_is_released_once_it_is_not_a_stop(tokenizer):
    out, stopped = pieces(tokenizer, "one, two; three", [", tw0"])
    assert "".join(out) == "one, two; three" and not stopped


def test_utf8_split_over_tokens_streams_whole_characters(tokenizer):
    out, _ = pieces(tokenizer, "naïve café ☕", [])
    assert "".join(out) == "naïve café ☕"
    assert "\ufffd" not in "".join(out)
