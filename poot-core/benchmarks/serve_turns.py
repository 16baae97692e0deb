"""Where a `poot serve` scheduler turn goes: the step on the device against the host's loop.

Runs the Engine in this process (no HTTP), N requests at once (greedy, ignore_eos, distinct
prompts, --max-tokens each), and times every turn of the loop: the executor steps inside it
(slot upload, the step, the token ids read back) and the rest (admission, sampler slots,
text decoding, events); the engine waits for every step (overlap=False), so that a turn is
its step plus the host's part. With --profile, cProfile over the whole run prints the host
functions that cost most, steps excluded by subtraction ("tottime" of the step calls).

    python poot-core/benchmarks/serve_turns.py --backend reference --clients 32 \
        --max-tokens 16 --max-seq 128 --profile
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import threading
import time

#: the host-side modules a profile lists (the backend's own step work is left out)
HOST = r"serve|session|kv\.py|sample_graph|sampling|tokenizer|executor"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    from poot.models.runner import load
    from poot.runtime.executor import Executor
    from poot.serve.engine import Engine
    from poot.serve.protocol import Generation

    model = load(args.model, args.backend, kv="paged", max_seq=args.max_seq)
    engine = Engine(model, name="m", max_batch=args.clients, max_queue=args.clients,
                    overlap=False)
    t0 = time.perf_counter()
    engine.warm(wait=True)
    print(f"{model.backend.name} ({model.device}): warm {time.perf_counter() - t0:.1f} s, "
          f"decode plans {engine.session.decode_batches}")

    step_time = [0.0]
    real_step = Executor.step

    def timed_step(self, *a, **k):
        t = time.perf_counter()
        try:
            return real_step(self, *a, **k)
        finally:
            step_time[0] += time.perf_counter() - t

    Executor.step = timed_step
    #: (start, step s, decoding rows) of each decode step; a turn is one start to the next
    turns: list[tuple[float, float, int]] = []
    real_decode, real_turns = engine._decode, engine._turns

    def decode(jobs):
        step_time[0] = 0.0
        t = time.perf_counter()
        real_decode(jobs)
        turns.append((t, step_time[0], len(jobs)))

    engine._decode = decode
    prof = cProfile.Profile() if args.profile else None
    if prof:
        engine._turns = lambda: prof.runcall(real_turns)
    done = threading.Semaphore(0)
    tok = model.tokenizer
    prompts = [f"Question {i}: tell me about the number {i * 7}." for i in range(args.clients)]

    def emit(event):
        if event.kind != "text":
            done.release()

    engine.start()
    t0 = time.perf_counter()
    for p in prompts:
        engine.submit(Generation("completion", "m", tok.encode(p), args.max_tokens,
                                 temperature=0.0, ignore_eos=True), emit)
    for _ in prompts:
        done.acquire()
    wall = time.perf_counter() - t0
    engine.close()
    full = [(b[0] - a[0], a[1]) for a, b in zip(turns, turns[1:])
            if a[2] == b[2] == args.clients]
    print(f"{len(prompts)} requests x {args.max_tokens} tokens in {wall:.2f} s "
          f"({len(prompts) * args.max_tokens / wall:.1f} tok/s), {len(turns)} decode steps")
    if full:
        turn = statistics.median(t[0] for t in full)
        step = statistics.median(t[1] for t in full)
        print(f"decode turns with all {args.clients} rows ({len(full)}): median {turn * 1e3:.2f}"
              f" ms, of which steps {step * 1e3:.2f} ms, host {(turn - step) * 1e3:.2f} ms")
    if prof:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(HOST, 30)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
