"""Resident memory of one `poot run`-like process after each phase, and its peak against the
GGUF's size (issue 49's target: 1.6x at most on SmolLM2), so that a change's effect on the
peak can be placed: VmRSS and VmHWM from /proc/self/status (Linux), in MiB.

    python poot-backend-cpu/bench/rss_phases.py [--model smollm2] [--backend cpu]
        [--precision exact|fast] [--kv-dtype f32|f16|q8_0] [--max-seq 1024]

Phases: the interpreter and numpy; `select_backend` (imports every installed plugin and
probes the backend); `load` (GGUF metadata, tokenizer, config); `prepare` (the prefill and
decode steps traced, compiled, planned, and their weights bound); a 16-token greedy answer.
The peak counts this process only; `/usr/bin/time -v` adds a waited-for child's (the C
compiler, on a cold kernel cache).
"""
from __future__ import annotations

import argparse
import os


def status() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def report(phase: str) -> None:
    rss, hwm = status()
    print(f"{phase:<16} RSS {rss:7.1f} MiB  peak {hwm:7.1f} MiB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--precision", default="exact")
    ap.add_argument("--kv-dtype", default=None)
    ap.add_argument("--max-seq", type=int, default=1024)
    args = ap.parse_args()
    import numpy  # noqa: F401  (its share, apart from poot's)

    report("interpreter")
    from poot.models.runner import load
    from poot.models.sampling import Sampler
    from poot.plugin import select_backend

    select_backend(args.backend)
    report("select_backend")
    model = load(args.model, args.backend, max_seq=args.max_seq, precision=args.precision,
                 kv_dtype=args.kv_dtype)
    report("load")
    mode = model.sample_mode([Sampler(0.0, 0, 1.0, 1.0, None)])
    model.prepare(model.session(), prompt_tokens=2, sample=mode)
    report("prepare")
    text = model.generate("The capital of France is", max_tokens=16)
    report("generate")
    size = os.path.getsize(model.checkpoint.path) / 2**20
    print(f"answer {text!r}")
    print(f"peak / GGUF ({size:.1f} MiB): {status()[1] / size:.2f}x")


if __name__ == "__main__":
    main()
