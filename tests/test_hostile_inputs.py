"""Hostile inputs get typed errors that name the file and the key, quickly, allocating little.

One test per class of hostile input (issue 21), each with a small crafted file built from the
tiny Llama of tests/fuzz/seeds.py. tests/fuzz/ mutates the same seeds at random.
"""
from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402
from poot.errors import CheckpointError, ConfigError, ParseError, PootError  # noqa: E402
from seeds import ARRAY, F32, I32, STRING, U32, U64, set_kv  # noqa: E402


def open_gguf_model(path):
    """What `poot run` does with a GGUF before the first step: config, tokenizer, trace."""
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(path), max_seq=16)
    Tokenizer.from_gguf_metadata(ckpt.metadata, str(path))
    build_decoder(config, CheckpointWeights(ckpt), tokens=1)
    return config


def open_hf_model(folder):
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(folder), max_seq=16)
    Tokenizer.from_hf_folder(folder)
    build_decoder(config, CheckpointWeights(ckpt), tokens=1)
    return config


def refused(fn, path, *names, error=CheckpointError, seconds=5.0):
    """fn(path) raises `error` naming each of `names`, within `seconds`."""
    t0 = time.perf_counter()
    with pytest.raises(error) as exc:
        fn(path)
    took = time.perf_counter() - t0
    text = str(exc.value)
    assert "\n" not in text, text
    for name in names:
        assert str(name) in text, text
    assert took < seconds, f"{took:.1f} s: {text}"
    return text


def test_the_seeds_load(tmp_path):
    assert open_gguf_model(seeds.tiny_llama_gguf(tmp_path / "ok.gguf")).layers == seeds.LAYERS
    assert open_hf_model(seeds.tiny_hf_folder(tmp_path / "hf")).dim == seeds.DIM


# -- recursion -------------------------------------------------------------------------------
def nested_array(depth: int) -> bytes:
    """An ARRAY value's bytes: arrays of one array, `depth` deep, around one int32."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQi", I32, 1, 7)


@pytest.mark.parametrize("depth", [9, 300, 3000])
def test_gguf_arrays_of_arrays_are_depth_limited(tmp_path, depth):
    from poot.models.gguf_meta import read_gguf_metadata

    path = seeds.tiny_llama_gguf(tmp_path / "deep.gguf", set_kv(
        seeds.llama_kvs(), "x.deep", ARRAY, nested_array(depth)))
    refused(open_gguf_model, path, path, "x.deep", "deeper than 8")
    refused(read_gguf_metadata, path, path, "x.deep", "deeper than 8")


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json",
                                  "generation_config.json", "model.safetensors.index.json",
                                  "tokenizer.json"])
@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_json_side_files_are_refused(tmp_path, name, depth):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    text = json.loads((folder / name).read_text())
    text = json.dumps({**text, "deep": 0}).replace("0}", deep_json(depth) + "}")
    (folder / name).write_text(text)
    refused(open_hf_model, folder, name, "nested deeper than 64", error=ConfigError)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_json_in_a_safetensors_header_is_refused(tmp_path, depth):
    folder = seeds.tiny_hf_folder(tmp_path / "hf", shards=1)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = {"deep": "X"}
    text = json.dumps(header).replace('"X"', deep_json(depth)).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    refused(open_hf_model, folder, file, "nested deeper than 64")


def nested_regions(depth: int) -> str:
    """A graph whose Fused eqn's region holds a Fused eqn ... `depth` regions deep."""
    opening = ["region(", "%0: f32[4] = param", ") {", "%1: f32[4] = Fused{eqns=1} %0"]
    lines = ["g(", "%0: f32[4] = const 'x'", ") {", "%1: f32[4] = Fused{eqns=1} %0"]
    lines += opening * (depth - 1) + opening[:3] + ["%1: f32[4] = Exp %0"]
    lines += ["} -> result %1"] * (depth + 1)
    return "\n".join(lines)


def test_ir_regions_nested_deep_are_refused():
    from poot.ir.parse import parse

    assert len(parse(nested_regions(3)).eqns()) == 1
    for depth in (40, 1000, 20_000):
        refused(parse, nested_regions(depth), "nested deeper than 32", error=ParseError)


