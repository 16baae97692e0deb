"""Speculative decoding: propose several tokens cheaply, score them all in one target step.

A decode step of one sequence reads every weight to make one token; a verification step
(Session.verify: the prefill machinery at a small width, the head on every row) reads them
once to score a proposal d1..dk after the sequence's next input token x: row 0's logits
judge d1, row i's judge d(i+1), row k's give one more token. The longest accepted prefix
is kept, the next token comes from the row where the proposal failed (or the last row),
and the KV positions of the rejected tokens are dropped (Session.rollback). So a step
yields 1 to k+1 tokens.

The acceptance rule is the standard rejection-sampling one, which makes the output the
target's distribution whatever the proposal: with p the target sampler's distribution at
a row (Sampler.distribution, penalty and all) and q the proposer's, d is accepted with
probability min(1, p(d) / q(d)); on rejection the token is drawn from max(0, p - q),
normalized. A greedy target has a one-hot p, so it keeps exactly the tokens its own
argmax would pick: the text is the same as without speculation. Prompt lookup proposes
deterministically (q a point mass at d): d is accepted with probability p(d), and a
rejection draws from p without d. Random numbers come from the sampler's seed and draw
counter (poot.models.counter_rng), so a seeded run repeats, though it is not the text the
same seed gives without speculation.

Proposers:
- `PromptLookup`: the tokens that followed the latest earlier occurrence of the longest
  n-gram (up to `ngram`) ending the text so far (prompt and answer): free to propose, it
  gains where the answer repeats its input (editing, summarizing, code).
- `DraftModel`: a smaller model sharing the tokenizer, decoding its own KV cache on the
  same backend; Model.self_draft(n) is the target's own first n layers and its head
  (self-speculation: no second checkpoint).

`AdaptiveK` picks each step's k from the measured acceptance rate; k = 0 runs a plain
decode step, so a sequence whose proposals fail stops paying for them.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass

import numpy as np

from poot.errors import BindError, RequestError

#: the most tokens a verification step proposes unless told (`--draft-tokens`)
DRAFT_TOKENS = 7
#: the verification step's cost per proposed token, in plain decode steps (AdaptiveK's
#: model of a step: reading the weights once dominates, each extra row adds this)
ROW_COST = 0.1
#: plain steps a sequence starts with (`tokens`), timed as one run, queued ahead where the
#: session can, as a long run of plain decoding would be
CALIBRATION = 3


@dataclass(frozen=True)
class Spec:
    """A parsed `--speculate` value: kind "lookup", "draft" (arg: a model) or "self"
    (arg: the layers of the draft)."""

    kind: str
    arg: str | int | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"


def parse(text: str) -> Spec:
    """`lookup`, `draft:MODEL` or `self:N`; a RequestError names what is wrong."""
    kind, _, arg = str(text).partition(":")
    if kind == "lookup" and not arg:
        return Spec("lookup")
    if kind == "draft" and arg:
        return Spec("draft", arg)
    if kind == "self" and arg.isdigit() and int(arg) >= 1:
        return Spec("self", int(arg))
    raise RequestError(f"--speculate takes lookup, draft:MODEL or self:N (N >= 1 layers of "
                       f"the model as its own draft), got {text!r}")


def check_draft_tokens(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 32:
        raise RequestError(f"--draft-tokens must be a whole number in 1..32, got {k!r}")
    return k


class PromptLookup:
    """Propose the continuation of the latest earlier match of the text's last n-gram."""

    #: what proposing a token costs, in target decode steps
    cost = 0.0

    def __init__(self, ngram: int = 3):
        self.ngram = ngram
        #: AdaptiveK's measured step times with this proposer (`tokens`), kept for the
        #: sequences after: a later one starts from what earlier ones measured
        self.step_seconds: dict = {}

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def close(self) -> None:
        pass

    def propose(self, history: Sequence[int], k: int, sampler) -> tuple[list[int], None]:
        """Up to k tokens (none where no n-gram recurs); q None: a point mass at each."""
        h = np.asarray(history, np.int64)
        last = len(h) - 1
        # where an earlier token is the last one: the ends of the candidate matches, which
        # each longer n-gram only narrows (one pass over the text, not one per n)
        ends = np.flatnonzero(h[:-1] == h[-1]) if last > 0 else np.empty(0, np.int64)
        for n in range(min(self.ngram, last), 0, -1):
            hits = ends[ends >= n - 1]
            for j in range(1, n):
                hits = hits[h[hits - j] == h[last - j]]
            if hits.size:
                start = int(hits[-1]) + 1
                return [int(t) for t in h[start: start + k]], None
        return [], None


