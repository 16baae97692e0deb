"""The expert pool: MoE experts paged into a device pool with fewer rows than experts.

Each MoE layer's three expert matrices (gate, up, down) live in a State buffer of `rows`
experts, `<layer>.ffn_*_exps.pool` [rows, N, K], which the step reads and leaves unchanged.
The `expert_map` slot (role `moe.expert_map`, declared by this module through the
`poot_slot_roles` hook) [layers * experts] sends each expert id to its pool row, and every
expert matmul is an IndexedMatMul over the pool at the mapped row. The host keeps the whole
stacks (memory-mapped or in host memory) and pages experts in, least recently used out.

Routing is known only inside the step (layer i's router reads layer i-1's output), so the
host cannot know the experts a step needs before it runs. The choice here: run the step,
then check. Each layer's routed expert ids leave the step as a witness,
`blk.<i>.expert_ids`; if every real token's experts were resident, the step's outputs are
exact and it is done. Otherwise the host pages the missing experts in (per layer, evicting
only experts this step does not route to) and runs the same step again with the same slots.
A re-run is exact because a step is a function of its slots and of the state before it: the
KV writes of the first run land on the same positions and are overwritten before anything
reads them (hence a ring cache of sliding-window layers, which a step reads before it
writes, is refused). The first layer that missed is right after one re-run, so a step runs
at most layers + 1 times; in steady decode, when routing repeats, it runs once. Splitting
the step per layer would page with no wasted work but would cut every plan into one plan
per layer and a host round trip between each.

Non-resident experts map to row 0: a padding row (or a token of a run that will be redone)
computes with whatever row 0 holds, which is never read as an answer. One step must fit:
its real tokens route to at most tokens x experts_used experts per layer, so a model with a
pool of `rows` takes prefill chunks of at most rows // experts_used tokens and batches of
at most that many sequences.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from poot import ops
from poot.contract import hookimpl
from poot.dtypes import DType
from poot.errors import CapacityError, CheckpointError, ConfigError, IRError
from poot.ir.types import SlotKind

OWNER = "poot.models.expert_pool"
#: the slot role of the expert -> pool row map
ROLE = "moe.expert_map"
SLOT = "expert_map"
MATRICES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@hookimpl
def poot_slot_roles():
    return [SlotKind(ROLE, DType.I32, 0, None, owner=OWNER)]


def map_role() -> SlotKind:
    """The `moe.expert_map` role, which must have been declared through the plugin hook."""
    from poot.plugin import manager

    role = manager().slot_roles().get(ROLE)
    if role is None:
        raise IRError(f"slot role {ROLE!r} is not declared: its owner {OWNER} is not a "
                      f"registered plugin, so no graph may take an expert map")
    return role


def pool_state(layer: int, matrix: str) -> str:
    return f"blk.{layer}.{matrix}.pool"


def ids_witness(layer: int) -> str:
    return f"blk.{layer}.expert_ids"


class ExpertPool:
    """How many experts of each layer are resident, and the expert shapes (checked)."""

    def __init__(self, config, weights, rows: int):
        c = config
        if not c.experts:
            raise ConfigError(f"--expert-pool needs a mixture of experts; {c.arch} has none",
                              key="expert_pool", value=rows)
        if isinstance(rows, bool) or not isinstance(rows, int) or \
                not c.experts_used <= rows <= c.experts:
            raise ConfigError(f"the expert pool holds {rows!r} experts per layer; it must hold "
                              f"{c.experts_used} to {c.experts} (experts_used to experts)",
                              key="expert_pool", value=rows)
        if any(c.sliding):
            raise ConfigError("the expert pool re-runs a step whose experts were not resident, "
                              "which a ring cache of sliding-window layers does not allow",
                              key="expert_pool", value=rows)
        self.config, self.weights, self.rows = c, weights, rows
        self.shapes: dict[str, tuple[int, int]] = {}
        for m in MATRICES:
            spec = weights.spec(f"blk.0.{m}.weight")
            if not hasattr(spec, "type"):
                raise CheckpointError(f"blk.0.{m}.weight is packed ({spec.weight.format}); the "
                                      f"expert pool pages dense experts only")
            self.shapes[m] = tuple(spec.type.shape[1:])

    @property
    def max_tokens(self) -> int:
        """Real tokens one step may hold: their experts always fit the pool."""
        return self.rows // self.config.experts_used

    def trace(self) -> TracedPool:
        """Inside a traced step: declare the map slot; the layers then read the pool."""
        return TracedPool(self)


class TracedPool:
    """The pool as one traced step sees it: the map slot and the pool states."""

    def __init__(self, pool: ExpertPool):
        c = pool.config
        self.pool = pool
        self.map = ops.slot(map_role(), (c.layers * c.experts,), SLOT, bound=pool.rows)

    def rows(self, layer: int, ids):
        """The pool row of each routed expert id [M] of `layer` (witnessed for the host)."""
        ops.witness(ids, ids_witness(layer))
        return ops.gather(self.map, ops.add(ids, layer * self.pool.config.experts), 0)

    def matrix(self, layer: int, matrix: str):
        """The pool of `matrix` as IndexedMatMul's [rows, K, N], unchanged by the step."""
        n, k = self.pool.shapes[matrix]
        st = ops.state((self.pool.rows, n, k), DType.F32, pool_state(layer, matrix))
        ops.state_update(st, st)
        return ops.transpose(st, (0, 2, 1))


