"""What sampling costs per decode step: the host reading back logits and sampling them, or
the step sampling in the graph and reading back token ids.

    python poot-core/benchmarks/sampler_step.py --backend cpu [--steps 20] [--batch 1]

SmolLM2-135M from $POOT_CACHE, or random weights of its shape where the file is absent;
paged decode steps of `batch` rows, three plans sharing one weight cache:
- logits: the step returns logits [B, vocab], the host samples them (temperature 0.8,
  top-k 40, top-p 0.95, repetition penalty 1.1: poot.models.sampling.Sampler);
- argmax: the step returns the argmax ids (plain greedy);
- full: the step samples every row with those settings and returns the ids.
Prints ms per step for each (median of `steps`), wall clock and this process's CPU time
(the fairer figure on a shared CPU machine), and the difference to the logits plan.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SETTINGS = dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-seq", type=int, default=128)
    args = ap.parse_args()

    import poot
    from poot.models.greedy import random_decoder
    from poot.models.llama import build_decoder, const_inputs
    from poot.models.sample_graph import slot_values
    from poot.models.sampling import Sampler
    from poot.plan import plan
    from poot.plugin import select_backend
    from poot.runtime.executor import Executor

    target = select_backend(args.backend)
    try:
        from poot.models.greedy import open_decoder

        first, weights = open_decoder("smollm2", max_seq=args.max_seq)
        what = "SmolLM2-135M"
    except Exception as exc:  # the file is not pulled: the same shape, random weights
        first, weights = random_decoder(max_seq=args.max_seq)
        what = f"random weights of SmolLM2's shape ({type(exc).__name__})"
    config = first.config
    b, cap = args.batch, args.max_seq
    times: dict[str, tuple[float, float]] = {}
    shared = {}
    for mode in ("logits", "argmax", "full"):
        step = build_decoder(config, weights, batch=b, kv="paged",
                             sample=None if mode == "logits" else mode)
        ex = Executor(plan(poot.compile(step.graph, target), target), const_inputs(step, weights),
                      **shared)
        shared = dict(weights=ex.weights)
        samplers = [Sampler(**SETTINGS, seed=r) for r in range(b)]
        history = [[1, 2, 3] for _ in range(b)]
        smap = np.arange(b * cap, dtype=np.int32).reshape(b, cap)
        per, cpu = [], []
        for i in range(args.steps + 2):
            slots = {"tokens": np.full((b, 1), 5, np.int32),
                     "pos": np.full((b, 1), i % cap, np.int32),
                     "write_map": smap[:, i % cap].copy(), "slot_map": smap}
            if mode == "full":
                slots.update(slot_values(list(zip(samplers, history, strict=True)), b))
            t0, c0 = time.perf_counter(), time.process_time()
            out = ex.step(slots).result
            if mode == "logits":
                [s.sample(row, h) for s, row, h in zip(samplers, out, history, strict=True)]
            per.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        times[mode] = (statistics.median(per[2:]) * 1e3, statistics.median(cpu[2:]) * 1e3)
    print(f"{what}, {target[0].name} on {target[1]}, batch {b}, median of {args.steps} steps")
    w0, c0 = times["logits"]
    for mode, (wall, cpu_ms) in times.items():
        print(f"  {mode:7s} wall {wall:8.2f} ms/step ({wall - w0:+.2f} vs logits)   "
              f"cpu {cpu_ms:8.2f} ms/step ({cpu_ms - c0:+.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
