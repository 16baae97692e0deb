"""The host cost of a wgpu decode step (SmolLM2 Q4_1 by default): its command buffer
encoded before each submit, or ahead (right after the previous submit, while the device
runs that step: poot_wgpu.step.RecordedStep's default), on one loaded plan, alternating.

    python poot-backend-wgpu/benchmarks/encode_ahead.py [--tokens 12] [--rounds 2]

For each mode and round: decode tok/s of a greedy generation (the decode plan `poot run`
uses: the argmax sampled in the graph), the host time from the start of a step's run to the
return of its submit (the part of a step the device waits for), the submit alone, and the
text; then the encode of one step timed on its own.
"""
from __future__ import annotations

import argparse
import statistics
import time

PROMPT = "The capital of France is"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import poot
    from poot.models.sampling import Sampler

    model = poot.load(args.model, "wgpu", max_seq=64)
    session = model.session()
    mode = model.sample_mode([Sampler()])
    model.prepare(session, prompt_tokens=len(model.prompt_ids(PROMPT)), sample=mode)
    executable = session.executor(1, 1, mode).executable
    step = executable.step
    queue = step.dev.queue
    submit, marks = queue.submit, {}

    def timed_submit(commands):
        marks["submit"] = time.perf_counter()
        submit(commands)
        marks["done"] = time.perf_counter()

    queue.submit = timed_submit           # this process's queue object only
    run = executable.run
    print(f"{args.model} on {model.device}: {len(step.dispatches)} dispatches a decode step")
    for r in range(args.rounds):
        for ahead in (False, True):
            step.ahead, step._next = ahead, None
            crit, alone = [], []

            def timed_run():
                t0 = time.perf_counter()
                run()
                crit.append(marks["done"] - t0)
                alone.append(marks["done"] - marks["submit"])

            executable.run = timed_run
            text = model.generate(PROMPT, max_tokens=args.tokens)
            del executable.run
            n = args.tokens - 1           # the decode steps (the rest ran the prompt)
            crit, alone = crit[-n:], alone[-n:]
            print(f"round {r} {'ahead ' if ahead else 'before'}: decode "
                  f"{model.stats.decode_tps:.3f} tok/s; run to submit returned: median "
                  f"{1e3 * statistics.median(crit):.3f} ms (min {1e3 * min(crit):.3f}); "
                  f"submit alone: median {1e3 * statistics.median(alone):.3f} ms | {text!r}")
    queue.submit = submit
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step.encode()
        times.append(time.perf_counter() - t0)
    print(f"encode alone: min {1e3 * min(times):.3f} ms, median "
          f"{1e3 * statistics.median(times):.3f} ms")


if __name__ == "__main__":
    main()
