"""Write a llama GGUF of a real shape with random weights, for llama.cpp and poot to read.

Both engines time the same file (issue 50): every matrix, the embedding and the head
included, in one GGML block type (Q4_0 or Q4_K), norms F32 1 +- 0.1. Blocks are random
bytes (chunks of one random pool) whose f16 scale fields are set to finite values sized so
that a matrix's values have a standard deviation of about 1/sqrt(K) (the embedding 1), as
synthetic.py draws them, so that activations stay finite through 32 layers. Tensors are
drawn and written one at a time (the largest, the embedding, is 0.3 GB in Q4_0): the 8B
file never lives in memory.

The vocabulary is a SentencePiece ("llama") one of `vocab` made-up pieces: <unk>, <s>,
</s>, the 256 byte tokens, then lowercase strings. Both llama.cpp (src/llama-vocab.cpp)
and poot's GGUF tokenizer read it, and its size matches the embedding's rows, which
llama.cpp's "none" vocabulary would too but poot's loader would not (no tokens).

    python random_gguf.py /tmp/llama8b-q4_0.gguf --type Q4_0
    python random_gguf.py /tmp/tiny.gguf --type Q4_K --shape tiny
"""
from __future__ import annotations

import argparse
import math
import string
import sys
import time

import numpy as np

SHAPES = {
    # Llama-3-8B
    "8b": dict(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
               ffn=14336, ctx=8192),
    # a few MB: local checks (K a multiple of 256 for Q4_K's super-blocks)
    "tiny": dict(vocab=1024, dim=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                 ctx=1024),
}

#: per type: (block values, block bytes, f16 scale fields at the block's start, GGUF
#: general.file_type, the standard deviation of a value over the block's first scale for
#: random codes: Q4_0 (q - 8) * d about 4.6; Q4_K d * sc * q - dmin * m with 6-bit sc, m
#: and dmin about 8 d (its mean near zero) about 260)
TYPES = {"Q4_0": (32, 18, 1, 2, 4.6), "Q4_K": (256, 144, 2, 15, 260.0)}


def pieces(n: int) -> list[str]:
    """`n` distinct lowercase pieces, shortest first (a..z, aa..zz, ...)."""
    out: list[str] = []
    letters = string.ascii_lowercase
    width = 1
    while len(out) < n:
        for idx in np.ndindex(*(26,) * width):
            out.append("".join(letters[i] for i in idx))
            if len(out) == n:
                break
        width += 1
    return out


