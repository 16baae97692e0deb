"""Decode tokens/s of a random-weight MoE with every expert resident against an expert pool
(poot.models.expert_pool) of fewer rows, on one backend.

The model is `tiny_config` widened to MoE shapes (--experts experts per layer, 2 per token);
its weights are `random_weights`, so routing is close to uniform: the pool's miss rate here
is a worst case (trained routers repeat experts from token to token). For each pool size the
same decode steps run, fed the same random tokens (not the model's picks, which settle on one
token and so on one set of experts), after --warm steps that fill the pool; configurations
take turns for --rounds rounds and each keeps its best round. Each line gives
tok/s, runs per step (1: no re-run) and experts paged in per step; lines starting "SUMMARY "
are for scripts.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


class Run:
    """One configuration's dense session, planned, bound and warmed once."""

    def __init__(self, backend: str, config, weights, pool_rows: int | None, warm: int):
        import poot
        from poot.models.expert_pool import ExpertPager, ExpertPool
        from poot.models.llama import build_decoder
        from poot.plugin import select_backend
        from poot.runtime.session import Session

        target = select_backend(backend)
        pool = ExpertPool(config, weights, pool_rows) if pool_rows is not None else None
        consts = dict(weights.arrays)        # the steps' host tables join it as they are traced

        def graph(t, b):
            step = build_decoder(config, weights, tokens=t, batch=b, expert_pool=pool)
            consts.update(step.consts)
            return poot.compile(step.graph, target)

        self.session = Session(graph, consts, kv="dense", capacity=config.max_seq,
                               target=target)
        self.pager = self.session.stepper = ExpertPager(pool) if pool is not None else None
        self.tokens = np.random.default_rng(0).integers(0, config.vocab, config.max_seq)
        self.warm = warm
        self.best = 0.0
        self.counters = dict.fromkeys(("steps", "runs", "paged"), 0)

    def round(self, steps: int) -> None:
        """Decode `steps` tokens after `warm` (plan, bind, fill the pool) from a fresh
        sequence; keeps the best tok/s and the pager's counts of the timed steps."""
        s = self.session
        s.open("s")
        for tok in self.tokens[:self.warm]:
            s.decode({"s": int(tok)})
        before = dict(self.pager.counters) if self.pager else {}
        t0 = time.perf_counter()
        for tok in self.tokens[self.warm:self.warm + steps]:
            s.decode({"s": int(tok)})
        self.best = max(self.best, steps / (time.perf_counter() - t0))
        s.close("s")
        for k in self.counters if self.pager else ():
            self.counters[k] += self.pager.counters[k] - before[k]


def main() -> None:
    from poot.models.llama import random_weights, tiny_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--expert-ffn", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pools", default="8,6,4,2", help="pool rows per layer to measure")
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
    ap.add_argument("--warm", type=int, default=16, help="decode steps run before timing")
    args = ap.parse_args()
    config = tiny_config(dim=args.dim, layers=args.layers, heads=8, kv_heads=4, head_dim=32,
                         experts=args.experts, experts_used=2, expert_ffn=args.expert_ffn,
                         vocab=512, max_seq=64)
    weights = random_weights(config, seed=1)
    pools = [None] + [int(x) for x in args.pools.split(",")]
    runs = [Run(args.backend, config, weights, rows, args.warm) for rows in pools]
    for _ in range(args.rounds):         # interleaved, best round kept: the machine is noisy
        for r in runs:
            r.round(args.steps)
    full = runs[0].best
    print(f"SUMMARY backend={args.backend} experts={args.experts} pool=all tok/s={full:.1f}")
    for rows, r in zip(pools[1:], runs[1:], strict=True):
        c, per = r.counters, r.counters["steps"] or 1
        print(f"SUMMARY backend={args.backend} experts={args.experts} pool={rows} "
              f"tok/s={r.best:.1f} vs_full={r.best / full:.2f} runs/step={c['runs'] / per:.2f} "
              f"paged/step={c['paged'] / per:.2f}")


if __name__ == "__main__":
    main()
