"""Sampling inside the step graph: each sequence's settings are slots, token ids come out.

`sample_tokens(logits)` appends poot.models.sampling's algorithm to a traced step: the
logits [B, vocab] stay on the device, and the step's result is the token ids [B] (I32), so
a decode step reads back 4 bytes per sequence. Each row samples with its own temperature,
top-k, top-p, repetition penalty, seed and draw counter, so one batched step serves
sequences with different settings; a greedy row (temperature 0) takes the argmax.

The slot roles are this module's own, declared through the `poot_slot_roles` hook (poot
loads this module as a built-in plugin); a graph can use them only once they are declared
(`SlotKind.get` refuses an unknown label with an IRError):

| slot (and role) | dtype | shape | range |
|---|---|---|---|
| sampler.temperature | F32 | [B] | >= 0 (0: greedy) |
| sampler.top_k | I32 | [B] | 0..CANDIDATES (0: off) |
| sampler.top_p | F32 | [B] | >= 0 (the host refuses outside (0, 1]) |
| sampler.penalty | F32 | [B] | >= 0 (1: off; the host refuses 0) |
| sampler.history | I32 | [B, PENALTY_WINDOW] | token ids, -1 for none |
| sampler.seed | U32 | [B, 2] | the seed's low and high words |
| sampler.counter | U32 | [B] | the draw number |
| sampler.mask | U32 | [B, ceil(vocab / 32)] | the ids each row may draw ("masked" only) |
| sampler.bias_ids | I32 | [B, BIAS_IDS] | token ids, -1 for none ("masked" only) |
| sampler.bias | F32 | [B, BIAS_IDS] | what each id's logit gains ("masked" only) |

A "masked" step shapes each row's logits as its request asks before the sampler's first
step, in the order of poot.serve.logits: first each row's logit bias (`sampler.bias_ids`,
distinct ids a row, with their `sampler.bias` added to those ids' logits), then its token
mask (`sampler.mask`, a packed bitmask: id i may be drawn when bit i % 32 of word i // 32 is
set, bits past the vocabulary ignored; the logits of every id whose bit is clear become
-inf). So a grammar's token mask (poot.serve.grammar) and a `logit_bias` are applied on the
device and only the token ids come back; a row without a constraint has every bit set, one
without a bias every id -1. Steps of the other modes take neither, so they cost what they
did. A bias of more than BIAS_IDS ids does not fit the slot: the host applies it
(poot.serve.logits).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from poot import ops
from poot.dtypes import DType
from poot.ir.types import SlotKind
from poot.models import counter_rng
from poot.models.sampling import CANDIDATES, PENALTY_WINDOW, Sampler
from poot.plugin import hookimpl, manager

OWNER = "poot.models.sample_graph"
F32, I32, U32 = DType.F32, DType.I32, DType.U32
#: slot name -> (dtype, lo, allows -1); each slot's role has the slot's name as its label
_RULES = {
    "sampler.temperature": (F32, 0, False),
    "sampler.top_k": (I32, 0, False),
    "sampler.top_p": (F32, 0, False),
    "sampler.penalty": (F32, 0, False),
    "sampler.history": (I32, 0, True),
    "sampler.seed": (U32, None, False),
    "sampler.counter": (U32, None, False),
    "sampler.mask": (U32, None, False),
    "sampler.bias_ids": (I32, 0, True),
    "sampler.bias": (F32, None, False),
}
SLOTS = tuple(_RULES)


def roles() -> list[SlotKind]:
    """The sampler's slot roles, as its owner states them (declared by the hook)."""
    return [SlotKind(label, dtype, lo, None, owner=OWNER, allows_negative_one=neg)
            for label, (dtype, lo, neg) in _RULES.items()]


@hookimpl
def poot_slot_roles():
    return roles()


def _slot(label: str, shape, bound: int | None = None):
    manager()  # loads the plugins, this one included, which declares the roles
    return ops.slot(SlotKind.get(label), shape, label, bound)