class DraftModel:
    """Proposals from a draft model's own decoding (its sampler's settings, its own seed);
    its KV cache follows the target's text, rolled back where the target rejected."""

    #: new tokens up to this many are fed one decode step each, more through prefill
    FEW = 4

    def __init__(self, draft, target_config=None):
        self.model = draft
        self.session = draft.session()
        self.seq = None
        #: as PromptLookup's
        self.step_seconds: dict = {}
        self.fed: list[int] = []
        #: what proposing a token costs, in target decode steps: the share of the
        #: target's weights the draft reads
        self.cost = proposal_cost(draft.config, target_config) if target_config else 0.0

    def start(self, prompt: Sequence[int]) -> None:
        """Open the draft's sequence and feed it the prompt but its last token (whose
        logits the first proposal reads)."""
        self.seq = object()
        self.session.open(self.seq)
        self.fed = [int(t) for t in prompt[:-1]]
        if self.fed:
            self.session.prefill(self.seq, self.fed)

    def close(self) -> None:
        if self.seq is not None:
            self.session.close(self.seq)
            self.seq = None

    def propose(self, history: Sequence[int], k: int, sampler):
        """k tokens drawn by the draft after `history`, and the distribution each was
        drawn from (None for a greedy sampler: one-hot). A greedy sampler without a
        penalty decodes them with the argmax in the graph, each step queued ahead where
        the draft's session can (Model._following): only the ids come back."""
        same = 0
        limit = min(len(self.fed), len(history) - 1)   # the last token's logits are needed
        while same < limit and self.fed[same] == history[same]:
            same += 1
        self.session.rollback(self.seq, len(self.fed) - same)
        room = self.model.config.max_seq - same
        new = list(history[same:])
        if len(new) + k > room:
            self.fed = self.fed[:same]
            return [], None
        mode = self.model.sample_mode([sampler])
        if mode == "argmax":
            if len(new) > 1:
                self._feed(new[:-1])
            with closing(self.model._following(self.session, self.seq, int(new[-1]), sampler,
                                               [], mode, k)) as run:
                tokens = [int(t) for t in run]
            self.fed = self.fed[:same] + [int(t) for t in new] + tokens[:-1]
            return tokens, None
        logits = self._feed(new)
        self.fed = self.fed[:same] + [int(t) for t in new]
        tokens, qs = [], []
        for i in range(k):
            tok, q = draft_draw(logits, sampler, self.fed)
            tokens.append(tok)
            if q is not None:
                qs.append(q)
            if i + 1 < k:
                logits = self.session.decode({self.seq: tokens[-1]})[self.seq]
                self.fed.append(tokens[-1])
        return tokens, (qs if qs else None)

    def _feed(self, new: Sequence[int]) -> np.ndarray:
        """Feed the draft tokens it has not seen; the logits after the last."""
        if len(new) > self.FEW:
            return self.session.prefill(self.seq, new)
        for t in new:
            logits = self.session.decode({self.seq: int(t)})[self.seq]
        return logits


def draft_draw(logits: np.ndarray, sampler, history: Sequence[int]):
    """A draft model's next proposed token after `history` from its `logits`, and the
    distribution it was drawn from (None for a greedy target sampler: its argmax, one-hot):
    the target's settings under a seed of the draft's own."""
    if sampler.greedy:
        return int(np.argmax(sampler.distribution(logits, history))), None
    draft = _draft_sampler(sampler)
    q = draft.distribution(logits, history)
    return _draw(q, draft), q


def proposal_cost(draft_config, target_config) -> float:
    """What a draft model proposing a token costs, in target decode steps: the share of
    the target's weights it reads."""
    return _weights(draft_config) / _weights(target_config)


def _weights(c) -> int:
    """Weights a decode step of config `c` reads (its projections and head)."""
    attn = c.dim * c.head_dim * (2 * c.heads + 2 * c.kv_heads)
    return c.layers * (attn + 3 * c.dim * (c.expert_ffn * c.experts_used or c.ffn)) + \
        c.vocab * c.dim