# -- values without type or range checks -----------------------------------------------------
BAD_VALUES = [(U32, 0, "outside [1,"), (F32, 2.0, "is a float, not an integer"),
              (F32, float("inf"), "is a float, not an integer"),
              (ARRAY, (U32, [2, 2]), "is a list, not an integer"),
              (STRING, "2", "is a string, not an integer"), (U64, 1 << 63, "outside [1,")]


@pytest.mark.parametrize("vtype, value, message", BAD_VALUES)
@pytest.mark.parametrize("key", ["attention.head_count", "embedding_length", "block_count",
                                 "attention.head_count_kv", "feed_forward_length",
                                 "context_length"])
def test_gguf_metadata_values_are_checked(tmp_path, key, vtype, value, message):
    path = seeds.tiny_llama_gguf(tmp_path / "bad.gguf",
                                 set_kv(seeds.llama_kvs(), f"llama.{key}", vtype, value))
    refused(open_gguf_model, path, path, f"llama.{key}", message, error=ConfigError)


@pytest.mark.parametrize("key, vtype, value, message", [
    ("llama.rope.freq_base", F32, float("inf"), "is not finite"),
    ("llama.rope.freq_base", F32, -1.0, "is not positive"),
    ("llama.attention.layer_norm_rms_epsilon", F32, float("nan"), "is not finite"),
    ("llama.rope.freq_base", STRING, "big", "is a string, not a number"),
    ("tokenizer.ggml.bos_token_id", U32, 10**6, "outside [0, 262]"),
    ("tokenizer.ggml.eos_token_id", ARRAY, (U32, [2]), "is a list, not an integer"),
    ("tokenizer.ggml.add_bos_token", STRING, "yes", "not true/false"),
    ("tokenizer.ggml.tokens", ARRAY, (I32, [1, 2, 3]), "tokenizer.ggml.tokens[0] = 1 is an int"),
    ("tokenizer.ggml.tokens", STRING, "abc", "is a string, not a list"),
    ("tokenizer.ggml.merges", ARRAY, (U32, [7]), "tokenizer.ggml.merges[0] = 7 is an int"),
    ("tokenizer.ggml.merges", ARRAY, (STRING, ["nospace"]), "not two tokens"),
    ("tokenizer.ggml.token_type", ARRAY, (I32, [1] * 262 + [99]), "token_type[262] = 99"),
    ("tokenizer.ggml.token_type", ARRAY, (I32, [1, 1]), "but 2 token types"),
    ("tokenizer.chat_template", ARRAY, (STRING, ["{{ x }}"]), "is a list, not a string"),
    ("general.architecture", U32, 5, "is an int, not a string"),
])
def test_gguf_tokenizer_and_float_values_are_checked(tmp_path, key, vtype, value, message):
    path = seeds.tiny_llama_gguf(tmp_path / "bad.gguf", set_kv(seeds.llama_kvs(), key, vtype,
                                                               value))
    refused(open_gguf_model, path, path, message, error=CheckpointError)


def test_sentencepiece_scores_are_checked():
    from poot.models.tokenizer import Tokenizer

    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", "ab"],
            "tokenizer.ggml.token_type": [2, 1, 1, 1]}
    for scores, message in [([0.0, 1.0, float("inf"), 2.0], "scores[2] = inf"),
                            ([0.0, 1.0], "4 tokens but 2 scores"),
                            ([0.0, "x", 1.0, 2.0], "scores[1] = 'x'")]:
        with pytest.raises(CheckpointError, match=message.replace("[", r"\[")):
            Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.scores": scores}, "m.gguf")


@pytest.mark.parametrize("key, value, message", [
    ("num_attention_heads", 0, "outside [1,"), ("num_attention_heads", 2.5, "a float"),
    ("hidden_size", [16], "is a list"), ("num_hidden_layers", "2", "is a string"),
    ("num_hidden_layers", 10**6, "outside [1, 1024]"), ("rms_norm_eps", 1e999, "not finite"),
    ("rope_theta", None, None), ("rope_theta", {"a": 1}, "is an object, not a number"),
    ("rope_scaling", [1], "is a list, not an object"),
    ("tie_word_embeddings", "no", "not true/false"), ("vocab_size", -5, "outside [1,"),
])
def test_config_json_values_are_checked(tmp_path, key, value, message):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
    if message is None:  # null means absent: the default applies
        open_hf_model(folder)
        return
    refused(open_hf_model, folder, folder / "config.json", key, message, error=ConfigError)


