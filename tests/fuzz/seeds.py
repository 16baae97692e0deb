"""Small, valid inputs for the hostile-input tests and the fuzzer to start from.

- `write_gguf`: a GGUF file from raw (key, type, value) triples and F32 tensors. Written here
  rather than with gguf.GGUFWriter because tests and mutations need what that writer refuses:
  arrays of arrays, a value stored under the wrong type, a count that lies.
- `tiny_llama_gguf` / `tiny_hf_folder`: a 2-layer Llama (dim 16, 2 heads, 1 KV head, head dim
  8, ffn 32) with a byte-level BPE vocabulary, as a GGUF file and as an HF folder (two shards
  and their index, config.json, tokenizer.json, tokenizer_config.json, generation_config.json).
- `ir_texts`: printed graphs (the spec's decode attention layer, before and after compile).
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# GGUF value type ids (the GGUF specification)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
         BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

DIM, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, CTX = 16, 2, 1, 8, 32, 2, 64


def encode_value(vtype: int, value) -> bytes:
    """The bytes of one GGUF value; an ARRAY value is (element type, [elements]) or the
    array's raw bytes."""
    if vtype == ARRAY and isinstance(value, bytes):
        return value
    if vtype == STRING:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        return struct.pack("<Q", len(raw)) + raw
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(
            encode_value(etype, item) for item in items)
    return struct.pack(_PACK[vtype], value)


def gguf_bytes(kvs: list[tuple[str, int, object]], tensors: dict[str, np.ndarray],
               alignment: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        head += encode_value(STRING, key) + struct.pack("<I", vtype) + encode_value(vtype, value)
    offset, infos, blobs = 0, b"", []
    for name, array in tensors.items():
        a = np.ascontiguousarray(array, np.float32)
        dims = list(reversed(a.shape))  # GGUF lists the contiguous dimension first
        infos += encode_value(STRING, name) + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", 0, offset)
        blob = a.tobytes()
        blob += b"\0" * (-len(blob) % alignment)
        blobs.append(blob)
        offset += len(blob)
    out = head + infos
    out += b"\0" * (-len(out) % alignment)
    return out + b"".join(blobs)


def write_gguf(path: Path, kvs, tensors) -> Path:
    Path(path).write_bytes(gguf_bytes(kvs, tensors))
    return Path(path)


# -- the tiny Llama --------------------------------------------------------------------------
def byte_vocab() -> tuple[list[str], list[int], list[str]]:
    """tokens, token types and merges of a small byte-level BPE vocabulary."""
    from poot.models.tokenizer import gpt2_unicode_to_byte

    letters = list(gpt2_unicode_to_byte())
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *letters, "Ġt", "he", "Ġthe", "in"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, types, merges


def llama_tensors(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF-named F32 tensors of the tiny Llama (numpy [rows, cols] order)."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {"token_embd.weight": w(vocab, DIM), "output_norm.weight": np.ones(DIM, np.float32)}
    for i in range(LAYERS):
        out.update({
            f"blk.{i}.attn_norm.weight": np.ones(DIM, np.float32),
            f"blk.{i}.ffn_norm.weight": np.ones(DIM, np.float32),
            f"blk.{i}.attn_q.weight": w(HEADS * HEAD_DIM, DIM),
            f"blk.{i}.attn_k.weight": w(KV_HEADS * HEAD_DIM, DIM),
            f"blk.{i}.attn_v.weight": w(KV_HEADS * HEAD_DIM, DIM),
            f"blk.{i}.attn_output.weight": w(DIM, HEADS * HEAD_DIM),
            f"blk.{i}.ffn_gate.weight": w(FFN, DIM), f"blk.{i}.ffn_up.weight": w(FFN, DIM),
            f"blk.{i}.ffn_down.weight": w(DIM, FFN),
        })
    return out


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def llama_kvs() -> list[tuple[str, int, object]]:
    tokens, types, merges = byte_vocab()
    a = "llama"
    return [
        ("general.architecture", STRING, a), ("general.name", STRING, "tiny"),
        (f"{a}.context_length", U32, CTX), (f"{a}.embedding_length", U32, DIM),
        (f"{a}.block_count", U32, LAYERS), (f"{a}.feed_forward_length", U32, FFN),
        (f"{a}.attention.head_count", U32, HEADS), (f"{a}.attention.head_count_kv", U32, KV_HEADS),
        (f"{a}.attention.layer_norm_rms_epsilon", F32, 1e-5),
        (f"{a}.rope.freq_base", F32, 10000.0), (f"{a}.rope.dimension_count", U32, HEAD_DIM),
        ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "smollm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        ("tokenizer.chat_template", STRING, CHAT_TEMPLATE),
    ]


def tiny_llama_gguf(path: Path, kvs=None, tensors=None) -> Path:
    """The tiny Llama as a GGUF; `kvs`/`tensors` replace the defaults (edit llama_kvs())."""
    kvs = llama_kvs() if kvs is None else kvs
    return write_gguf(path, kvs, llama_tensors(len(byte_vocab()[0])) if tensors is None
                      else tensors)


def set_kv(kvs, key: str, vtype: int, value) -> list:
    """kvs with `key` set to (vtype, value), added where absent."""
    out = [(k, t, v) for k, t, v in kvs if k != key]
    return out + [(key, vtype, value)]


HF_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": DIM,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
    "intermediate_size": FFN, "max_position_embeddings": CTX, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}


def hf_tensors(vocab: int) -> dict[str, np.ndarray]:
    """The tiny Llama's tensors under HF names (q/k rows already in rotate-half order)."""
    from poot.models.weights import gguf_name

    g = llama_tensors(vocab)
    names = [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")]
    names += ["model.embed_tokens.weight", "model.norm.weight"]
    return {n: g[gguf_name(n)] for n in names}


def tokenizer_json() -> str:
    """tokenizer.json of the byte-level vocabulary, written by the tokenizers library."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, types, merges = byte_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == 3])
    return tok.to_str()


def tiny_hf_folder(folder: Path, shards: int = 2) -> Path:
    """The tiny Llama as an HF folder with every side file poot reads."""
    from poot_quant.safetensors_dir import write_folder

    vocab = len(byte_vocab()[0])
    folder = write_folder(Path(folder), hf_tensors(vocab), {**HF_CONFIG, "vocab_size": vocab},
                          shards=shards, extra={
                              "tokenizer_config.json": {
                                  "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                  "add_bos_token": False, "chat_template": CHAT_TEMPLATE},
                              "generation_config.json": {"bos_token_id": 1,
                                                         "eos_token_id": [2, 0]}})
    (folder / "tokenizer.json").write_text(tokenizer_json())
    return folder


def ir_texts() -> list[str]:
    """Printed graphs: the spec's decode attention layer, and the same after compile (fused
    kernels with region bodies)."""
    import poot
    from poot.models.examples import decode_attention_layer

    g = decode_attention_layer(heads=2, head_dim=8, capacity=16)
    return [str(g), str(poot.compile(g, "reference").graph)]
