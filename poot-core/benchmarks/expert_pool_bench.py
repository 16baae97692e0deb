"""Decode tokens/s of a random-weight MoE with every expert resident against an expert pool
(poot.models.expert_pool) of fewer rows, on one backend.

The model is `tiny_config` widened to MoE shapes (--experts experts per layer, 2 per token);
its weights are `random_weights`, so routing is close to uniform: the pool's miss rate here
is a worst case (trained routers repeat experts from token to token). For each pool size the
same decode steps run, fed the same random tokens (not the model's picks, which
settle on one token and so on one set of experts); the line gives tok/s, runs per step (1 means
no re-run) and experts paged in per step. Lines starting "SUMMARY " are for scripts.

    python poot-core/benchmarks/expert_pool_bench.py --backend cpu --pools 8,6,4,2
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def decode(backend: str, config, weights, pool_rows: int | None, steps: int):
    import poot
    from poot.backend import select_backend
    from poot.models.expert_pool import ExpertPager, ExpertPool
    from poot.models.llama import build_decoder
    from poot.runtime.session import Session

    target = select_backend(backend)
    pool = ExpertPool(config, weights, pool_rows) if pool_rows is not None else None
    consts = dict(weights.arrays)        # the steps' host tables join it as they are traced

    def graph(t, b):
        step = build_decoder(config, weights, tokens=t, batch=b, expert_pool=pool)
        consts.update(step.consts)
        return poot.compile(step.graph, target)

    session = Session(graph, consts, kv="dense", capacity=config.max_seq, target=target)
    pager = ExpertPager(pool) if pool is not None else None
    session.stepper = pager
    session.open("s")
    tokens = np.random.default_rng(0).integers(0, config.vocab, steps + 1)
    session.decode({"s": int(tokens[0])})            # plan, bind and warm
    t0 = time.perf_counter()
    for tok in tokens[1:]:
        session.decode({"s": int(tok)})
    seconds = time.perf_counter() - t0
    return steps / seconds, (pager.counters if pager else None)


def main() -> None:
    from poot.models.llama import random_weights, tiny_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--expert-ffn", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pools", default="8,6,4,2", help="pool rows per layer to measure")
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    config = tiny_config(dim=args.dim, layers=args.layers, heads=8, kv_heads=4, head_dim=32,
                         experts=args.experts, experts_used=2, expert_ffn=args.expert_ffn,
                         vocab=512, max_seq=64)
    weights = random_weights(config, seed=1)
    decode(args.backend, config, weights, None, 4)   # warm the machine and the caches
    full, _ = decode(args.backend, config, weights, None, args.steps)
    print(f"SUMMARY backend={args.backend} experts={args.experts} pool=all tok/s={full:.1f}")
    for rows in (int(x) for x in args.pools.split(",")):
        tps, c = decode(args.backend, config, weights, rows, args.steps)
        per = c["steps"] or 1
        print(f"SUMMARY backend={args.backend} experts={args.experts} pool={rows} "
              f"tok/s={tps:.1f} vs_full={tps / full:.2f} runs/step={c['runs'] / per:.2f} "
              f"paged/step={c['paged'] / per:.2f}")


if __name__ == "__main__":
    main()