def _draft_sampler(sampler):
    """The draft's sampler: the target's settings under a seed of its own."""
    from poot.models.sampling import Sampler

    d = getattr(sampler, "_draft", None)
    if d is None:
        d = Sampler(sampler.temperature, sampler.top_k, sampler.top_p,
                    sampler.repetition_penalty, (sampler.seed * 0x9E3779B97F4A7C15 + 1)
                    % 2 ** 64)
        sampler._draft = d
    return d


def check_self_draft(config, layers: int) -> None:
    """Refuse a self-draft of no layers or of every layer of `config`."""
    if not 1 <= layers < config.layers:
        raise RequestError(f"self:{layers}: a self-draft takes 1 to {config.layers - 1} of "
                           f"the model's {config.layers} layers")


def check_shared_tokenizer(target, draft, name: str, target_name: str = "target") -> None:
    """Refuse a draft model whose tokenizer is not the target's (`target_name`'s)."""
    probe = "The quick brown fox, 42 times: naïve café!"
    if target.vocab_size != draft.vocab_size or target.encode(probe) != draft.encode(probe):
        raise RequestError(f"draft model {name} does not share the target's tokenizer "
                           f"({name}: {draft.vocab_size} tokens, {target_name}: "
                           f"{target.vocab_size})")


def check_rollback(config, kv: str) -> None:
    """Refuse a target or draft model whose KV cache cannot drop rejected tokens."""
    if any(config.sliding) and kv == "dense":
        raise BindError("a model with sliding-window layers keeps a ring in a dense KV "
                        "cache, which cannot drop rejected tokens; load it with kv='paged' "
                        "(--kv paged) to speculate")


def widths(most: int) -> list[int]:
    """The verification plans' widths for proposals of up to `most` tokens: powers of two
    below most + 1, and most + 1 (a proposal of k runs in the smallest that holds k + 1)."""
    out = [2]
    while out[-1] * 2 < most + 1:
        out.append(out[-1] * 2)
    return sorted({*(w for w in out if w < most + 1), most + 1})


