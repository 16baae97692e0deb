"""Compile time of a 30-layer Llama decoder step (the SmolLM2-135M shape by default).

    python poot-core/benchmarks/compile_time.py [--layers 30] [--mode decode|prefill]
        [--kv dense|paged] [--repeat 3] [--profile]

Prints trace time, compile time (best of --repeat) per pass, and eqn counts. The
target is one second for 30 layers on a 2-core machine (not a timed test).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter


def main(argv=None) -> None:
    import poot
    from poot.models.llama import LlamaConfig, build_decoder, random_weights

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--mode", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--kv", choices=["dense", "paged"], default="dense")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one compile")
    args = ap.parse_args(argv)

    # the SmolLM2-135M shape (hidden 576, 9 heads / 3 KV heads, FFN 1536); small vocab and
    # KV capacity keep the random weights cheap; the graph has the same eqns
    config = LlamaConfig(vocab=512, dim=576, layers=args.layers, heads=9, kv_heads=3,
                         head_dim=64, ffn=1536, max_seq=256, rope_base=100000.0)
    weights = random_weights(config, dtype="bf16")
    start = time.perf_counter()
    step = build_decoder(config, weights, tokens=1 if args.mode == "decode" else 16,
                         kv=args.kv, batch=1 if args.kv == "dense" else 2)
    traced = time.perf_counter() - start
    best, compiled = float("inf"), None
    for _ in range(args.repeat):
        start = time.perf_counter()
        compiled = poot.compile(step.graph, "reference")
        best = min(best, time.perf_counter() - start)
    g = compiled.graph
    print(f"{args.layers}-layer {args.mode} step ({args.kv} KV): trace {traced:.3f} s, "
          f"{len(step.graph.eqns())} eqns -> compile {best:.3f} s (best of {args.repeat}) "
          f"-> {len(g.eqns())} eqns; target < 1 s: {'met' if best < 1.0 else 'MISSED'}")
    for p in compiled.report.passes:
        print(f"  {p.summary()}")
    print("  ops after:", dict(Counter(e.op.name for e in g.eqns()).most_common()))
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(poot.compile, step.graph, "reference")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
