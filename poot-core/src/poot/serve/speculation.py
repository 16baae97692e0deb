"""Speculative decoding in `poot serve`: each request's proposer and its proposal length.

The server speculates by prompt lookup (`poot serve --speculate lookup`: a proposer that
costs nothing and needs no model of its own) or with a draft model (`draft:MODEL`, or
`self:N`, the served model's first N layers and its head: `DraftBatch`, one draft sequence
per speculating request, every proposing row drafted in the same batched draft steps);
either way every speculating sequence of the batch is verified in one step
(Session.verify_rows). A request may turn it off (`"speculate": false`), and one that gives
OpenAI's Predicted Outputs (`prediction`) is proposed from that text first (`Prediction`),
on any server. poot.models.speculate holds the verification's acceptance rule and
AdaptiveK; this module holds one request's share of them.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from poot.models.sample_graph import mode_for
from poot.models.sampling import PENALTY_WINDOW
from poot.models.speculate import AdaptiveK, PromptLookup, Spec, draft_draw, proposal_cost


class Prediction:
    """Proposals from a text the answer is expected to repeat (an edit's original): the
    tokens after the text so far's last n-gram in the prediction, its earliest match at or
    after where the last proposal ended (the answer walks through the prediction in
    order), else its latest; where it has no match, prompt lookup over the text so far."""

    cost = 0.0

    def __init__(self, ids: Sequence[int], ngram: int = 3):
        self.ids = np.asarray(ids, np.int64)
        self.ngram = ngram
        self.cursor = 0
        self.lookup = PromptLookup(ngram)

    def propose(self, history: Sequence[int], k: int, sampler) -> tuple[list[int], None]:
        h = np.asarray(history, np.int64)
        for n in range(min(self.ngram, len(h), len(self.ids)), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(self.ids, n)
            ends = np.flatnonzero((windows == h[len(h) - n:]).all(axis=1)) + n
            ends = ends[ends < len(self.ids)]
            if ends.size:
                later = ends[ends >= self.cursor]
                end = int(later[0] if later.size else ends[-1])
                self.cursor = end
                return [int(t) for t in self.ids[end: end + k]], None
        return self.lookup.propose(history, k, sampler)


class DraftBatch:
    """The draft model of `poot serve --speculate draft:MODEL|self:N`, loaded beside the
    served model on its backend, with a paged KV pool of its own (room for `batch` whole
    sequences, so a draft never waits for blocks) and one draft sequence per speculating
    request, opened at its first proposal and closed with the request, or once its
    AdaptiveK has stopped proposing for good (`close`).

    A draft sequence holds a prefix of its request's text and the proposal it last made.
    Before the next proposal (`propose_rows`) each is rolled back to where it agrees with
    the text (the prefix the target accepted: Session.rollback) and fed what it has not
    seen: a new prompt or a run of plain steps through the draft's prefill plans, the last
    token or two through its decode steps; then one draft decode step per proposed
    position draws the next token of every row still proposing, all rows at once, and the
    host draws each row's token from its logits (poot.models.speculate.draft_draw: the
    target's argmax rule when greedy, else its settings under the draft's seed, with the
    distribution the rejection rule needs); a step whose rows are all greedy without a
    penalty takes the argmax in the graph and reads back only the ids. The draft's pool keeps no prefix cache: its
    steps write positions that a verification may reject, and a cached block cannot be
    rolled back."""

    def __init__(self, model, spec: Spec, batches: Sequence[int]):
        draft = model.self_draft(spec.arg) if spec.kind == "self" else \
            model.draft_model(spec.arg)
        self.spec, self.model = spec, draft
        #: what proposing a token costs, in target decode steps (AdaptiveK's fixed model)
        self.cost = proposal_cost(draft.config, model.config)
        self.session = draft.session("paged", batch=batches[-1], decode_batches=batches,
                                     prefill_batches=batches)
        self.fed: dict = {}       # sequence -> the token ids in its draft KV
        self.known: dict = {}     # sequence -> how many of them are its text's (the rest:
        #                           its last proposal's)
        #: draft_released: sequences closed before their request ended, their
        #: speculation spent
        self.counters = dict(draft_steps=0, draft_step_s=0.0, draft_released=0)

    def share_weights(self, served) -> None:
        """Bind the draft's plans to the served session's weight cache, where the draft has
        made no plan yet and the served session has one: the cache keys a weight by its
        bytes, so what the draft shares with the served model (all of a self-draft's
        layers and head) is on the device once."""
        if self.session.weights is None and served.weights is not None:
            self.session.weights = served.weights

    def plans(self) -> list[tuple[int, int, str | None]]:
        """The draft's (tokens, batch, sample) plans: a decode step, its argmax variant
        (greedy rows' steps) and a prefill chunk per batch size."""
        s = self.session
        argmax = ("argmax",) if s.make_sampled is not None else ()
        return [(t, b, None) for b in s.decode_batches for t in (1, s.prefill_tokens)] + \
            [(1, b, m) for b in s.decode_batches for m in argmax]

    def fits(self, length: int, k: int) -> bool:
        """Whether a text of `length` tokens has room for a proposal of k in the draft's
        context (it holds the text and all but the last proposed token)."""
        return length + k - 1 <= self.session.capacity

    def close(self, seq, spent: bool = False) -> None:
        """The request ended or left (or, `spent`, will propose no more): its draft blocks
        go back to the pool."""
        if self.fed.pop(seq, None) is not None:
            self.known.pop(seq)
            self.session.close(seq)
            self.counters["draft_released"] += spent

    def propose_rows(self, rows: Mapping) -> dict:
        """`rows`: sequence -> (its text so far, k, its sampler); each sequence's k proposed
        tokens and the draft's distribution of each (None where the sampler is greedy)."""
        s = self.session
        t0 = time.perf_counter()
        unseen = {}
        for seq, (history, _, _) in rows.items():
            if seq not in self.fed:
                s.open(seq)
                self.fed[seq], self.known[seq] = [], 0
            fed = self.fed[seq]
            # the last token's logits start the proposal: it is always fed now
            limit = min(len(fed), len(history) - 1)
            same = min(self.known[seq], limit)
            while same < limit and fed[same] == history[same]:
                same += 1
            s.rollback(seq, len(fed) - same)
            del fed[same:]
            unseen[seq] = list(history[same:])
        self._catch_up(unseen)
        tokens = {seq: [] for seq in rows}
        dists = {seq: [] for seq in rows}
        feed = {seq: unseen[seq][0] for seq in rows}
        # every row greedy without a penalty: the draft's steps read back only argmax ids
        argmax = s.make_sampled is not None and \
            mode_for([sampler for _, _, sampler in rows.values()]) == "argmax"
        for i in range(max(k for _, k, _ in rows.values())):
            live = [seq for seq, (_, k, _) in rows.items() if k > i]
            step = {seq: feed[seq] for seq in live}
            if argmax:
                out = s.decode_sampled(step, "argmax", lambda b: {})
            else:
                out = s.decode_rows(step)
            self.counters["draft_steps"] += 1
            for seq, row in zip(live, out, strict=True):
                history, _, sampler = rows[seq]
                self.fed[seq].append(feed[seq])
                tok, q = (int(row), None) if argmax else \
                    draft_draw(row, sampler, [*history[-PENALTY_WINDOW:], *tokens[seq]])
                tokens[seq].append(tok)
                if q is not None:
                    dists[seq].append(q)
                feed[seq] = tok
        for seq, (history, _, _) in rows.items():
            self.known[seq] = len(history)
        self.counters["draft_step_s"] += time.perf_counter() - t0
        return {seq: (tokens[seq], dists[seq] or None) for seq in rows}

    def _catch_up(self, unseen: dict) -> None:
        """Feed each sequence all but the last of its `unseen` tokens (trimmed in place):
        runs of more than one through prefill chunks, every such sequence in one step,
        single tokens (and chunks that would pass the context's end) through decode
        steps."""
        s = self.session
        wide = s.prefill_tokens
        while True:
            behind = [seq for seq, t in unseen.items() if len(t) > 1]
            if not behind:
                return
            step = {seq: unseen[seq][:-1][:wide] for seq in behind
                    if len(unseen[seq]) > 2 and s.length(seq) + wide <= s.capacity}
            if step:
                s.prefill_rows(step, wide)
            else:
                step = {seq: unseen[seq][:1] for seq in behind}
                s.decode({seq: t[0] for seq, t in step.items()})
            self.counters["draft_steps"] += 1
            for seq, t in step.items():
                self.fed[seq].extend(t)
                del unseen[seq][:len(t)]

    def stats(self) -> dict:
        b = self.session.blocks
        return {"draft_model": self.model.checkpoint.path.name if self.spec.kind == "draft"
                else str(self.spec),
                "draft_layers": self.model.config.layers,
                "draft_sequences": len(self.fed),
                "draft_pool_blocks": b.pool_slots // b.block, "draft_free_blocks": b.free,
                **{k: round(v, 6) if isinstance(v, float) else v
                   for k, v in self.counters.items()}}


class Speculation:
    """One sequence's speculation: its proposer, its AdaptiveK (the step costs it weighs:
    `seconds`, the engine's measured ones, shared, or an empty dict never timed for the
    fixed cost model), the plain steps left before it proposes again, and its tally."""

    def __init__(self, proposer, most: int, seconds: dict):
        self.proposer = proposer
        self.k_of = AdaptiveK(most, proposer.cost)
        self.k_of.seconds = seconds
        self.plain = 0            # plain decode steps to take before the next proposal
        self.k = 0                # this turn's proposal length (0: a plain step)
        self.proposed = self.accepted = 0

    def wants(self, left: int) -> bool:
        """Decide this turn's proposal length for a sequence with `left` tokens to go; a
        proposal of k writes k + 1 positions, so k < left keeps it inside the blocks its
        request was promised. False: a plain decode step this turn."""
        self.k = 0
        if self.plain:
            self.plain -= 1
            return False
        k = min(self.k_of.k(), left - 1)
        if k <= 0:
            # the rest of the run of plain steps AdaptiveK asks for; this turn is one
            self.plain = max(self.k_of.plain_run(max(left, 1)) - 1, 0)
            return False
        self.k = k
        return True

    def verified(self, proposed: int, accepted: int) -> None:
        self.k_of.update(proposed, accepted)
        self.proposed += proposed
        self.accepted += accepted
