"""Pick the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

The steps run in the order HF transformers applies them: repetition penalty, temperature,
top-k, top-p, then one draw from the seeded generator. numpy only; float64 inside.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from poot.errors import SamplingError


class Sampler:
    """Next-token choice; deterministic for a given seed and call sequence."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int | None = None):
        if not (math.isfinite(temperature) and temperature >= 0):
            raise SamplingError(f"temperature must be a finite number >= 0, got {temperature}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise SamplingError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
        if not 0 < top_p <= 1:
            raise SamplingError(f"top_p must lie in (0, 1], got {top_p}")
        if not (math.isfinite(repetition_penalty) and repetition_penalty > 0):
            raise SamplingError(f"repetition_penalty must be > 0 (1 = off), got "
                                f"{repetition_penalty}")
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.repetition_penalty = repetition_penalty
        self.rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from `logits` [vocab], given the ids already in the sequence."""
        scores = _checked_row(logits)
        if self.repetition_penalty != 1 and len(history):
            scores = _penalize(scores, history, self.repetition_penalty)
        if self.greedy:
            return int(np.argmax(scores))
        scores = scores / self.temperature
        if self.top_k and self.top_k < scores.size:
            ids = np.argpartition(-scores, self.top_k - 1)[: self.top_k]  # O(vocab), unordered
        else:
            ids = np.arange(scores.size)
        kept = scores[ids]
        probs = np.exp(kept - kept.max())
        probs /= probs.sum()
        if self.top_p < 1:
            ids, probs = _nucleus(ids, probs, self.top_p)
        pick = int(np.searchsorted(np.cumsum(probs), self.rng.random(), side="right"))
        return int(ids[min(pick, len(ids) - 1)])

    def sample_batch(self, logits: np.ndarray,
                     histories: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """One token id per row of `logits` [batch, vocab]; rows draw in order from one RNG."""
        logits = np.asarray(logits)
        if logits.ndim != 2:
            raise SamplingError(f"sample_batch takes logits [batch, vocab], got {logits.shape}")
        histories = histories if histories is not None else [()] * logits.shape[0]
        if len(histories) != logits.shape[0]:
            raise SamplingError(f"{len(histories)} histories for {logits.shape[0]} rows")
        picks = [self.sample(row, hist) for row, hist in zip(logits, histories, strict=True)]
        return np.asarray(picks, dtype=np.int64)


def _checked_row(logits: np.ndarray) -> np.ndarray:
    scores = np.asarray(logits, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise SamplingError(f"sample takes logits [vocab], got shape {scores.shape}")
    if np.isnan(scores).any():
        raise SamplingError("logits contain NaN; the model output is broken")
    if np.isposinf(scores).any():
        raise SamplingError("logits contain +inf; the model output is broken")
    if np.isneginf(scores).all():
        raise SamplingError("every logit is -inf; no token can be chosen")
    return scores


def _nucleus(ids: np.ndarray, probs: np.ndarray, top_p: float):
    """The shortest best-first run of `ids` whose probability reaches top_p, renormalized.

    Sorting a whole vocabulary costs milliseconds, so it sorts only the best `size` ids and
    widens that window until it holds the run (the run is a prefix of the sorted order)."""
    size = 64
    while True:
        size = min(size, len(ids))
        head = np.argpartition(-probs, size - 1)[:size] if size < len(ids) else np.arange(size)
        head = head[np.argsort(-probs[head], kind="stable")]
        mass = np.cumsum(probs[head])
        if mass[-1] >= top_p or size == len(ids):
            chosen = head[: min(int(np.searchsorted(mass, top_p)) + 1, size)]
            return ids[chosen], probs[chosen] / probs[chosen].sum()
        size *= 8


def _penalize(scores: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL's repetition penalty: seen tokens' positive logits shrink, negative ones grow."""
    seen = np.unique(np.asarray(history, dtype=np.int64))
    if seen.size and (seen.min() < 0 or seen.max() >= scores.size):
        raise SamplingError(f"history holds a token id outside the vocabulary ({scores.size})")
    scores = scores.copy()
    chosen = scores[seen]
    scores[seen] = np.where(chosen > 0, chosen / penalty, chosen * penalty)
    return scores