@pytest.mark.parametrize("name, content, message", [
    ("tokenizer_config.json", [1, 2], "expected a JSON object, found a list"),
    ("tokenizer_config.json", {"chat_template": [1, 2]}, "chat_template[0]"),
    ("tokenizer_config.json", {"chat_template": [{"name": 3}]}, "name = 3 is an int"),
    ("tokenizer_config.json", {"chat_template": 7}, "chat_template = 7 is an int"),
    ("tokenizer_config.json", {"add_bos_token": "yes"}, "add_bos_token = 'yes'"),
    ("generation_config.json", {"eos_token_id": "2"}, "eos_token_id = '2' is a string"),
    ("generation_config.json", {"eos_token_id": [2, None]}, "eos_token_id[1] = None"),
    ("generation_config.json", {"eos_token_id": 10**9}, "outside [0,"),
    ("generation_config.json", "text", "expected a JSON object, found a string"),
    ("model.safetensors.index.json", {"weight_map": [1]}, "weight_map = [1] is a list"),
    ("model.safetensors.index.json", {"weight_map": {"a": None}}, "is not a file name"),
    ("model.safetensors.index.json", {"weight_map": "x"}, "weight_map = 'x' is a string"),
    ("model.safetensors.index.json", {}, "lacks 'weight_map'"),
])
def test_side_files_that_are_not_what_they_claim(tmp_path, name, content, message):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    (folder / name).write_text(json.dumps(content))
    refused(open_hf_model, folder, name, message, error=ConfigError)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json",
                                  "generation_config.json", "model.safetensors.index.json",
                                  "chat_template.jinja"])
def test_side_files_that_are_not_utf8(tmp_path, name):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    if name == "chat_template.jinja":  # read only where tokenizer_config.json has none
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        del cfg["chat_template"]
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / name).write_bytes(b'{"a": "\xff\xfe latin-1 \xe9"}')
    refused(open_hf_model, folder, name, "not UTF-8", error=ConfigError)


# -- metadata that contradicts the tensors ---------------------------------------------------
@pytest.mark.parametrize("key, value, tensor", [
    ("embedding_length", 24, "token_embd.weight"),
    ("attention.head_count", 4, "attn_k.weight"),
    ("attention.key_length", 4, "attn_q.weight"),
    ("attention.head_count_kv", 2, "attn_k.weight"),
    ("feed_forward_length", 64, "ffn_gate.weight"),
    ("vocab_size", 300, "token_embd.weight"),
])
def test_gguf_metadata_that_contradicts_the_tensors(tmp_path, key, value, tensor):
    path = seeds.tiny_llama_gguf(tmp_path / "bad.gguf",
                                 set_kv(seeds.llama_kvs(), f"llama.{key}", U32, value))
    refused(open_gguf_model, path, path, tensor, "implies", error=ConfigError)


@pytest.mark.parametrize("layers, message", [(3, "blocks 0..1"), (1, "blocks 0..1")])
def test_layer_count_that_contradicts_the_blocks(tmp_path, layers, message):
    path = seeds.tiny_llama_gguf(tmp_path / "bad.gguf",
                                 set_kv(seeds.llama_kvs(), "llama.block_count", U32, layers))
    refused(open_gguf_model, path, path, f"llama.block_count = {layers}", message,
            error=ConfigError)


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", 24, "model.embed_tokens.weight"),
    ("num_attention_heads", 4, "self_attn.q_proj.weight"),
    ("head_dim", 16, "self_attn.q_proj.weight"),
    ("intermediate_size", 8, "mlp.gate_proj.weight"),
    ("vocab_size", 100, "model.embed_tokens.weight"),
    ("num_key_value_heads", 2, "self_attn.k_proj.weight"),
])
def test_config_json_that_contradicts_the_tensors(tmp_path, key, value, message):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
    refused(open_hf_model, folder, folder / "config.json", "implies", error=ConfigError)


