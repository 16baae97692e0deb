"""Speculative decoding in `poot serve`: each request's proposer and its proposal length.

The server speculates by prompt lookup only (`poot serve --speculate lookup`): a proposer
costs nothing and needs no model of its own, so every speculating sequence of the batch is
verified in one step (Session.verify_rows). A request may turn it off (`"speculate":
false`), and one that gives OpenAI's Predicted Outputs (`prediction`) is proposed from that
text first (`Prediction`), on any server. poot.models.speculate holds the verification's
acceptance rule and AdaptiveK; this module holds one request's share of them.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from poot.models.speculate import AdaptiveK, PromptLookup


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
