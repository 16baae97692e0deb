"""SmolLM2-135M (or Gemma 3 270M) at the fast precision on the cpu backend: the decode step with the f16 (or
q8_0) cache read in place by attention against the same step with the cache widened (or
dequantized) to f32 first (the attention pass's fold of that read turned off), in one
process, rounds alternating.

Prints whether the greedy texts are the same, then per round the decode ms/step (wall) and
the process CPU time of a 64-token generate (prefill of the prompt included; steadier than
wall time on a shared machine when run with OMP_NUM_THREADS=1).

    OMP_NUM_THREADS=1 python poot-backend-cpu/bench/kv_read.py [--max-seq 1024] [--rounds 10]
        [--kv-dtype f16|q8_0] [--model smollm2|gemma3-270m]
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


#: the attention pass's reader of each cache dtype's read (what the fold needs)
READERS = {"f16": "widened", "q8_0": "dequantized"}


def load(fold: bool, max_seq: int, kv_dtype: str, name: str):
    """The model with both steps planned, with or without the fold."""
    reader_name = READERS[kv_dtype]
    reader = getattr(attention, reader_name)

    def refuse(*args):
        raise NoMatch("the fold is off for this measurement")

    setattr(attention, reader_name, reader if fold else refuse)
    try:
        model = poot.load(name, backend="cpu", precision="fast", max_seq=max_seq,
                          kv_dtype=kv_dtype)
        list(model.generate("Hello", max_tokens=2))
    finally:
        setattr(attention, reader_name, reader)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--kv-dtype", choices=sorted(READERS), default="f16")
    ap.add_argument("--model", choices=("smollm2", "gemma3-270m"), default="smollm2")
    args = ap.parse_args()
    models = {"f32 copy": load(False, args.max_seq, args.kv_dtype, args.model),
              f"{args.kv_dtype} read": load(True, args.max_seq, args.kv_dtype, args.model)}
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
