"""The Python API: `poot.load` with a real signature; `Model.generate` returning text (an
iterator of pieces with stream=True) for a string, token ids or chat messages with a system
prompt, checking its arguments before it runs and saying why it stopped. On the fuzzer's
tiny Llama (reference backend); docs/python.md's examples run in test_python_docs.py."""
from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import poot

    path = seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return poot.load(path, "reference", max_seq=seeds.CTX)


def test_load_has_a_real_signature_and_names_the_default_backend():
    import poot
    import poot.models

    sig = inspect.signature(poot.load)
    assert list(sig.parameters)[:2] == ["model", "backend"]
    assert sig.parameters["max_seq"].default == 1024
    assert {"kv", "prefill_tokens", "progress", "lora", "expert_pool", "precision",
            "kv_dtype"} <= set(sig.parameters)
    assert poot.load is poot.models.load
    doc = poot.load.__doc__
    assert "the compiled cpu backend" in doc and "reference backend where none" in doc
    with pytest.raises(TypeError):
        poot.load("smollm2", backend_name="cpu")


def test_dir_lists_the_lazy_entry_points():
    import subprocess

    # a fresh interpreter: in this one the lazy names may already be module globals
    r = subprocess.run([sys.executable, "-c", "import poot; print(sorted(dir(poot)))"],
                       capture_output=True, text=True, timeout=60)
    names = r.stdout
    for name in ("'load'", "'Model'", "'trace'", "'models'", "'errors'", "'__version__'"):
        assert name in names, names


def test_an_unknown_backend_is_refused_before_the_model_is_opened():
    import poot
    from poot.errors import PootError

    with pytest.raises(PootError, match="unknown backend 'nope'"):
        poot.load("/nonexistent/model.gguf", "nope")


def test_generate_returns_text_and_streams_the_same_text(model):
    text = model.generate("the in", max_tokens=5)
    assert isinstance(text, str)
    assert model.stats.generated_tokens <= 5
    assert model.stats.finish_reason in ("stop", "length")
    pieces = model.generate("the in", max_tokens=5, stream=True)
    assert isinstance(pieces, Iterator)
    assert "".join(pieces) == text
    ids = model.tokenize("the in")
    assert model.generate(ids, max_tokens=5) == text


def test_chat_messages_with_a_system_prompt_go_through_the_template(model):
    from poot.models.chat import render_chat_for

    msgs = [{"role": "user", "content": "the"}]
    got = model.generate(msgs, system="in", max_tokens=3)
    assert isinstance(got, str)
    want_ids = model.tokenize(render_chat_for(model.tokenizer, [
        {"role": "system", "content": "in"}, *msgs]), add_special=False)
    assert model.prompt_ids(msgs, system="in") == want_ids
    assert model.stats.prompt_tokens == len(want_ids)
    # a string with chat=True (or a system prompt) is one user message
    assert model.prompt_ids("the", chat=True) == model.prompt_ids(msgs)
    assert model.prompt_ids("the", system="in") == want_ids


def test_why_an_answer_ended_is_in_the_stats(model):
    # the tiny model's greedy answers run on: no end-of-sequence token within 64 positions
    model.generate("the in", max_tokens=200)
    s = model.stats
    assert s.finish_reason == "context"
    assert s.prompt_tokens + s.generated_tokens == seeds.CTX
    model.generate("the in", max_tokens=7)
    assert (model.stats.finish_reason, model.stats.generated_tokens) == ("length", 7)
    text = model.generate("he", max_tokens=20)
    assert text.startswith("cb8"), text          # the tiny model's greedy answer to "he"
    assert model.generate("he", max_tokens=20, stop="b8") == "c"
    assert model.stats.finish_reason == "stop"


@pytest.mark.parametrize("prompt, kwargs, message", [
    ("", {}, "the prompt is empty"),
    ([], {}, "must be a non-empty string, list of token ids or list of chat messages"),
    ([1, 10 ** 6], {}, "token ids must be whole numbers in"),
    ([1, True], {}, "token ids must be whole numbers in"),
    ([1, 2], {"system": "x"}, "a system prompt needs the chat template"),
    ("hi", {"chat": False, "system": "x"}, "a system prompt needs the chat template"),
    ([{"role": "user"}], {}, "needs a string 'content'"),
    ("hi", {"max_tokens": 0}, "max_tokens must be a whole number of at least 1"),
    ("hi", {"top_p": 2.0}, "top_p must lie in (0, 1]"),
    ("hi", {"stop": ["a", 5]}, "stop must be a non-empty string or a list of them"),
    ("hi", {"stop": [""]}, "stop must be a non-empty string or a list of them"),
])
def test_bad_arguments_are_refused_before_anything_runs(model, prompt, kwargs, message):
    from poot.errors import PootError

    with pytest.raises(PootError) as info:
        model.generate(prompt, stream=True, **kwargs)    # refused at the call, not later
    assert message in str(info.value)
