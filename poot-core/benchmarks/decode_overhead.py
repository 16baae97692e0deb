"""Host time per decode step of a 30-layer plan on the reference backend.

    python poot-core/benchmarks/decode_overhead.py [--layers 30] [--steps 20] [--shape both]

Two shapes, random f32 weights, dense KV, one token per step:
- "tiny": 30 layers of the tiny test config, so the time is almost all per-eqn host
  overhead (the executor's dispatch of each planned kernel), reported per step and per
  kernel;
- "smollm2": the SmolLM2-135M shape (30 layers, dim 576, 9/3 heads, ffn 1536, vocab
  49152), the model team's real target, reported as tokens/s.
Each is compared with the oracle (`poot.evaluate` on the same graph, state threaded by
hand) measured in the same run, and the plan's arena is printed against its buffers.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.plan import plan
from poot.reference import evaluate
from poot.runtime import Executor


def smollm2_config(layers: int, max_seq: int):
    return tiny_config(vocab=49152, dim=576, layers=layers, heads=9, kv_heads=3, head_dim=64,
                       ffn=1536, rope_base=100000.0, max_seq=max_seq)


def measure(name: str, config, steps: int, oracle_steps: int) -> None:
    t0 = time.perf_counter()
    weights = random_weights(config, seed=0)
    step = build_decoder(config, weights)
    t1 = time.perf_counter()
    p = plan(step.graph, "reference")
    t2 = time.perf_counter()
    consts = const_inputs(step, weights)
    ex = Executor(p, consts)
    t3 = time.perf_counter()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab, steps)
    ex.step({"tokens": [tokens[0]], "pos": [0]})            # warm caches
    allocs = ex.runtime.allocs
    t4 = time.perf_counter()
    for i in range(1, steps):
        ex.step({"tokens": [tokens[i]], "pos": [i]})
    per_step = (time.perf_counter() - t4) / (steps - 1)
    assert ex.runtime.allocs == allocs, "a step allocated a buffer"

    g = step.graph
    state = {g.meta(v).identity.label: np.zeros(g.type_of(v).shape, np.float32)
             for v, _ in g.state()}
    t5 = time.perf_counter()
    for i in range(oracle_steps):
        evaluate(g, {**consts, **state, "tokens": [tokens[i]], "pos": [i]})
    oracle = (time.perf_counter() - t5) / oracle_steps

    print(f"{name}: {config.layers} layers, dim {config.dim}, vocab {config.vocab}, "
          f"{len(g.eqns())} eqns, {len(p.steps)} kernels")
    print(f"  trace {t1 - t0:.2f} s (weights included), plan {t2 - t1:.2f} s, "
          f"bind {t3 - t2:.2f} s ({ex.weights.uploads} uploads, {ex.weights.folds} folded)")
    print(f"  arena {p.arena_size / 2**20:.3f} MiB vs {p.unshared_bytes / 2**20:.3f} MiB of "
          f"buffers ({p.unshared_bytes / max(p.arena_size, 1):.1f}x)")
    print(f"  executor: {per_step * 1e3:.2f} ms/step ({1 / per_step:.1f} tokens/s), "
          f"{per_step / len(p.steps) * 1e6:.2f} us per kernel")
    print(f"  oracle:   {oracle * 1e3:.2f} ms/step ({oracle / per_step:.1f}x the executor)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-seq", type=int, default=256)
    ap.add_argument("--shape", choices=["tiny", "smollm2", "both"], default="both")
    args = ap.parse_args()
    if args.shape in ("tiny", "both"):
        measure("tiny", tiny_config(layers=args.layers, max_seq=args.max_seq), args.steps, 5)
    if args.shape in ("smollm2", "both"):
        measure("smollm2", smollm2_config(args.layers, args.max_seq), args.steps, 3)


if __name__ == "__main__":
    main()
