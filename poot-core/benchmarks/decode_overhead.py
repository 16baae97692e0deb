"""Host time per decode step of a 30-layer plan on the reference backend.

    python poot-core/benchmarks/decode_overhead.py [--shape tiny|smollm2|model|all]

Shapes (dense KV, one token per step, the graph compiled for the reference backend and
planned; the reference plans composites through their definitions):
- "tiny": 30 layers of the tiny test config with random f32 weights: the step time is
  almost all per-kernel host overhead;
- "smollm2": the SmolLM2-135M shape (30 layers, dim 576, 9/3 heads, ffn 1536, vocab
  49152) with random f32 weights;
- "model": the real SmolLM2-135M Q4_1 GGUF from poot's cache (skipped with a message when
  it is not there; `poot pull smollm2` fetches it), its packed weights decoded at bind.
For each: the executor's time per step, the part spent in the weight GEMVs alone (the
same kernels timed on their own: the memory-bandwidth floor of an f32 decode), the rest
(per-kernel host overhead), and the oracle (`poot.evaluate`, state threaded by hand) on
the same graph in the same run.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import poot
from poot.ir import ops as O
from poot.models.llama import build_decoder, const_inputs, random_weights, tiny_config
from poot.oracle import evaluate
from poot.plan import plan
from poot.runtime import Executor
from poot.runtime.blas import single_thread


def smollm2_config(layers: int, max_seq: int):
    return tiny_config(vocab=49152, dim=576, layers=layers, heads=9, kv_heads=3, head_dim=64,
                       ffn=1536, rope_base=100000.0, max_seq=max_seq)


def checkpoint(max_seq: int):
    from poot.models.hub import smollm2_path
    from poot.models.loader import open_model
    from poot.models.weights import CheckpointWeights

    path = smollm2_path()
    if path is None:
        return None
    ckpt, config = open_model(str(path), max_seq=max_seq)
    return config, CheckpointWeights(ckpt)


def weight_gemvs(p, ex) -> float:
    """Seconds per step spent in the MatMuls that read a weight, timed on their own."""
    kernels = [k for s, k in zip(p.steps, ex.executable.kernels, strict=False)
               if isinstance(s.eqn.op, O.MatMul) and any(
                   getattr(x, "region", "").startswith("w:") for x in s.inputs)]
    with single_thread():
        for k in kernels:
            k()
        t0 = time.perf_counter()
        for _ in range(3):
            for k in kernels:
                k()
    return (time.perf_counter() - t0) / 3


def measure(name: str, config, weights, steps: int, oracle_steps: int) -> None:
    t0 = time.perf_counter()
    step = build_decoder(config, weights)
    compiled = poot.compile(step.graph, "reference")
    t1 = time.perf_counter()
    p = plan(compiled)
    t2 = time.perf_counter()
    consts = const_inputs(step, weights)
    ex = Executor(p, consts)
    t3 = time.perf_counter()
    tokens = np.random.default_rng(0).integers(0, config.vocab, steps)
    ex.step({"tokens": [tokens[0]], "pos": [0]})            # first touch of every page
    allocs = ex.runtime.allocs
    times = []
    for i in range(1, steps):
        t = time.perf_counter()
        ex.step({"tokens": [tokens[i]], "pos": [i]})
        times.append(time.perf_counter() - t)
    per_step = float(np.median(times))
    assert ex.runtime.allocs == allocs, "a step allocated a buffer"
    gemv = weight_gemvs(p, ex)

    g = step.graph
    state = {g.meta(v).identity.label: np.zeros(g.type_of(v).shape, np.float32)
             for v, _ in g.state()}
    t4 = time.perf_counter()
    for i in range(oracle_steps):
        evaluate(g, {**consts, **state, "tokens": [tokens[i]], "pos": [i]})
    oracle = (time.perf_counter() - t4) / oracle_steps

    print(f"{name}: {config.layers} layers, dim {config.dim}, vocab {config.vocab}: "
          f"{len(g.eqns())} traced eqns, {len(p.steps)} kernels planned")
    print(f"  trace+compile {t1 - t0:.2f} s, plan {t2 - t1:.2f} s, bind {t3 - t2:.2f} s "
          f"({ex.weights.uploads} uploads, {ex.weights.bytes() / 2**20:.1f} MiB, "
          f"{ex.weights.folds} folded)")
    print(f"  arena {p.arena_size / 2**20:.3f} MiB for {p.unshared_bytes / 2**20:.3f} MiB of "
          f"buffers ({p.unshared_bytes / max(p.arena_size, 1):.1f}x reuse)")
    print(f"  executor: {per_step * 1e3:.2f} ms/step median of {steps - 1} "
          f"({1 / per_step:.1f} tokens/s)")
    print(f"    weight GEMVs alone {gemv * 1e3:.2f} ms ({gemv / per_step:.0%}); the rest "
          f"{(per_step - gemv) * 1e3:.2f} ms = {(per_step - gemv) / len(p.steps) * 1e6:.2f} us "
          f"per kernel")
    print(f"  oracle:   {oracle * 1e3:.2f} ms/step ({oracle / per_step:.1f}x the executor)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-seq", type=int, default=256)
    ap.add_argument("--shape", choices=["tiny", "smollm2", "model", "all"], default="all")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.shape in ("tiny", "all"):
        c = tiny_config(layers=args.layers, max_seq=args.max_seq)
        measure("tiny", c, random_weights(c), args.steps, 5)
    if args.shape in ("smollm2", "all"):
        c = smollm2_config(args.layers, args.max_seq)
        measure("smollm2 shape", c, random_weights(c), args.steps, 2)
    if args.shape in ("model", "all"):
        found = checkpoint(args.max_seq)
        if found is None:
            print("model: SmolLM2-135M is not in poot's cache (poot pull smollm2); skipped")
        else:
            measure("SmolLM2-135M Q4_1", *found, args.steps, 2)


if __name__ == "__main__":
    main()
