"""`poot plan`: print a model's plan (kernels, aliases, views, arena, weights, state).

    poot plan --demo                 the lead's tiny random-weight Llama decoder
    poot plan smollm2 --summary      a real checkpoint (a name, a .gguf file, an HF folder)
    poot plan --demo --run 10        also bind it and time 10 decode steps
"""
from __future__ import annotations

import time


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("plan", help="print the plan of a model's decode (or prefill) step: "
                       "kernels with their lowering, arena size against the sum of buffers")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--demo", action="store_true", help="the tiny random-weight Llama decoder")
    p.add_argument("--layers", type=int, help="layers of the decoder (default: the model's)")
    p.add_argument("--tokens", type=int, default=1, help="tokens per step (1: decode)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (paged KV)")
    p.add_argument("--kv", choices=["dense", "paged"], default="dense")
    p.add_argument("--max-seq", type=int, default=256, help="KV capacity per sequence")
    p.add_argument("--backend", help="backend name (default: the best available)")
    p.add_argument("--no-compile", action="store_true", help="plan the traced graph as is")
    p.add_argument("--summary", action="store_true", help="print only the summary lines")
    p.add_argument("--run", type=int, default=0, metavar="STEPS",
                   help="bind the weights and time this many steps")


def _decoder(args):
    import dataclasses

    from poot.models.llama import build_decoder, random_weights, tiny_config

    if args.demo or not args.model:
        config = tiny_config(max_seq=args.max_seq)
        if args.layers:
            config = dataclasses.replace(config, layers=args.layers)
        weights = random_weights(config, seed=0)
        source = "tiny random-weight decoder"
    else:
        from poot.models.loader import open_model
        from poot.models.weights import CheckpointWeights

        ckpt, config = open_model(args.model, max_seq=args.max_seq)
        if args.layers:  # the first layers of the checkpoint
            config = dataclasses.replace(config, layers=args.layers)
        weights = CheckpointWeights(ckpt)
        source = str(ckpt.path.name)
    step = build_decoder(config, weights, tokens=args.tokens, batch=args.batch, kv=args.kv)
    return step, weights, source


def run(args) -> int:
    import poot
    from poot.plan import plan
    from poot.plan.show import format_plan, format_summary

    step, weights, source = _decoder(args)
    target = args.backend
    subject = step.graph if args.no_compile else poot.compile(step.graph, target)
    t0 = time.perf_counter()
    p = plan(subject, target)
    took = time.perf_counter() - t0
    print(f"# {source}: {step.mode} step, {args.kv} KV, {step.graph.name} "
          f"({'traced' if args.no_compile else 'compiled'}; planned in {took:.2f} s)")
    print(format_summary(p) if args.summary else format_plan(p))
    if args.run:
        _time_steps(p, step, weights, args.run)
    return 0


def _time_steps(p, step, weights, steps: int) -> None:
    import numpy as np

    from poot.models.llama import const_inputs
    from poot.runtime import Executor

    t0 = time.perf_counter()
    ex = Executor(p, const_inputs(step, weights))
    bind = time.perf_counter() - t0
    c, t, b = step.config, step.tokens, step.batch
    rng = np.random.default_rng(0)
    allocs = getattr(ex.runtime, "allocs", None)
    times = []
    for i in range(steps):
        slots = {"tokens": rng.integers(0, c.vocab, (t,) if step.kv == "dense" else (b, t)),
                 "pos": [i * t] if step.kv == "dense" else [[i * t]] * b}
        if step.kv == "paged":
            pool = c.max_seq * b
            rows = np.arange(pool, dtype=np.int32).reshape(b, c.max_seq)
            slots["write_map"] = rows[:, i * t: (i + 1) * t].reshape(-1)
            slots["slot_map"] = rows
        t1 = time.perf_counter()
        ex.step(slots)
        times.append(time.perf_counter() - t1)
    steady = sorted(times[1:] or times)[len(times[1:] or times) // 2]
    print(f"\nbound in {bind:.2f} s: {ex.weights.uploads} weight uploads "
          f"({ex.weights.bytes() / 2**20:.1f} MiB), {ex.weights.folds} folded on the host")
    print(f"{steps} steps: first {times[0] * 1e3:.1f} ms, median {steady * 1e3:.2f} ms "
          f"({t * b / steady:.1f} tokens/s)"
          + ("" if allocs is None else f", {ex.runtime.allocs - allocs} allocations in steps"))