#: what a sampled step draws with: "argmax" (greedy without a penalty: no slots, one
#: ArgTopK k=1), "full" (every setting, per row, through the slots above) or "masked"
#: ("full" after each row's logit bias and token mask)
MODES = ("argmax", "full", "masked")
#: the ids one word of `sampler.mask` covers
WORD_BITS = 32
#: every id allowed: the mask word of a row without a constraint
ALL_ALLOWED = np.uint32(0xFFFFFFFF)
#: the most logit-bias ids a row of a "masked" step takes (`sampler.bias_ids`' width)
BIAS_IDS = 128


def mask_words(vocab: int) -> int:
    """The words of one row of `sampler.mask` for a vocabulary of `vocab` ids."""
    return -(-vocab // WORD_BITS)


def mode_for(samplers: Sequence[Sampler], masked: bool = False) -> str:
    """The cheapest mode that serves these samplers as they are (`masked`: some row draws
    under a token mask or a logit bias)."""
    if masked:
        return "masked"
    plain = all(s.greedy and s.repetition_penalty == 1 for s in samplers)
    return "argmax" if plain else "full"


def sample_tokens(logits, mode: str = "full") -> ops.Tensor:
    """Token ids I32 [B] drawn from `logits` F32 [B, vocab] in the traced graph, with the
    sampler slots above (the algorithm of poot.models.sampling, step by step)."""
    if mode not in MODES:
        raise ValueError(f"sampling mode must be one of {MODES}, not {mode!r}")
    b, vocab = logits.shape
    if mode == "argmax":
        return ops.reshape(ops.argtopk(logits, 1), (b,))
    logits = ops.cast(logits, F32)
    if mode == "masked":
        logits = biased_logits(logits, _slot("sampler.bias_ids", (b, BIAS_IDS), bound=vocab),
                               _slot("sampler.bias", (b, BIAS_IDS)))
        logits = masked_logits(logits, _slot("sampler.mask", (b, mask_words(vocab))))
    k = min(CANDIDATES, vocab)
    temp = ops.reshape(_slot("sampler.temperature", (b,)), (b, 1))
    top_k = ops.reshape(_slot("sampler.top_k", (b,), bound=CANDIDATES + 1), (b, 1))
    top_p = ops.reshape(_slot("sampler.top_p", (b,)), (b, 1))
    penalty = _slot("sampler.penalty", (b,))
    history = _slot("sampler.history", (b, PENALTY_WINDOW), bound=vocab)
    seed = _slot("sampler.seed", (b, 2))
    counter = _slot("sampler.counter", (b,))
    z = _penalize(logits, history, penalty)
    sampled = _less(0.0, temp)                                       # [B, 1]
    y = ops.div(z, ops.select(sampled, temp, 1.0))
    rows = ops.mul(ops.iota((b, 1), 0), vocab)
    cand = ops.argtopk(y, k)                                           # [B, K]
    v = ops.gather(ops.reshape(y, (b * vocab,)), ops.add(cand, rows), 0)
    ev = ops.exp(ops.sub(v, ops.slice_axis(v, 1, 0, 1)))
    has_k = ops.ge(top_k, 1)
    place = ops.iota((1, k), 1)
    in_k = _less(place, ops.select(has_k, top_k, k))                   # [B, K]
    total_k = ops.reduce_sum(ops.mul(ev, ops.cast(in_k, F32)), -1, keepdim=True)
    total_all = ops.reduce_sum(ops.exp(ops.sub(y, ops.slice_axis(v, 1, 0, 1))), -1,
                               keepdim=True)
    p = ops.div(ev, ops.select(has_k, total_k, total_all))
    earlier = ops.cast(_less(ops.iota((k, k), 0), ops.iota((k, k), 1)), F32)
    before = ops.matmul(p, earlier)                                    # mass before j
    keep = ops.mul(in_k, _less(before, top_p))
    cut = ops.maximum(has_k, _less(top_p, 1.0))
    floor = ops.neg(ops.reduce_max(ops.select(keep, ops.neg(v), float("-inf")), -1,
                                   keepdim=True))
    floor = ops.select(cut, floor, float("-inf"))
    u = counter_rng.graph_uniforms(seed, counter, vocab)
    gumbel = ops.neg(ops.log(ops.neg(ops.log(u))))
    noisy = ops.select(ops.ge(y, floor), ops.add(y, gumbel), float("-inf"))
    final = ops.select(sampled, noisy, z)
    return ops.reshape(ops.argtopk(final, 1), (b,))


def masked_logits(logits, mask):
    """`logits` F32 [B, vocab] with -inf at the ids whose bit is clear in `mask` U32 [B, W],
    in one pointwise pass: the logits viewed as [B, W, 32] (a vocabulary short of W * 32
    padded with columns cut again after), each word's 32 bits spread along the last axis
    (shift, keep the low bit)."""
    b, vocab = logits.shape
    w = mask.shape[1]
    pad = w * WORD_BITS - vocab
    if pad:                           # any values: the padding is cut again below
        logits = ops.concat([logits, ops.broadcast_to(ops.slice_axis(logits, 1, 0, 1),
                                                      (b, pad))], 1)
    shifts = ops.cast(ops.iota((1, 1, WORD_BITS), 2), U32)
    bits = ops.bit_and(ops.shr(ops.reshape(mask, (b, w, 1)), shifts), 1)
    out = ops.select(ops.geu(bits, 1), ops.reshape(logits, (b, w, WORD_BITS)),
                     float("-inf"))
    out = ops.reshape(out, (b, w * WORD_BITS))
    return ops.slice_axis(out, 1, 0, vocab) if pad else out


def biased_logits(logits, ids, bias):
    """`logits` F32 [B, vocab] with bias F32 [B, W] added at each row's ids I32 [B, W]
    (distinct in a row; -1 adds nothing)."""
    flat, at, seen = _at_ids(logits, ids)
    return _put(flat, ops.add(seen, ops.reshape(bias, at.shape)), at, logits.shape)


def _at_ids(z, ids):
    """z [B, vocab] flattened, each row's ids as flat indices [B*W] (-1 kept), and the
    values there (z's first where -1)."""
    b, vocab = z.shape
    flat = ops.reshape(z, (b * vocab,))
    at = ops.add(ids, ops.mul(ops.iota((b, 1), 0), vocab))
    at = ops.reshape(ops.select(ops.ge(ids, 0), at, -1), (b * ids.shape[1],))
    return flat, at, ops.gather(flat, ops.maximum(at, 0), 0)


def _put(flat, values, at, shape):
    """flat with values [N] written at the flat indices at [N] (-1: nowhere), as `shape`."""
    out = ops.scatter_update(ops.reshape(flat, (flat.shape[0], 1)),
                             ops.reshape(values, (at.shape[0], 1)), at)
    return ops.reshape(out, shape)


def _less(a, b):
    """The indicator of a < b."""
    return ops.sub(1, ops.ge(a, b))


def _penalize(z, history, penalty):
    """z with each row's history ids penalized (duplicates write the same value; -1 skips)."""
    b, w = history.shape
    flat, at, seen = _at_ids(z, history)
    r = ops.reshape(ops.broadcast_to(ops.reshape(penalty, (b, 1)), (b, w)), (b * w,))
    hit = ops.select(ops.ge(0.0, seen), ops.mul(seen, r), ops.div(seen, r))
    return _put(flat, hit, at, z.shape)


class MaskWriter(Protocol):
    """What writes one row's token mask: a grammar's matcher (poot.serve.grammar)."""

    def write_mask(self, words: np.ndarray) -> None:
        """Write the row's allowed ids into `words` U32 [mask_words(vocab)], in place."""


def slot_values(rows: Sequence[tuple[Sampler, Sequence[int]] | None], batch: int,
                mode: str = "full", *, vocab: int | None = None,
                masks: Sequence[MaskWriter | None] = (),
                biases: Sequence[tuple[np.ndarray, np.ndarray] | None] = ()
                ) -> dict[str, np.ndarray]:
    """The sampler slots of a step of `batch` rows: row i samples with rows[i]'s sampler
    (its next draw, which this uses up) and history; rows past them, and None rows, are
    padding (greedy, nothing penalized). An "argmax" step has no slots; its samplers must
    be plain greedy ones. A "masked" step's mask has `vocab` ids a row (the logits' width;
    other modes ignore it); masks[i], where given and not None, writes row i's (the others
    allow every id); biases[i], where given and not None, is row i's logit bias as (ids,
    values), at most BIAS_IDS distinct ids (ids past `vocab` add nothing)."""
    if len(rows) > batch:
        raise ValueError(f"{len(rows)} sampled rows for a step of {batch}")
    if len(masks) > len(rows) or len(biases) > len(rows):
        raise ValueError(f"{len(masks)} token masks and {len(biases)} logit biases for "
                         f"{len(rows)} sampled rows")
    live = [r[0] for r in rows if r is not None]
    if mode == "argmax":
        if mode_for(live) != "argmax":
            raise ValueError("an argmax step serves only greedy samplers without a penalty")
        for s in live:
            s.next_draw()
        return {}
    if mode == "masked" and vocab is None:
        raise ValueError("a masked step's slots need the vocabulary's size")
    if (masks or biases) and mode != "masked":
        raise ValueError(f"a {mode!r} step takes no token mask or logit bias")
    out = {
        "sampler.temperature": np.zeros(batch, np.float32),
        "sampler.top_k": np.zeros(batch, np.int32),
        "sampler.top_p": np.ones(batch, np.float32),
        "sampler.penalty": np.ones(batch, np.float32),
        "sampler.history": np.full((batch, PENALTY_WINDOW), -1, np.int32),
        "sampler.seed": np.zeros((batch, 2), np.uint32),
        "sampler.counter": np.zeros(batch, np.uint32),
    }
    if mode == "masked":
        out["sampler.mask"] = np.full((batch, mask_words(vocab)), ALL_ALLOWED, np.uint32)
        for i, writer in enumerate(masks):
            if writer is not None:
                writer.write_mask(out["sampler.mask"][i])
        out["sampler.bias_ids"] = np.full((batch, BIAS_IDS), -1, np.int32)
        out["sampler.bias"] = np.zeros((batch, BIAS_IDS), np.float32)
        for i, bias in enumerate(biases):
            if bias is not None:
                _write_bias(out, i, *bias, vocab)
    for i, row in enumerate(rows):
        if row is None:
            continue
        s, history = row
        out["sampler.temperature"][i] = s.temperature
        out["sampler.top_k"][i] = s.top_k
        out["sampler.top_p"][i] = s.top_p
        out["sampler.penalty"][i] = s.repetition_penalty
        seen = s.penalized(history)
        out["sampler.history"][i, : len(seen)] = seen
        out["sampler.seed"][i] = counter_rng.split_seed(s.seed)
        out["sampler.counter"][i] = s.next_draw()
    return out


def _write_bias(out: dict, row: int, ids: np.ndarray, values: np.ndarray, vocab: int) -> None:
    """Row `row` of the bias slots: its ids inside the vocabulary and their values."""
    ids = np.asarray(ids, np.int64)
    keep = (ids >= 0) & (ids < vocab)
    ids, values = ids[keep], np.asarray(values, np.float32)[keep]
    if ids.size > BIAS_IDS or np.unique(ids).size != ids.size:
        raise ValueError(f"a row's logit bias takes at most {BIAS_IDS} distinct ids, got "
                         f"{ids.size} ({np.unique(ids).size} distinct)")
    out["sampler.bias_ids"][row, : ids.size] = ids
    out["sampler.bias"][row, : ids.size] = values
