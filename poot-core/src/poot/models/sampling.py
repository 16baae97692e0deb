"""Pick the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

One algorithm, run either here on the host (numpy, float32) or inside a step graph
(poot.models.sample_graph, the same steps in IR ops), so that a seeded draw gives the same
token wherever it runs. For logits z [vocab] of one sequence, in float32:

1. repetition penalty r: each distinct id among the last `window` tokens of the sequence
   (prompt included) has z = z / r where z > 0, else z * r (CTRL's penalty);
2. temperature 0 (greedy): the token is argmax z (the lowest id among equal values);
3. otherwise y = z / temperature; the best `candidates` ids of y (64, or the vocabulary if
   smaller; ArgTopK order: larger first, the lower id among equal values) and their values v;
4. probabilities p_j = exp(v_j - v_0) / L, where L sums exp(y - v_0) over the first top_k
   candidates, or over the whole vocabulary when top_k is 0 (off);
5. candidate j is kept when j < top_k (or any j when top_k is 0) and the candidates before
   it hold less than top_p of the mass (so the first is always kept); the threshold t is the
   smallest kept value, or -inf when neither top_k nor top_p cuts (the whole vocabulary);
6. the token is the argmax over the ids with y >= t of y + g, where g = -log(-log(u)) is
   Gumbel noise from the counter-based generator (poot.models.counter_rng): u is the
   uniform of (seed, draw number, id). Gumbel-max draws from softmax(y) restricted to the
   kept ids, one noise value per id, independent of which ids are kept.

Where this differs from HF transformers' order (penalty, temperature, top-k, top-p): the
penalty sees a window of the last 64 tokens (llama.cpp's default), not the whole sequence;
top_k is at most `candidates` (64); and the top-p set is sought among the best `candidates`
ids only, so a nucleus larger than that is cut at the candidates. Values tied at the
threshold are all kept. The draw number counts the draws this sampler made, so the n-th
token of a sequence uses draw n - 1 whichever backend or batch drew it.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from poot.errors import SamplingError
from poot.models import counter_rng

#: the most top-k candidates the sampler ranks (its ArgTopK's k)
CANDIDATES = 64
#: the repetition penalty's window: the last this many tokens of the sequence
PENALTY_WINDOW = 64


class Sampler:
    """Next-token choice of one sequence; deterministic for a given seed and draw number."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int | None = None):
        if not (math.isfinite(temperature) and temperature >= 0):
            raise SamplingError(f"temperature must be a finite number >= 0, got {temperature}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not \
                0 <= top_k <= CANDIDATES:
            raise SamplingError(f"top_k must be an int in 0..{CANDIDATES} (0 = off; the "
                                f"sampler ranks at most {CANDIDATES} candidates), got {top_k!r}")
        if not 0 < top_p <= 1:
            raise SamplingError(f"top_p must lie in (0, 1], got {top_p}")
        if not (math.isfinite(repetition_penalty) and repetition_penalty > 0):
            raise SamplingError(f"repetition_penalty must be > 0 (1 = off), got "
                                f"{repetition_penalty}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                                 or not 0 <= seed < 2 ** 64):
            raise SamplingError(f"seed must be an int in [0, 2^64), got {seed!r}")
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.repetition_penalty = repetition_penalty
        #: the generator's seed (a random one when none is given)
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        #: draws made so far: the counter of the next draw
        self.draws = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def next_draw(self) -> int:
        """The counter of the next draw, which this call uses up."""
        self.draws += 1
        return self.draws - 1

    def penalized(self, history: Sequence[int]) -> list[int]:
        """The ids the penalty applies to: the last PENALTY_WINDOW of `history` (none when
        the penalty is off)."""
        if self.repetition_penalty == 1:
            return []
        return [int(t) for t in history[-PENALTY_WINDOW:]]

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from `logits` [vocab], given the ids already in the sequence."""
        z = self._scores(logits, history)
        counter = self.next_draw()
        if self.greedy:
            return int(np.argmax(z))
        y, t = self._kept(z)
        u = counter_rng.uniforms(self.seed, counter, y.size)
        noisy = np.where(y >= t, y - np.log(-np.log(u)), np.float32(-np.inf))
        return int(np.argmax(noisy))

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The probabilities `sample` draws from (float64 [vocab]: softmax of the scaled
        scores over the kept ids; one-hot for a greedy sampler), using no draw: what
        speculative decoding's rejection rule compares."""
        z = self._scores(logits, history)
        p = np.zeros(z.size)
        if self.greedy:
            p[np.argmax(z)] = 1.0
            return p
        y, t = self._kept(z)
        keep = y >= t
        e = np.exp(y[keep].astype(np.float64) - float(y.max()))
        p[keep] = e / e.sum()
        return p

    def _scores(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Step 1: the checked logits with the repetition penalty applied."""
        z = _checked_row(logits)
        seen = self.penalized(history)
        return _penalize(z, seen, self.repetition_penalty) if seen else z

    def _kept(self, z: np.ndarray) -> tuple[np.ndarray, np.float32]:
        """Steps 3 to 5: the scaled scores y and the threshold t of the kept ids."""
        y = z / np.float32(self.temperature)
        k = min(CANDIDATES, y.size)
        cand = _top(y, k)
        v = y[cand]
        ev = np.exp(v - v[0])
        total = ev[: self.top_k].sum(dtype=np.float32) if self.top_k else \
            np.exp(y - v[0]).sum(dtype=np.float32)
        p = ev / total
        before = p @ np.triu(np.ones((k, k), np.float32), 1)   # mass of the candidates before j
        keep = (np.arange(k) < (self.top_k or k)) & (before < np.float32(self.top_p))
        return y, v[keep].min() if self.top_k or self.top_p < 1 else np.float32(-np.inf)

    def sample_batch(self, logits: np.ndarray,
                     histories: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """One token id per row of `logits` [batch, vocab]; rows use successive draws."""
        logits = np.asarray(logits)
        if logits.ndim != 2:
            raise SamplingError(f"sample_batch takes logits [batch, vocab], got {logits.shape}")
        histories = histories if histories is not None else [()] * logits.shape[0]
        if len(histories) != logits.shape[0]:
            raise SamplingError(f"{len(histories)} histories for {logits.shape[0]} rows")
        picks = [self.sample(row, hist) for row, hist in zip(logits, histories, strict=True)]
        return np.asarray(picks, dtype=np.int64)


def _checked_row(logits: np.ndarray) -> np.ndarray:
    scores = np.asarray(logits)
    if scores.ndim != 1 or scores.size == 0:
        raise SamplingError(f"sample takes logits [vocab], got shape {scores.shape}")
    scores = scores.astype(np.float32)
    if np.isnan(scores).any():
        raise SamplingError("logits contain NaN; the model output is broken")
    if np.isposinf(scores).any():
        raise SamplingError("logits contain +inf; the model output is broken")
    if np.isneginf(scores).all():
        raise SamplingError("every logit is -inf; no token can be chosen")
    return scores


def _top(y: np.ndarray, k: int) -> np.ndarray:
    """ArgTopK(y, k) without sorting the vocabulary: the ids above the k-th largest value,
    then those equal to it in id order, sorted larger first (stable)."""
    if k < y.size:
        kth = np.partition(y, y.size - k)[y.size - k]
        above = np.flatnonzero(y > kth)
        ids = np.concatenate([above, np.flatnonzero(y == kth)[: k - above.size]])
    else:
        ids = np.arange(y.size)
    return ids[np.lexsort((ids, -y[ids].astype(np.float64)))]


def _penalize(scores: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL's repetition penalty: seen tokens' positive logits shrink, negative ones grow."""
    seen = np.unique(np.asarray(history, dtype=np.int64))
    if seen.size and (seen.min() < 0 or seen.max() >= scores.size):
        raise SamplingError(f"history holds a token id outside the vocabulary ({scores.size})")
    scores = scores.copy()
    chosen = scores[seen]
    r = np.float32(penalty)
    scores[seen] = np.where(chosen > 0, chosen / r, chosen * r)
    return scores
