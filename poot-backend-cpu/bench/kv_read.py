"""SmolLM2-135M at the fast precision (f16 KV) on the cpu backend: the decode step with the
f16 cache read in place by attention against the same step with the cache widened to f32
first (the attention pass's fold of the two casts turned off), in one process, rounds
alternating.

Prints whether the greedy texts are the same, then per round the decode ms/step (wall) and
the process CPU time of a 64-token generate (prefill of the prompt included; steadier than
wall time on a shared machine when run with OMP_NUM_THREADS=1).

    OMP_NUM_THREADS=1 python poot-backend-cpu/bench/kv_read.py [--max-seq 1024] [--rounds 10]
"""
from __future__ import annotations

import argparse
import statistics
import time

import poot
from poot.compiler.passes import attention
from poot.compiler.view import NoMatch

PROMPT = "The history of the city begins with a small settlement on the river, where"
TOKENS = 64


def load(fold: bool, max_seq: int):
    """The model with both steps planned, with or without the fold."""
    widened = attention.widened

    def refuse(*args):
        raise NoMatch("the fold is off for this measurement")

    attention.widened = widened if fold else refuse
    try:
        model = poot.load("smollm2", backend="cpu", precision="fast", max_seq=max_seq)
        list(model.generate("Hello", max_tokens=2))
    finally:
        attention.widened = widened
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    models = {"f32 casts": load(False, args.max_seq), "f16 read": load(True, args.max_seq)}
    texts = {n: "".join(m.generate(PROMPT, max_tokens=48)) for n, m in models.items()}
    print("greedy texts the same:", len(set(texts.values())) == 1)
    wall = {n: [] for n in models}
    cpu = {n: [] for n in models}
    for r in range(args.rounds):
        for n, m in models.items():
            c0 = time.process_time()
            list(m.generate(PROMPT, max_tokens=TOKENS))
            cpu[n].append(1000 * (time.process_time() - c0))
            s = m.stats
            wall[n].append(1000 * s.decode_seconds / (s.generated_tokens - 1))
            print(f"round {r} {n}: {wall[n][-1]:.2f} ms/step, {cpu[n][-1]:.0f} ms CPU",
                  flush=True)
    for n in models:
        print(f"{n}: ms/step min {min(wall[n]):.2f} median {statistics.median(wall[n]):.2f}; "
              f"CPU ms a generate min {min(cpu[n]):.0f} median {statistics.median(cpu[n]):.0f}")


if __name__ == "__main__":
    main()
