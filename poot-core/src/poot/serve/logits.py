"""What a request does to its sequence's logits before the sampler draws.

A request with `logprobs` needs its logits [vocab] on the host at each step
(`LogitRule.host`), as does a `logit_bias` of more than BIAS_IDS ids: the engine runs such a
step through the decode plan that reads the logits back (Session.decode_rows) and draws
every row of it with poot.models.sampling's host sampler (the same algorithm and seeded
draws as the step graph's). A request with a grammar or a `logit_bias` (`response_format`,
forced tool calls) and no log-probabilities does not: its decode steps draw in the graph
after its bias and under the grammar's token mask (the "masked" mode of
poot.models.sample_graph), and the host only fills the slots and hands the matcher the
token drawn (`drawn`). The host applies the bias and the mask itself where it has the
logits anyway: a prompt's first token (from the prefill's logits), an image request's
steps, and a step that reads the logits back for another row. Per sequence, in this order:

1. `logit_bias` is added to the named ids;
2. the grammar's token mask (poot.serve.grammar) sets every id it does not allow to -inf;
3. the sampler draws from the result (its repetition penalty and temperature included);
4. the log-probabilities reported are log-softmax of the logits of 2, before the penalty
   and the temperature: the model's distribution as the request constrained it.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot.models.sample_graph import BIAS_IDS


class LogitRule:
    """One sequence's bias, grammar and log-probability report."""

    def __init__(self, tokenizer, *, bias: Mapping[int, float] | None = None,
                 constraint=None, top: int | None = None):
        """`top`: None for no log-probabilities, else how many alternatives each token
        reports (0: the chosen token's only)."""
        self.tokenizer = tokenizer
        self.bias = None
        if bias:
            self.bias = (np.fromiter(bias, np.int64, len(bias)),
                         np.fromiter(bias.values(), np.float32, len(bias)))
        self.constraint, self.top = constraint, top

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The logits the sampler sees (steps 1 and 2)."""
        z = np.array(logits, np.float32)
        if self.bias is not None:
            ids, values = self.bias
            keep = ids < z.size
            z[ids[keep]] += values[keep]
        if self.constraint is not None:
            self.constraint.mask(z)
        return z

    @property
    def host(self) -> bool:
        """The rule needs the step's logits on the host (log-probabilities, or a bias too
        wide for the step graph's slot); a grammar and a bias are applied in the graph."""
        return self.top is not None or (self.bias is not None and
                                        self.bias[0].size > BIAS_IDS)

    def drawn(self, token: int) -> None:
        """The step graph drew `token` after the bias and under the grammar's mask: the
        grammar takes it."""
        if self.host:
            raise ValueError("a rule with log-probabilities or a wide bias draws on the host")
        if self.constraint is not None:
            self.constraint.accept(token)

    def chosen(self, z: np.ndarray, token: int) -> dict | None:
        """After the draw: the grammar takes the token; the token's log-probability entry
        (OpenAI's chat shape), or None when none is asked for."""
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.top is None:
            return None
        finite = np.isfinite(z)
        m = z[finite].max()
        lse = m + np.log(np.exp(z[finite] - m, dtype=np.float64).sum())
        out = self.entry(token, float(z[token] - lse))
        if self.top:
            k = min(self.top, int(finite.sum()))
            best = np.argpartition(-np.where(finite, z, -np.inf), k - 1)[:k]
            best = best[np.lexsort((best, -z[best]))]
            out["top_logprobs"] = [self.entry(int(i), float(z[i] - lse)) for i in best]
        else:
            out["top_logprobs"] = []
        return out

    def entry(self, token: int, logprob: float) -> dict:
        if token >= len(self.tokenizer.token_bytes):
            # a row of the model's padded vocabulary that the tokenizer has no text for
            return {"token": "", "logprob": max(logprob, -9999.0), "bytes": []}
        raw = self.tokenizer.token_bytes[token]
        text = self.tokenizer.tokens[token] if token in self.tokenizer.special_ids else \
            raw.decode("utf-8", errors="replace")
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(raw)}

    @property
    def done(self) -> bool:
        """The grammar is complete and allows no more tokens."""
        return self.constraint is not None and self.constraint.done