class AdaptiveK:
    """Each step's proposal length from the acceptance rate measured so far.

    With acceptance rate a per token, a step proposing k yields (1 - a^(k+1)) / (1 - a)
    tokens on average and costs c(k) plain decode steps; k is the best ratio, 0 where none
    beats a plain step. c(k) is measured as the steps run (`timed`: the verification step
    of k's width and the proposer's time per token, over the fastest plain step's time; a
    width not yet measured is interpolated from those that are); until both are, it is
    1 + (ROW_COST + cost) * k (`cost`: the proposer's per token). The first
    TRIALS steps propose at least 2 tokens, to measure a, unless the costs measured by
    then leave no k worth proposing. A free proposer (prompt lookup) probes with k = 1
    after a run of k = 0 as long as `backoff` probes cost (so where a verification costs
    several plain steps, probes come as much rarer), each failed probe doubling the run; a
    costly one (a draft model, whose probe would also feed it every token of the run it
    skipped) stays off for the rest of the sequence. So a sequence that gains nothing
    stops paying."""

    TRIALS = 2

    def __init__(self, most: int, cost: float = 0.0, rate: float = 0.6,
                 smoothing: float = 0.3):
        self.most, self.rate, self.smoothing = most, rate, smoothing
        self.cost = cost
        self.free = cost == 0
        self.sizes = widths(most)
        #: seconds, smoothed: "plain" a plain step, "propose" proposing one token, and each
        #: width's verification step
        self.seconds: dict = {}
        self.trials = self.TRIALS
        self.idle, self.backoff, self.off = 0, 2, False

    def k(self) -> int:
        if self.trials:
            self.trials -= 1
            best = self._best()
            if best or not self._measured():
                return max(best, min(2, self.most))
            self.trials = 0
        if self.off:
            return 0
        if self.idle:
            self.idle -= 1
            return 0 if self.idle else 1      # the run's last step probes
        k = self._best()
        if k:
            self.backoff = 2
            return k
        self.off = not self.free
        self.idle = math.ceil(self.backoff * max(1.0, self.step_cost(1)))
        self.backoff = min(self.backoff * 2, 256)
        return 0

    def _measured(self) -> bool:
        """Whether a plain step and some verification width have been timed."""
        return "plain" in self.seconds and any(w in self.seconds for w in self.sizes)

    def plain_run(self, left: int) -> int:
        """After k() gave 0: how many plain steps to take now (of `left` tokens to go), the
        rest of the run of k = 0 up to its probe, or all when off."""
        if self.off:
            return left
        n = max(self.idle, 1)
        self.idle = 1 if self.idle else 0     # what k() gives next: the probe
        return min(n, left)

    def timed(self, what, seconds: float) -> None:
        """A measured step: "plain", "propose" (per token) or a verification width, each
        costed at the fastest time measured. A short run of plain steps between
        verifications waits for the verification before it (a device that queues steps
        ahead cannot run ahead of it), so a typical plain time would flatter every width
        against the plain decoding it replaces; and a shared machine's load only ever adds
        time, so the fastest of each is what compares alike."""
        self.seconds[what] = min(self.seconds.get(what, seconds), seconds)

    def step_cost(self, k: int, known: dict | None = None) -> float:
        """c(k): a step proposing k tokens, in plain decode steps (`known`: _known()'s,
        where the caller costs several k)."""
        if k == 0:
            return 1.0
        t = self.seconds
        plain = t.get("plain")
        width = next(w for w in self.sizes if w > k)
        propose = t["propose"] / plain if plain and "propose" in t else self.cost
        return self._verify_cost(width, k, self._known() if known is None else known) + \
            propose * k

    def _known(self) -> dict:
        """The measured verification widths' costs, in plain steps."""
        plain = self.seconds.get("plain")
        return {w: self.seconds[w] / plain for w in self.sizes if plain and w in self.seconds}

    def _verify_cost(self, width: int, k: int, known: dict) -> float:
        """A verification step of `width`, in plain steps: measured (`known`), else
        interpolated between the measured widths around it (a plain step being width 1),
        else the prior 1 + ROW_COST * k, never below the widest measured width under it."""
        if width in known:
            return known[width]
        lo = max((w for w in known if w < width), default=1)
        lo_cost = known.get(lo, 1.0)
        hi = min((w for w in known if w > width), default=None)
        if hi is None:
            return max(lo_cost, 1 + ROW_COST * k)
        return lo_cost + (known[hi] - lo_cost) * (width - lo) / (hi - lo)

    def _best(self) -> int:
        a = min(self.rate, 0.999)
        known = self._known()
        gain = [(1 - a ** (k + 1)) / (1 - a) / self.step_cost(k, known)
                for k in range(self.most + 1)]
        best = max(range(self.most + 1), key=lambda k: (gain[k], -k))
        return best if gain[best] > 1.02 else 0

    def update(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.rate += self.smoothing * (accepted / proposed - self.rate)


def _draw(weights: np.ndarray, sampler) -> int:
    """One id drawn from `weights` (non-negative, not all zero) with the sampler's next
    draw (Gumbel-max over the counter generator's uniforms)."""
    from poot.models import counter_rng

    u = counter_rng.uniforms(sampler.seed, sampler.next_draw(), weights.size)
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.where(weights > 0, np.log(weights) - np.log(-np.log(u)),
                                      -np.inf)))


def _uniform(sampler) -> float:
    from poot.models import counter_rng

    return float(counter_rng.uniforms(sampler.seed, sampler.next_draw(), 1)[0])


def accept(logits: np.ndarray, drafts: Sequence[int], qs, sampler,
           history: Sequence[int]) -> list[int]:
    """The tokens a verification step yields: the accepted prefix of `drafts` and one
    more, from rows `logits` [len(drafts) + 1, vocab]; `qs` the proposal's distributions
    (None: a point mass at each draft); `history` the text up to row 0's input."""
    out: list[int] = []
    hist = list(history)
    for i, d in enumerate(drafts):
        p = sampler.distribution(logits[i], hist)
        if sampler.greedy:
            if p[d] == 1.0:
                out.append(d)
                hist.append(d)
                continue
            out.append(int(np.argmax(p)))
            return out
        q = qs[i] if qs is not None else None
        qd = 1.0 if q is None else float(q[d]) if d < q.size else 0.0
        if qd > 0 and _uniform(sampler) < min(1.0, float(p[d]) / qd):
            out.append(d)
            hist.append(d)
            continue
        rest = p.copy()
        if q is None:
            rest[d] = 0.0
        else:
            n = min(q.size, rest.size)
            rest[:n] = np.maximum(rest[:n] - q[:n], 0.0)
        if not rest.any():            # p == q: any draw from p is exact
            rest = p
        out.append(_draw(rest, sampler))
        return out
    out.append(sampler.sample(logits[len(drafts)], hist))
    return out


