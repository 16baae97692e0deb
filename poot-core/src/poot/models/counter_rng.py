"""The sampler's random numbers: a counter-based hash generator, written twice, once with
numpy (the host sampler) and once with the IR's U32 ops (the sampler inside a step graph),
so that every backend draws exactly the host's bits.

A draw is a pure function of (seed, counter, token id); nothing is carried between steps:

    mix(x)     = x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    key        = mix(mix(mix(seed_lo) ^ seed_hi) ^ counter)
    bits(i)    = mix(mix((i * 0x9e3779b9) ^ key) + key)
    uniform(i) = ((bits(i) >> 9) + 0.5) * 2^-23

All arithmetic is on 32-bit unsigned words and wraps. `seed` is 64 bits (two words),
`counter` the number of draws the sequence made before this one, `i` the token id; the
uniform lies in [2^-24, 1 - 2^-24], strictly inside (0, 1), and is exact in F32 (23 bits
plus the half: with 24 bits the largest value would round to 1.0 in F32). mix is a two-round
xorshift-multiply finalizer; the generator is for sampling, not for secrets.
"""
from __future__ import annotations

import numpy as np

from poot import ops
from poot.dtypes import DType

M1, M2, GOLDEN = 0x7FEB352D, 0x846CA68B, 0x9E3779B9
U32 = DType.U32


def split_seed(seed: int) -> tuple[int, int]:
    """A seed of up to 64 bits as its (low, high) 32-bit words."""
    seed = int(seed) & (2 ** 64 - 1)
    return seed & 0xFFFFFFFF, seed >> 32


# -- host ----------------------------------------------------------------------------------
def _mix_np(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(M1)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(M2)
    return x ^ (x >> np.uint32(16))


def key(seed_lo, seed_hi, counter) -> np.ndarray:
    """The per-draw key (numpy, broadcasting over rows)."""
    with np.errstate(over="ignore"):
        k = _mix_np(_mix_np(np.asarray(seed_lo, np.uint32)) ^ np.asarray(seed_hi, np.uint32))
        return _mix_np(k ^ np.asarray(counter, np.uint32))


def uniforms(seed: int, counter: int, count: int) -> np.ndarray:
    """float32 [count]: the uniform of every token id 0..count-1 for one draw."""
    k = key(*split_seed(seed), counter)
    ids = np.arange(count, dtype=np.uint32)
    with np.errstate(over="ignore"):
        bits = _mix_np(_mix_np((ids * np.uint32(GOLDEN)) ^ k) + k)
    return ((bits >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) * np.float32(2 ** -23)


# -- in a graph ---------------------------------------------------------------------------
def _mix(x):
    x = ops.bit_xor(x, ops.shr(x, 16))
    x = ops.mul(x, M1)
    x = ops.bit_xor(x, ops.shr(x, 15))
    x = ops.mul(x, M2)
    return ops.bit_xor(x, ops.shr(x, 16))


def graph_uniforms(seed, counter, vocab: int):
    """F32 [B, vocab] in a traced graph: `seed` U32 [B, 2] (low, high words), `counter`
    U32 [B]; row b holds the uniforms of draw counter[b] of seed[b], as `uniforms` does."""
    b = counter.shape[0]
    lo = ops.reshape(ops.slice_axis(seed, 1, 0, 1), (b, 1))
    hi = ops.reshape(ops.slice_axis(seed, 1, 1, 2), (b, 1))
    k = _mix(ops.bit_xor(_mix(ops.bit_xor(_mix(lo), hi)), ops.reshape(counter, (b, 1))))
    ids = ops.cast(ops.iota((1, vocab), 1), U32)
    bits = _mix(ops.add(_mix(ops.bit_xor(ops.mul(ids, GOLDEN), k)), k))
    top = ops.cast(ops.shr(bits, 9), DType.F32)
    return ops.mul(ops.add(top, 0.5), 2.0 ** -23)
