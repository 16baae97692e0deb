"""Decode soak: many decode steps in one process, resident memory sampled along the way.

Part 1 decodes `--steps` greedy tokens on SmolLM2 with a dense KV cache: a sequence is opened,
its prompt prefilled, tokens decoded until the cache is full, the sequence closed and the next
one opened, until the step count is reached. RSS is read from /proc every `--sample` steps;
memory is flat when the growth after warm-up (the first sequence) stays within `--slack-mib`.

Part 2 churns one paged pool: up to `--batch` sequences live at once, each opened with a
prompt of random length, decoded together for a random number of steps and closed at a random
moment while the others go on; at the end every block must be back in the pool.

    python3 poot-core/benchmarks/decode_soak.py [--steps 10000] [--backend reference]
    python3 poot-core/benchmarks/decode_soak.py --steps 10000 --backend cuda   # on a GPU

A benchmark, not a test: it prints figures (and writes them with --json); the exit status
is 1 when memory grew past the slack or the pool lost blocks.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def dense_soak(model, steps: int, sample: int, prompt: str) -> dict:
    session = model.session("dense")
    ids = model.tokenize(prompt)
    model.prepare(session, len(ids))
    samples, done, sequences, t0 = [], 0, 0, time.perf_counter()
    warm = None
    while done < steps:
        seq = ("dense", sequences)
        session.open(seq)
        logits = session.prefill(seq, ids)
        while done < steps and session.length(seq) < model.config.max_seq:
            tok = int(logits.argmax())
            logits = session.decode({seq: tok})[seq]
            done += 1
            if done % sample == 0:
                samples.append((done, round(rss_mib(), 1)))
            if done % 1000 == 0:
                print(f"  step {done}: RSS {rss_mib():.1f} MiB, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
        session.close(seq)
        sequences += 1
        if warm is None:
            warm = rss_mib()
    seconds = time.perf_counter() - t0
    after = [m for step, m in samples if step > model.config.max_seq] or [rss_mib()]
    return {"steps": done, "sequences": sequences, "seconds": round(seconds, 1),
            "steps_per_s": round(done / seconds, 2), "rss_after_warmup_mib": round(warm, 1),
            "rss_max_mib": max(after), "rss_last_mib": after[-1],
            "growth_after_warmup_mib": round(max(after) - warm, 1), "samples": samples}


def paged_churn(model, steps: int, batch: int, rng: random.Random) -> dict:
    session = model.session("paged", batch=batch)
    total_blocks = session.blocks.free
    cap = model.config.max_seq
    vocab = model.tokenizer.vocab_size
    live: dict[int, tuple[int, int]] = {}  # seq -> (last token, steps left)
    opened = closed = done = 0
    rss0, t0 = rss_mib(), time.perf_counter()
    while done < steps:
        while len(live) < batch and rng.random() < 0.7:  # open new sequences
            seq, opened = opened, opened + 1
            session.open(seq)
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, cap // 4))]
            logits = session.prefill(seq, prompt)
            room = cap - session.length(seq)
            live[seq] = (int(logits.argmax()), rng.randint(1, max(room, 1)))
        if not live:
            continue
        out = session.decode({s: t for s, (t, _) in live.items()})
        done += 1
        for s, logits in out.items():
            left = live[s][1] - 1
            if left <= 0 or rng.random() < 0.02:  # finished, or abandoned mid-way
                session.close(s)
                del live[s]
                closed += 1
            else:
                live[s] = (int(logits.argmax()), left)
    for s in list(live):
        session.close(s)
        closed += 1
    seconds = time.perf_counter() - t0
    return {"decode_steps": done, "sequences_opened": opened, "sequences_closed": closed,
            "seconds": round(seconds, 1), "blocks": total_blocks,
            "blocks_free_at_end": session.blocks.free, "open_at_end": len(session.blocks.seqs),
            "rss_start_mib": round(rss0, 1), "rss_end_mib": round(rss_mib(), 1)}


def main() -> int:
    import poot

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="reference")
    ap.add_argument("--steps", type=int, default=10_000, help="dense decode steps")
    ap.add_argument("--max-seq", type=int, default=512, help="KV capacity per sequence")
    ap.add_argument("--sample", type=int, default=100, help="steps between RSS samples")
    ap.add_argument("--slack-mib", type=float, default=16.0)
    ap.add_argument("--churn-steps", type=int, default=1000, help="paged decode steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = poot.load(args.model, args.backend, max_seq=args.max_seq)
    print(f"loaded {args.model} for {model.backend.name} on {model.device} in "
          f"{time.perf_counter() - t0:.1f} s; RSS {rss_mib():.0f} MiB", flush=True)
    dense = dense_soak(model, args.steps, args.sample, "The capital of France is")
    print(f"dense: {dense['steps']} decode steps over {dense['sequences']} sequences in "
          f"{dense['seconds']} s ({dense['steps_per_s']} steps/s); RSS after warm-up "
          f"{dense['rss_after_warmup_mib']} MiB, max {dense['rss_max_mib']}, last "
          f"{dense['rss_last_mib']} (growth {dense['growth_after_warmup_mib']} MiB)", flush=True)
    churn = paged_churn(model, args.churn_steps, args.batch, random.Random(0))
    print(f"paged churn: {churn['decode_steps']} decode steps, {churn['sequences_opened']} "
          f"sequences opened and {churn['sequences_closed']} closed in {churn['seconds']} s; "
          f"blocks free at the end {churn['blocks_free_at_end']} of {churn['blocks']}, "
          f"RSS {churn['rss_start_mib']} -> {churn['rss_end_mib']} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": model.backend.name, "device": str(model.device),
                       "max_seq": args.max_seq, "dense": dense, "churn": churn}, f, indent=1)
    flat = dense["growth_after_warmup_mib"] <= args.slack_mib
    returned = churn["blocks_free_at_end"] == churn["blocks"] and churn["open_at_end"] == 0
    print(f"memory flat after warm-up: {flat}; every block returned: {returned}")
    return 0 if flat and returned else 1


if __name__ == "__main__":
    sys.exit(main())
