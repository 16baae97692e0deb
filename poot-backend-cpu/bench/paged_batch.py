"""SmolLM2-135M decoding four sequences at once from one paged KV pool on the cpu backend:
ms per batched decode step with the tree's attention ("now") against the attention before
the rows kernel read pools, per-sequence masks and q8_0 caches ("before": the pool rows
gathered and transposed into f32 or f16 copies, attention over them on the shared lowering,
a q8_0 cache dequantized to f32 first). One mode per process (a process keeps the lowering
of each signature it made first).

Prints the median and min wall ms of the steps after the first five, the median process
CPU ms (steadier on a shared machine, with OMP_NUM_THREADS=1), and a digest of the greedy
tokens.

    OMP_NUM_THREADS=1 python poot-backend-cpu/bench/paged_batch.py now|before
        [--kv-dtype f16|q8_0] [--steps 30]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import time

import poot
import poot_cpu.attention as rows_kernel
import poot_cpu.backend
from poot.compiler.passes import attention
from poot.compiler.view import NoMatch

PROMPT = "The history of the city begins with a small settlement on the river, where"
BATCH = 4


def as_before() -> None:
    """The cpu's attention as it was: no PagedAttention, no per-sequence mask in the rows
    kernel, no fold of a q8_0 cache's dequantization."""
    taken, table = rows_kernel.mask_batches, poot_cpu.backend.table

    def without_paged(device, formats):
        t = table(device, formats)
        return dataclasses.replace(t, ops={k: v for k, v in t.ops.items()
                                           if k != "PagedAttention"})

    poot_cpu.backend.table = without_paged

    def off(*args):
        raise NoMatch("the fold is off for this measurement")

    attention.dequantized = off
    rows_kernel.mask_batches = lambda mask, lead: (taken(mask, lead) if mask.rank <= 2
                                                   else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("now", "before"))
    ap.add_argument("--kv-dtype", choices=("f16", "q8_0"), default="f16")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    if args.mode == "before":
        as_before()
    model = poot.load("smollm2", "cpu", max_seq=512, precision="fast", kv_dtype=args.kv_dtype,
                      kv="paged")
    session = model.session("paged", batch=BATCH)
    ids = model.tokenize(PROMPT)
    toks = {}
    for i in range(BATCH):
        session.open(i)
        toks[i] = int(session.prefill(i, ids + [i]).argmax())
    wall, cpu, text = [], [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = session.decode(toks)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        toks = {i: int(logits.argmax()) for i, logits in out.items()}
        text.append(sorted(toks.items()))
    digest = hashlib.md5(repr(text).encode()).hexdigest()[:8]
    print(f"{args.mode} {args.kv_dtype}: ms/step median {1e3 * statistics.median(wall[5:]):.1f} "
          f"min {1e3 * min(wall[5:]):.1f}; CPU ms/step median "
          f"{1e3 * statistics.median(cpu[5:]):.1f}; tokens {digest}")


if __name__ == "__main__":
    main()
