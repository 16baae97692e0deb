"""Perplexity of a model over a text, and its distance from a second configuration of the
same model, in windows: llama.cpp's `llama-perplexity` method.

The text's tokens are cut into non-overlapping windows of `window` tokens (a tail shorter
than a window is dropped); where the tokenizer adds BOS, each window's first token is
replaced by it. Each window runs from an empty KV cache, and the logits of its second half
are scored: positions window/2 .. window-2, each against the token that follows it, so
every scored token sees at least half a window of context (window/2 - 1 scored positions a
window). A window runs in chunks of `chunk` tokens through dense-KV plans whose head runs
on every row of the chunk (build_decoder's logits="all"); the chunks' plans share one
weight cache and one KV cache, as a Session's plans do.

A comparison runs the two configurations window by window, chunk by chunk, and scores
each chunk's rows at once (poot.models.divergence), so no more than a chunk's logits of
each is held.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from poot.errors import BindError, RequestError
from poot.models.divergence import Summary, Tally

#: the most tokens a plan runs at once (a chunk's logits are chunk x vocab float32, so this
#: bounds what is held; fewer steps a window cost less: each step pays for its weights and
#: attends over the whole cache)
CHUNK = 512


def windows(ids: Sequence[int], window: int, bos: int | None = None) -> list[np.ndarray]:
    """The whole windows of `window` tokens that `ids` holds, each opening with `bos` (the
    token it replaces) where given."""
    if window < 4:
        raise RequestError(f"a window holds at least 4 tokens, not {window}", param="window")
    ids = np.asarray(ids, np.int32)
    out = [ids[i: i + window].copy() for i in range(0, len(ids) - window + 1, window)]
    if not out:
        raise RequestError(f"the text has {len(ids)} tokens, less than one window of "
                           f"{window}", param="window")
    if bos is not None:
        for w in out:
            w[0] = bos
    return out


def scored(window: int) -> slice:
    """The positions of a window whose logits are scored (against the next token)."""
    return slice(window // 2, window - 1)


class WindowRunner:
    """Logits of windows of one loaded model, each run from position 0."""

    def __init__(self, model, chunk: int = CHUNK):
        if model.expert_pool is not None or model.tp is not None:
            raise BindError("perplexity runs a model whose experts are all resident, on one "
                            "device (no --expert-pool, no --tp)")
        if model.adapters is not None:
            raise BindError("perplexity scores the model itself: load it without LoRA "
                            "adapters")
        self.model, self.chunk = model, chunk
        self.executors: dict[int, object] = {}
        self.weights = self.state = None

    def executor(self, tokens: int):
        """The executor of the plan of `tokens` tokens with every row's logits; plans share
        this runner's weight cache and KV state."""
        ex = self.executors.get(tokens)
        if ex is None:
            from poot.plan import plan
            from poot.runtime.executor import Executor

            m = self.model
            g = m.step_graph(tokens, 1, "dense", logits="all")
            ex = Executor(plan(g, (m.backend, m.device)), m.bound_consts,
                          weights=self.weights, state=self.state)
            self.weights, self.state = ex.weights, ex.state
            self.executors[tokens] = ex
        return ex

    def chunks(self, window: np.ndarray, rows: slice):
        """Run `window` from an empty cache; yield (first, logits [n, vocab] float32) for
        each chunk that holds positions of `rows`, cut to those positions (first: the
        window position of the first row). The cache is reused: positions past the ones
        written by this window are masked."""
        n = len(window)
        if n > self.model.config.max_seq:
            cap = self.model.config.max_seq
            raise RequestError(f"a window of {n} tokens passes the model's {cap} positions "
                               f"(load it with max_seq >= {n})", param="window")
        for start in range(0, n, self.chunk):
            t = min(self.chunk, n - start)
            ex = self.executor(t)
            slots = {"tokens": window[start: start + t], "pos": [start]}
            if "end" in ex.slots:
                slots["end"] = [start + t]
            lo, hi = max(start, rows.start), min(start + t, rows.stop)
            result = ex.step(slots).result
            if lo < hi:
                yield lo, np.asarray(result[lo - start: hi - start], np.float32)


def evaluate(model, ids: Sequence[int], window: int, *, base=None, chunk: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> Summary:
    """Perplexity of `model` over the token ids `ids` in windows of `window` tokens and,
    with `base` (a second loaded configuration of the same model), the KL divergence of
    its next-token distributions from base's, the top-1 agreement and both perplexities.
    `chunk`: tokens a step runs (default: the window, at most CHUNK). `progress(done,
    total)` is called after each window."""
    return evaluate_many([model], ids, window, base=base, chunk=chunk, progress=progress)[0]


def evaluate_many(models: Sequence, ids: Sequence[int], window: int, *, base=None,
                  chunk: int | None = None,
                  progress: Callable[[int, int], None] | None = None) -> list[Summary]:
    """`evaluate` for several configurations of one model over the same windows, each
    against the same `base`, which runs once."""
    for m in models:
        if base is not None and base.config.vocab != m.config.vocab:
            raise RequestError(f"the base configuration has {base.config.vocab} tokens, a "
                               f"tested one {m.config.vocab}: they are not one model")
    tok = models[0].tokenizer
    cut = windows(ids, window, tok.bos_id if tok.add_bos else None)
    rows = scored(window)
    tallies = [Tally(base=base is not None) for _ in models]
    chunk = chunk or min(window, CHUNK)
    runners = [WindowRunner(m, chunk) for m in (*models, base) if m is not None]
    for i, w in enumerate(cut):
        streams = [r.chunks(w, rows) for r in runners]
        for parts in zip(*streams, strict=True):
            first = parts[0][0]
            reference = parts[len(models)][1] if base is not None else None
            for tally, (_, logits) in zip(tallies, parts, strict=False):
                tally.add(logits, w[first + 1: first + 1 + len(logits)], reference)
        if progress is not None:
            progress(i + 1, len(cut))
    return [t.summary() for t in tallies]


__all__ = ["evaluate", "evaluate_many", "windows", "scored", "WindowRunner", "CHUNK"]