def vocabulary(vocab: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a SentencePiece vocabulary of `vocab` entries."""
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    rest = vocab - len(specials) - len(byte_tokens)
    if rest < 1:
        raise SystemExit(f"a vocabulary of {vocab} leaves no room past the specials and bytes")
    tokens = specials + byte_tokens + ["\u2581" + p for p in pieces(rest)]
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(rest)]
    types = [2, 3, 3] + [6] * 256 + [1] * rest      # UNKNOWN, CONTROL, BYTE, NORMAL
    return tokens, scores, types


def matrices(s: dict) -> list[tuple[str, int, int]]:
    """(name, N, K) of every matrix in GGUF order: embedding, per layer, head."""
    qd, kd = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    out = [("token_embd.weight", s["vocab"], s["dim"])]
    for i in range(s["layers"]):
        p = f"blk.{i}."
        out += [(p + "attn_q.weight", qd, s["dim"]), (p + "attn_k.weight", kd, s["dim"]),
                (p + "attn_v.weight", kd, s["dim"]), (p + "attn_output.weight", s["dim"], qd),
                (p + "ffn_gate.weight", s["ffn"], s["dim"]),
                (p + "ffn_up.weight", s["ffn"], s["dim"]),
                (p + "ffn_down.weight", s["dim"], s["ffn"])]
    return out + [("output.weight", s["vocab"], s["dim"])]


def norms(s: dict) -> list[str]:
    return [f"blk.{i}.{n}" for i in range(s["layers"])
            for n in ("attn_norm.weight", "ffn_norm.weight")] + ["output_norm.weight"]


#: random bytes drawn once; a tensor is 4 MiB chunks of it from random offsets (numpy's
#: generator makes a few hundred MB/s, too slow for 4.6 GB inside a device call)
POOL, CHUNK = 64 << 20, 4 << 20


def scale_table(scale: float) -> np.ndarray:
    """1024 f16 bit patterns scale * (1 + 0.25 u), u uniform in [-1, 1), indexed by 10
    random bits (subnormal where scale is that small: Q4_K's d of a long row)."""
    u = np.arange(1024) / 512.0 - 1.0
    return (scale * (1.0 + 0.25 * u)).astype(np.float16).view(np.uint16)


def blocks(rng: np.random.Generator, pool: np.ndarray, n: int, k: int, qtype: str,
           std: float) -> np.ndarray:
    """[n, row bytes] uint8: random blocks of `qtype` whose values have about `std`."""
    per, nbytes, fields, _, spread = TYPES[qtype]
    nblocks = n * (k // per)
    data = np.empty(nblocks * nbytes, np.uint8)
    for off in range(0, data.size, CHUNK):
        size = min(CHUNK, data.size - off)
        start = int(rng.integers(0, POOL - size + 1))
        data[off:off + size] = pool[start:start + size]
    halves = data.reshape(nblocks, nbytes).view(np.uint16)      # [nblocks, nbytes / 2]
    d = std / spread
    halves[:, 0] = scale_table(d)[halves[:, 0] & 0x3FF]
    if fields == 2:                      # Q4_K's dmin: 8 d puts its values' mean near zero
        halves[:, 1] = scale_table(8 * d)[halves[:, 1] & 0x3FF]
    return data.reshape(n, (k // per) * nbytes)


def write(path: str, shape: str = "8b", qtype: str = "Q4_0", layers: int | None = None,
          seed: int = 0, log=print) -> int:
    """Write the file; returns its size in bytes."""
    import gguf

    s = dict(SHAPES[shape])
    if layers is not None:
        s["layers"] = layers
    per, nbytes, _, file_type, _ = TYPES[qtype]
    mats = matrices(s)
    for name, _, k in mats:
        if k % per:
            raise SystemExit(f"{name}: K {k} is not a multiple of {qtype}'s {per}")
    t0 = time.perf_counter()
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random llama {shape} {s['layers']} layers {qtype}")
    w.add_file_type(file_type)
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    tokens, scores, types = vocabulary(s["vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    raw = gguf.GGMLQuantizationType[qtype]
    order = []       # GGUF order: llama.cpp needs none, readers by name
    for name in norms(s):
        w.add_tensor_info(name, (s["dim"],), np.dtype(np.float32), s["dim"] * 4)
        order.append((name, None))
    for name, n, k in mats:
        row = k // per * nbytes
        w.add_tensor_info(name, (n, row), np.dtype(np.uint8), n * row, raw_dtype=raw)
        order.append((name, (n, k)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 63, size=POOL // 8, dtype=np.uint64).view(np.uint8)
    total = 0
    for name, nk in order:
        if nk is None:
            data = (1.0 + 0.1 * math.sqrt(3) * rng.uniform(-1, 1, s["dim"])).astype(np.float32)
        else:
            n, k = nk
            data = blocks(rng, pool, n, k, qtype, 1.0 if name == "token_embd.weight"
                          else 1.0 / math.sqrt(k))
        w.write_tensor_data(data)
        total += data.nbytes
    w.close()
    log(f"{path}: {shape} shape, {s['layers']} layers, {qtype}, {total / 1e9:.2f} GB of "
        f"tensors in {time.perf_counter() - t0:.1f} s")
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--type", default="Q4_0", choices=sorted(TYPES))
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="override the shape's depth")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.path, args.shape, args.type, args.layers, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
