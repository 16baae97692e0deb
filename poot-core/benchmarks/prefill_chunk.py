"""The prefill chunk: time to first token of one long prompt at each chunk size, in one run.

For each --chunks size a model is loaded with that many prompt tokens per prefill step
(`poot.load(..., prefill_tokens=N)`, the default of `poot run` and `poot serve` being
the one `--prefill-chunk` overrides), its plans made by a warm-up generation, then the
same --prompt-tokens ids are generated from with max_tokens=1, --repeat times: the median
prefill time (Stats.prefill_seconds: the chunks' steps and the first token's logits) and
the greedy first token, which must agree across chunk sizes (the exact graph's only
difference between them is the summation order of attention's rows).

    python poot-core/benchmarks/prefill_chunk.py [--model smollm2] [--backend cuda] \\
        [--prompt-tokens 1000] [--chunks 16,32,64,128,256]

Lines starting with "SUMMARY " are the results.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> int:
    import poot

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--chunks", default="16,32,64,128,256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--precision", default="exact")
    args = ap.parse_args()
    firsts = {}
    for chunk in (int(c) for c in args.chunks.split(",")):
        t0 = time.perf_counter()
        m = poot.load(args.model, args.backend, max_seq=args.prompt_tokens + 8,
                      prefill_tokens=chunk, precision=args.precision)
        ids = np.random.default_rng(0).integers(100, m.config.vocab - 100,
                                               args.prompt_tokens).tolist()
        m.generate(ids, max_tokens=1)                     # plans made and recorded
        made = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            text = m.generate(ids, max_tokens=1)
            times.append(m.stats.prefill_seconds)
        firsts[chunk] = text
        best = statistics.median(times)
        print(f"SUMMARY {args.model} on {m.backend.name} ({m.device}), {args.prompt_tokens}-"
              f"token prompt in {chunk}-token chunks: TTFT ms | {1e3 * best:.1f} "
              f"({args.prompt_tokens / best:.0f} tok/s; loaded and planned in {made:.1f} s; "
              f"first token {text!r})", flush=True)
        del m
    same = len(set(firsts.values())) == 1
    print(f"SUMMARY first token the same at every chunk size | {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
