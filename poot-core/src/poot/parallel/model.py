"""One rank of a tensor-parallel model run (`poot run --tp N`, `poot serve --tp N`).

`TensorParallel` hangs on a loaded `poot.models.runner.Model` (its `tp`): every step graph
the model traces is cut to this rank's graph (poot.parallel.megatron) and compiled with the
rank's communicator, its consts are views of the checkpoint's arrays, and its plans bind to
a runtime whose communicator is the rank's. Every rank runs the same generation loop: the
logits are gathered on every rank, so each samples the same token (sampling takes one seed,
the same on every rank).
"""
from __future__ import annotations

from collections.abc import Mapping

from poot.parallel.megatron import shard_step
from poot.parallel.shard import RankConsts


class TensorParallel:
    def __init__(self, model, group, rank: int):
        self.rank, self.ranks = rank, group.ranks
        model.device = rank_device(model.backend, group, rank)
        self.communicator = group.member(rank, model.device)
        self.runtime = model.backend.runtime(model.device)
        self.runtime.communicator = self.communicator
        self.slices: dict = {}
        model.tp = self
        # the head is vocabulary-parallel: a rank holds part of each logits row, and the
        # in-graph sampler needs whole rows, so the host samples the gathered logits
        model.device_sampling = False

    def rank_graph(self, step):
        (rg,) = shard_step(step, self.ranks, only=self.rank)
        self.slices.update(rg.slices)
        return rg.graph

    def consts(self, base: Mapping) -> RankConsts:
        return RankConsts(base, self.slices)


def rank_device(backend, group, rank: int):
    """The device of a rank: GPU `rank` where each rank is a process of its own, the
    backend's default device where the ranks are threads of one process (or there is no
    group)."""
    if group is None or not group.processes:
        return backend.default_device()
    return backend.probe()[rank]
