"""A model config checked against the tensors a checkpoint holds, and against the machine.

A config comes from a file (GGUF metadata, config.json) and so does every tensor; neither is
trusted alone. `check_config` runs before any graph is built: every size the builder will
allocate from is bounded (`LIMITS`), the config agrees with itself (heads, KV heads, RoPE
dims), and every tensor the builder reads that is present has the shape the config implies,
with the layer count matching the blocks present. `check_memory` bounds what a step will
allocate (KV cache, RoPE tables) by the machine's memory before a plan is made.
"""
from __future__ import annotations

import os
import re

from poot.errors import CapacityError, ConfigError

#: upper bounds on every size a config names, far above any real Llama-family model
LIMITS = {
    "vocab": 1 << 22, "dim": 1 << 16, "layers": 1024, "heads": 1024, "kv_heads": 1024,
    "head_dim": 4096, "ffn": 1 << 20, "max_seq": 1 << 24, "experts": 4096,
}


#: the config field each GGUF metadata key (after "ARCH.") and config.json key sets
GGUF_KEYS = {"vocab": "vocab_size", "dim": "embedding_length", "layers": "block_count",
             "heads": "attention.head_count", "kv_heads": "attention.head_count_kv",
             "head_dim": "attention.key_length", "ffn": "feed_forward_length",
             "max_seq": "context_length", "rope_dim": "rope.dimension_count"}
HF_KEYS = {"vocab": "vocab_size", "dim": "hidden_size", "layers": "num_hidden_layers",
           "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
           "head_dim": "head_dim", "ffn": "intermediate_size",
           "max_seq": "max_position_embeddings", "rope_dim": "head_dim"}


def file_keys(kind: str, arch: str) -> dict[str, str]:
    """Config field -> the key of the file it came from (for error messages)."""
    if kind == "gguf":
        return {f: f"{arch}.{k}" for f, k in GGUF_KEYS.items()}
    return dict(HF_KEYS)


def _fail(where: str, key: str, value, problem: str):
    raise ConfigError(f"{where}: {key} = {value!r} {problem}", file=where, key=key, value=value)


def _gguf_names(tensors: dict, kind: str) -> dict:
    """GGUF tensor name -> TensorInfo (HF names mapped; names poot does not read dropped)."""
    if kind == "gguf":
        return dict(tensors)
    from poot.models.weights import gguf_name

    out = {}
    for name, info in tensors.items():
        g = gguf_name(name)
        if g is not None:
            out.setdefault(g, info)
    return out


def _mla_shapes(c, m) -> dict[str, tuple[int, ...]]:
    """DeepSeek's latent attention tensors (poot.models.deepseek)."""
    return {"blk.N.attn_q_a.weight": (m.q_rank, c.dim),
            "blk.N.attn_q_a_norm.weight": (m.q_rank,),
            "blk.N.attn_q_b.weight": (c.heads * c.head_dim, m.q_rank),
            "blk.N.attn_kv_a_mqa.weight": (m.latent, c.dim),
            "blk.N.attn_kv_a_norm.weight": (m.kv_rank,),
            "blk.N.attn_kv_b.weight": (c.heads * (m.nope + m.v_dim), m.kv_rank),
            "blk.N.exp_probs_b.bias": (c.experts,)}


def expected_shapes(c) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name (block 0's, with N for the layer) -> the shape the config implies."""
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    m = getattr(c, "mla", None)
    return {**(_mla_shapes(c, m) if m is not None else {}),
        "token_embd.weight": (c.vocab, c.dim), "output.weight": (c.vocab, c.dim),
        "output_norm.weight": (c.dim,), "blk.N.attn_norm.weight": (c.dim,),
        "blk.N.ffn_norm.weight": (c.dim,), "blk.N.attn_q.weight": (q, c.dim),
        "blk.N.attn_k.weight": (kv, c.dim), "blk.N.attn_v.weight": (kv, c.dim),
        "blk.N.attn_output.weight": (c.dim, c.heads * m.v_dim if m else q),
        "blk.N.ffn_gate.weight": (c.ffn, c.dim),
        "blk.N.ffn_up.weight": (c.ffn, c.dim), "blk.N.ffn_down.weight": (c.dim, c.ffn),
        "blk.N.attn_q.bias": (q,), "blk.N.attn_k.bias": (kv,), "blk.N.attn_v.bias": (kv,),
    }


def check_config(c, tensors: dict, kind: str, where: str) -> None:
    """Refuse a config whose sizes are unbounded, inconsistent, or contradict the tensors."""
    keys = file_keys(kind, c.arch)
    for key, hi in LIMITS.items():
        if key == "experts" or (key == "ffn" and c.experts):  # MoE: experts_ffn instead
            continue
        value = getattr(c, key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            _fail(where, keys[key], value, f"is outside [1, {hi}]")
    if c.heads % c.kv_heads:
        _fail(where, keys["kv_heads"], c.kv_heads, f"does not divide {keys['heads']} = "
                                                   f"{c.heads}")
    named = _gguf_names(tensors, kind)
    blocks = {int(m.group(1)) for n in named if (m := re.match(r"blk\.(\d+)\.", n))}
    if blocks and blocks != set(range(c.layers)):
        found = f"blocks 0..{max(blocks)}" if blocks == set(range(max(blocks) + 1)) \
            else f"{len(blocks)} blocks numbered {min(blocks)}..{max(blocks)}"
        _fail(where, keys["layers"], c.layers, f"contradicts the tensors: the file holds {found}")
    shapes = expected_shapes(c)
    for name, info in named.items():
        generic = re.sub(r"^blk\.\d+\.", "blk.N.", name)
        want = shapes.get(generic)
        if want is None:
            continue
        have = tuple(int(d) for d in info.shape)
        if have != want:
            raise ConfigError(
                f"{where}: tensor {name!r} is {list(have)}, but the config (dim {c.dim}, heads "
                f"{c.heads}, kv heads {c.kv_heads}, head dim {c.head_dim}, ffn {c.ffn}, vocab "
                f"{c.vocab}) implies {list(want)}", file=where, key=name, value=have)
    if c.rot > c.head_dim or c.rot % 2 or c.rot < 2:
        _fail(where, keys["rope_dim"], c.rot, f"is not an even count in [2, head dim = "
                                              f"{c.head_dim}]")


def machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound from here
        return 1 << 62


def check_memory(c, batch: int = 1) -> None:
    """Refuse a KV capacity whose cache and RoPE tables alone exceed the machine's memory."""
    kv = 2 * c.layers * c.kv_heads * c.head_dim * c.max_seq * batch * 4
    rope = 2 * c.max_seq * c.rot * 4
    total, have = kv + rope, machine_memory()
    if total > have:
        raise CapacityError(
            f"a KV capacity of {c.max_seq} positions x {batch} needs {total / 2**30:.1f} GiB "
            f"of KV cache and RoPE tables ({c.layers} layers, {c.kv_heads} KV heads, head dim "
            f"{c.head_dim}); this machine has {have / 2**30:.1f} GiB: load with a smaller "
            f"max_seq")
