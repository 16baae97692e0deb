"""Fixtures shared by every package's tests (pytest loads this root conftest for all)."""
from __future__ import annotations

import pytest


def _real_model(name: str, variable: str):
    """Path of a known model's real file, or a skip that says how to get it."""
    from poot.models import hub

    path = {"smollm2": hub.smollm2_path, "gemma3-270m": hub.gemma3_path}[name]()
    if path is None:
        pytest.skip(f"{name} GGUF not found at {hub.cached_model_path(name)}: run "
                    f"`poot pull {name}` or set {variable}")
    return path


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct.Q4_1.gguf."""
    return _real_model("smollm2", "POOT_SMOLLM2_GGUF")


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Path of the real Gemma 3 270M GGUF (Q4_K_M)."""
    return _real_model("gemma3-270m", "POOT_GEMMA3_GGUF")


def _hf_byte_level(meta: dict):
    """The reference: HF `tokenizers` built from a GGUF "gpt2" vocabulary the way
    llama.cpp's pre-tokenizer rules say (what poot.models.bpe must compute)."""
    from poot.models.tokenizer import _LLAMA3_REGEX, _QWEN2_REGEX, CONTROL, USER_DEFINED
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    pre = meta["tokenizer.ggml.pre"]
    options = {"ignore_merges": True} if pre == "llama3" else {}
    hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, **options))
    words = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("llama3", "qwen2"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX if pre == "llama3" else _QWEN2_REGEX),
                                     behavior="isolated", invert=False)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre == "smollm":
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), words])
    else:
        hf.pre_tokenizer = words
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED])
    return hf


@pytest.fixture(scope="session")
def hf_byte_level():
    """hf_byte_level(meta): the HF `tokenizers` reference of a GGUF "gpt2" vocabulary."""
    return _hf_byte_level


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (scripts/test.sh: `-n N --dist loadfile`), files with
    whole-model (slow) tests come first: the controller hands out whole files in this order,
    so the last ones handed out are short and the workers finish together. The order within
    a file, and of the other files, is kept."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