class ExpertPager:
    """One session's pool residency: pages experts in around each step (LRU out)."""

    def __init__(self, pool: ExpertPool):
        c = pool.config
        self.pool = pool
        self.map = np.zeros((c.layers, c.experts), np.int32)
        #: per layer: resident expert -> pool row, least recently used first
        self.resident = [OrderedDict() for _ in range(c.layers)]
        self.counters = dict(steps=0, runs=0, paged=0, evicted=0)

    def __call__(self, ex, slots: dict, real: np.ndarray):
        c = self.pool.config
        for _ in range(c.layers + 1):
            out = ex.step({**slots, SLOT: self.map.reshape(-1)})
            self.counters["runs"] += 1
            missed = False
            for layer in range(c.layers):
                ids = out.witnesses[ids_witness(layer)].reshape(-1, c.experts_used)[real]
                need = list(dict.fromkeys(int(e) for e in ids.ravel()))
                missed |= self._page_in(ex, layer, need)
            if not missed:
                self.counters["steps"] += 1
                return out
        raise CapacityError(f"the expert pool of {self.pool.rows} rows did not settle in "
                            f"{c.layers + 1} runs of one step")

    def _page_in(self, ex, layer: int, need: list[int]) -> bool:
        """Make every expert of `need` resident in `layer`'s pool; True if any was not."""
        lru = self.resident[layer]
        missing = [e for e in need if e not in lru]
        for e in need:
            if e in lru:
                lru.move_to_end(e)
        if len(need) > self.pool.rows:
            raise CapacityError(f"one step routes layer {layer}'s tokens to {len(need)} "
                                f"experts; the pool holds {self.pool.rows}")
        keep = set(need)
        for e in missing:
            if len(lru) < self.pool.rows:
                row = len(lru)
            else:
                old = next(x for x in lru if x not in keep)
                row = lru.pop(old)
                self.map[layer, old] = 0
                self.counters["evicted"] += 1
            self._write(ex, layer, e, row)
            lru[e] = row
            self.map[layer, e] = row
            self.counters["paged"] += 1
        return bool(missing)

    def _write(self, ex, layer: int, expert: int, row: int) -> None:
        w = self.pool.weights
        for m in MATRICES:
            spec = w.spec(f"blk.{layer}.{m}.weight")
            src = np.ascontiguousarray(w.arrays[spec.ref.tensor][expert], np.float32)
            buf = ex.state.buffers[pool_state(layer, m)][0]
            ex.runtime.write(buf, row * src.nbytes, src)


__all__ = ["ROLE", "SLOT", "ExpertPager", "ExpertPool", "TracedPool", "map_role",
           "ids_witness", "pool_state"]