def verify_sample(mode: str | None) -> str | None:
    """What a verification step of a sequence decoding in `mode` (its sampling mode in the
    graph, None on the host) reads back: "argmax", each row's next token id, for a greedy
    sequence without a penalty, whose accepted tokens are exactly those argmaxes
    (`accept_ids`); else None, every row's logits, for the rejection rule (`accept`)."""
    return "argmax" if mode == "argmax" else None


def accept_ids(ids: Sequence[int], drafts: Sequence[int]) -> list[int]:
    """`accept` for a greedy sampler without a penalty, from each row's argmax `ids`
    [len(drafts) + 1]: the drafts up to the first its row does not pick, and that row's
    pick (or the last row's, all accepted)."""
    out: list[int] = []
    for d, t in zip(drafts, ids):
        out.append(int(t))
        if int(t) != d:
            return out
    out.append(int(ids[len(drafts)]))
    return out


def tokens(model, session, seq, tok: int, sampler, history: list, mode: str | None,
           count: int, propose, most: int, stats) -> Iterator[int]:
    """The `count` tokens after `tok` of one open sequence (Model._following's contract:
    the caller extends `history` by each token before asking for the next), verifying
    proposals of up to `most` tokens from `propose` (a PromptLookup or DraftModel, started
    on the prompt); `stats` (poot.models.runner.Stats) counts the proposed and accepted
    tokens. A greedy sequence weighs the step times the proposer's earlier sequences
    measured (`step_seconds`), and the first one's first CALIBRATION tokens are plain
    steps: AdaptiveK weighs every verification width against their time, and has no other
    measure of a plain step while it keeps proposing. A step whose plan had not run before
    is not timed (Session.ran)."""
    from poot.runtime.session import scoring

    sizes = widths(most)
    k_of = AdaptiveK(most, propose.cost)
    # a sampled sequence's draws follow its proposal lengths, which must not follow the step
    # times, or a seed would not repeat its text: it weighs the fixed cost model alone
    timing = sampler.greedy
    by_ids = verify_sample(mode)
    if timing:
        k_of.seconds = propose.step_seconds
    stats.step_seconds = k_of.seconds
    left = count
    while left > 0:
        room = session.capacity - session.length(seq)
        calibrating = timing and "plain" not in k_of.seconds
        k = 0 if calibrating else min(k_of.k(), left - 1, sizes[-1] - 1)
        while k and next(w for w in sizes if w > k) > room:
            k -= 1
        if k == 0:      # a run of plain steps, one queued ahead where the session can
            n = min(CALIBRATION, left) if calibrating else k_of.plain_run(left)
            warm = session.ran(1, 1, mode)
            t0 = time.perf_counter()
            with closing(model._following(session, seq, tok, sampler, history, mode,
                                          n)) as run:
                for t in run:
                    left -= 1
                    tok = t
                    yield t
            if timing and warm:
                k_of.timed("plain", (time.perf_counter() - t0) / n)
            continue
        t0 = time.perf_counter()
        drafts, qs = propose.propose(history, k, sampler)
        t1 = time.perf_counter()
        if not drafts:
            out = [model._next_tokens(session, {seq: tok}, {seq: (sampler, history)},
                                      mode)[seq]]
        else:
            width = next(w for w in sizes if w > len(drafts))
            warm = session.ran(width, 1, scoring(by_ids))
            if by_ids:
                out = accept_ids(session.verify(seq, [tok, *drafts], width, by_ids), drafts)
            else:
                out = accept(session.verify(seq, [tok, *drafts], width), drafts, qs, sampler,
                             history)
            session.rollback(seq, len(drafts) + 1 - len(out))
            if timing:
                k_of.timed("propose", (t1 - t0) / len(drafts))
                if warm:    # a first run may record the plan: not the step's time
                    k_of.timed(width, time.perf_counter() - t1)
            k_of.update(len(drafts), len(out) - 1)
            stats.proposed += len(drafts)
            stats.accepted += len(out) - 1
            stats.verified += 1
        for t in out:
            left -= 1
            yield t
        tok = out[-1]


__all__ = ["AdaptiveK", "DraftModel", "PromptLookup", "Spec", "accept", "accept_ids", "parse",
           "tokens", "verify_sample", "widths"]
