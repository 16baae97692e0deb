"""How far one model configuration's next-token distributions lie from another's, and the
perplexity of each, from logits, in float64 numpy.

Each scored position gives the negative log-likelihood of the token that follows (under
the configuration tested, Q, and under the base), the KL divergence KL(base || Q) of the
two distributions, and whether their top-1 tokens agree. The summary reports them as
llama.cpp's `llama-perplexity --kl-divergence` does: perplexity exp(mean NLL) with the
error exp(mean) * sd / sqrt(N - 1) (N scored positions, sd of the per-position values),
the ratio PPL(Q)/PPL(base) = exp(mean(NLL_Q - NLL_base)) with the same error of that
difference (so the positions' correlation counts), the mean KL with its standard error
and its percentiles interpolated linearly between sorted values, and the top-1 agreement
p with the error sqrt(p (1 - p) / (N - 1)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from poot.errors import SamplingError

#: rows scored at once: bounds the float64 temporaries of a 262k-token vocabulary
BLOCK_ROWS = 16


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the last axis, in float64."""
    x = np.asarray(logits, np.float64)
    top = x.max(axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class Estimate:
    """A mean over the scored positions and its standard error."""

    value: float
    err: float

    def __str__(self) -> str:
        return f"{self.value:.6g} +/- {self.err:.2g}"


def mean_estimate(values: np.ndarray) -> Estimate:
    """The mean of `values` and its standard error, sd / sqrt(N - 1) (0 for one value)."""
    v = np.asarray(values, np.float64)
    n = len(v)
    mean = float(v.mean())
    return Estimate(mean, float(v.std() / math.sqrt(n - 1)) if n > 1 else 0.0)


def exp_estimate(log: Estimate) -> Estimate:
    """exp of a mean log, its error carried to first order (exp(m) * err)."""
    value = math.exp(log.value)
    return Estimate(value, value * log.err)


@dataclass
class Tally:
    """Per-position scores of every window so far; `base` is False where only Q was run."""

    base: bool
    nll: list[np.ndarray] = field(default_factory=list)
    nll_base: list[np.ndarray] = field(default_factory=list)
    kl: list[np.ndarray] = field(default_factory=list)
    same_top: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, targets: np.ndarray,
            base_logits: np.ndarray | None = None) -> None:
        """Score rows of logits [N, vocab] against the tokens that follow them [N] (and, for
        a comparison, against the base configuration's logits of the same rows)."""
        if (base_logits is not None) != self.base:
            raise ValueError("a comparison's tally takes base logits for every row, a "
                             "perplexity's for none")
        targets = np.asarray(targets, np.int64)
        if len(logits) != len(targets) or (self.base and base_logits.shape != logits.shape):
            raise ValueError(f"rows of logits {logits.shape}, base "
                             f"{None if base_logits is None else base_logits.shape} and "
                             f"targets {targets.shape} disagree")
        for s in range(0, len(targets), BLOCK_ROWS):
            rows = slice(s, s + BLOCK_ROWS)
            q = log_softmax(_finite(logits[rows], "tested"))
            picked = np.arange(len(q)), targets[rows]
            self.nll.append(-q[picked])
            if not self.base:
                continue
            b = log_softmax(_finite(base_logits[rows], "base"))
            self.nll_base.append(-b[picked])
            self.kl.append(np.maximum((np.exp(b) * (b - q)).sum(axis=-1), 0.0))
            self.same_top.append(q.argmax(axis=-1) == b.argmax(axis=-1))

    @property
    def count(self) -> int:
        return sum(len(x) for x in self.nll)

    def summary(self) -> Summary:
        if self.count == 0:
            raise ValueError("no position was scored")
        nll = np.concatenate(self.nll)
        s = Summary(count=len(nll), ppl=exp_estimate(mean_estimate(nll)))
        if not self.base:
            return s
        nll_b, kl = np.concatenate(self.nll_base), np.concatenate(self.kl)
        same = np.concatenate(self.same_top)
        n = len(same)
        p = float(same.mean())
        s.ppl_base = exp_estimate(mean_estimate(nll_b))
        s.ln_ratio = mean_estimate(nll - nll_b)
        s.ratio = exp_estimate(s.ln_ratio)
        s.kl = mean_estimate(kl)
        s.kl_percentiles = {q: float(np.percentile(kl, q)) for q in PERCENTILES}
        s.kl_max = float(kl.max())
        s.same_top = Estimate(p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else 0.0)
        return s


#: the KL percentiles a comparison reports
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass
class Summary:
    """What a tally reports; the fields after `ppl` are set for a comparison only."""

    count: int
    ppl: Estimate
    ppl_base: Estimate | None = None
    ln_ratio: Estimate | None = None
    ratio: Estimate | None = None
    kl: Estimate | None = None
    kl_percentiles: dict[float, float] = field(default_factory=dict)
    kl_max: float | None = None
    same_top: Estimate | None = None

    def lines(self) -> list[str]:
        """The report, one figure a line, in llama.cpp's order and words."""
        if self.kl is None:
            return [f"scored positions: {self.count}", f"PPL = {self.ppl}"]
        out = [f"scored positions: {self.count}",
               f"Mean PPL(Q)              : {self.ppl}",
               f"Mean PPL(base)           : {self.ppl_base}",
               f"Mean ln(PPL(Q)/PPL(base)): {self.ln_ratio}",
               f"Mean PPL(Q)/PPL(base)    : {self.ratio}",
               f"Mean KLD                 : {self.kl}",
               f"Maximum KLD              : {self.kl_max:.6g}"]
        out += [f"{q:>5g}%   KLD             : {v:.6g}"
                for q, v in sorted(self.kl_percentiles.items(), reverse=True)]
        p = self.same_top
        out.append(f"Same top p               : {100 * p.value:.3f} +/- {100 * p.err:.3f} %")
        return out

    def as_dict(self) -> dict:
        """The figures as plain numbers (for --json and the docs)."""
        def est(e):
            return None if e is None else {"value": e.value, "err": e.err}

        return {"count": self.count, "ppl": est(self.ppl), "ppl_base": est(self.ppl_base),
                "ln_ratio": est(self.ln_ratio), "ratio": est(self.ratio), "kl": est(self.kl),
                "kl_max": self.kl_max,
                "kl_percentiles": {str(q): v for q, v in self.kl_percentiles.items()},
                "same_top": est(self.same_top)}


def _finite(logits: np.ndarray, which: str) -> np.ndarray:
    if not np.isfinite(logits).all():
        raise SamplingError(f"the {which} configuration's logits hold NaN or infinity: no "
                            f"distribution to score")
    return logits