def test_tokenizer_larger_than_the_embedding(tmp_path):
    import poot

    kvs = set_kv(seeds.llama_kvs(), "llama.vocab_size", U32, 200)
    vocab = len(seeds.byte_vocab()[0])
    tensors = seeds.llama_tensors(vocab)
    tensors["token_embd.weight"] = tensors["token_embd.weight"][:200]
    path = seeds.tiny_llama_gguf(tmp_path / "t.gguf", kvs, tensors)
    refused(lambda p: poot.load(str(p), "reference", max_seq=16), path, path,
            f"tokenizer has {vocab} tokens", error=ConfigError)


# -- sizes with no bound ---------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [
    ("rope.dimension_count", 1 << 40), ("attention.key_length", 10**9),
    ("block_count", 10**6), ("block_count", (1 << 63) + 5), ("context_length", 1 << 60),
    ("embedding_length", 1 << 40), ("rope.dimension_count", 7),
])
def test_sizes_from_a_file_are_bounded_before_allocation(tmp_path, key, value):
    path = seeds.tiny_llama_gguf(tmp_path / "big.gguf",
                                 set_kv(seeds.llama_kvs(), f"llama.{key}", U64, value))
    refused(open_gguf_model, path, path, f"llama.{key}", error=ConfigError, seconds=3.0)


def test_kv_capacity_beyond_the_machine_is_refused(tmp_path):
    import dataclasses

    from poot.errors import CapacityError
    from poot.models.shapes import check_memory, machine_memory

    config = open_gguf_model(seeds.tiny_llama_gguf(tmp_path / "ok.gguf"))
    big = dataclasses.replace(config, max_seq=1 << 24, layers=1024, kv_heads=64)
    assert 2 * 1024 * 64 * 8 * (1 << 24) * 4 > machine_memory()
    with pytest.raises(CapacityError, match="smaller max_seq"):
        check_memory(big)


def test_ir_value_ids_are_bounded():
    from poot.ir.parse import parse

    text = seeds.ir_texts()[0]
    last = [ln for ln in text.splitlines() if ln.strip().startswith("%")][-1].strip()
    vid = last.split(":")[0]
    t0 = time.perf_counter()
    with pytest.raises(ParseError, match="above the bound"):
        parse(text.replace(vid + ":", "%1000000000:").replace(vid + ";", "%1000000000;")
              .replace(f"result {vid}", "result %1000000000"))
    assert time.perf_counter() - t0 < 2


# -- paths -----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["/etc/passwd", "../outside.safetensors",
                                    "sub/../../outside.safetensors", "link.safetensors"])
def test_shard_index_cannot_leave_the_folder(tmp_path, target):
    folder = seeds.tiny_hf_folder(tmp_path / "hf")
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((folder / "model-00001-of-00002.safetensors").read_bytes())
    (folder / "link.safetensors").symlink_to(outside)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = target
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(open_hf_model, folder, "model.safetensors.index.json", "outside the model folder",
            error=ConfigError)


# -- the slow path ---------------------------------------------------------------------------
def test_string_redeclared_as_array_is_quick(tmp_path):
    """A 384-byte file whose string value is re-typed as an array: read or refused in
    milliseconds, whatever element type and count the bytes then claim."""
    from poot.models.gguf_meta import read_gguf_metadata

    kvs = [("general.architecture", STRING, "llama"), ("general.name", STRING, "x" * 200),
           ("general.tags", ARRAY, (STRING, ["a", "b"]))]
    data = bytearray(seeds.gguf_bytes(kvs, {"w": np.zeros(8, np.float32)}))
    at = data.index(b"general.name") + len("general.name")
    for etype in range(13):
        for count in (0, 1, 2, 1 << 20, 1 << 62):
            bad = bytearray(data)
            bad[at:at + 4] = struct.pack("<I", ARRAY)
            bad[at + 4:at + 16] = struct.pack("<IQ", etype, count)
            path = tmp_path / "slow.gguf"
            path.write_bytes(bytes(bad[:384]))
            t0 = time.perf_counter()
            try:
                read_gguf_metadata(path)
            except PootError:
                pass
            assert time.perf_counter() - t0 < 0.5
