"""Speculative decoding on a real checkpoint: tokens/s with and without it, in one run.

    python poot-core/benchmarks/speculate.py [--backend cpu|cuda|...] [--model smollm2]
        [--speculate lookup --speculate lookup/logits --speculate self:8 ...]
        [--draft-tokens 7] [--max-tokens 160] [--repeat 2]

Two workloads, greedy, through Model.generate: "edit" (the chat template asks the model to
fix one typo in a paragraph, so its answer repeats most of its input: where prompt lookup
gains) and "free" (a story from a one-line request: little to look up). For each workload
it runs plain decoding and each --speculate mode, interleaved, `--repeat` times, and
prints each one's median decode tokens/s, the median of its ratios to the plain run of
the same round (a shared machine's load changes between rounds more than within one),
the acceptance rate, tokens per verification step, and whether the text is the plain
run's (it must be: greedy speculation is exact), and the step times AdaptiveK measured
("step ms": a plain step, proposing one token, each verification width). A greedy
verification reads back each row's argmax id; a mode written MODE/logits runs MODE with
verification reading back every row's logits instead (the path before argmax
verification), with step times of its own, so one run compares the two. Last, where one
greedy verification step's time goes, each width reading back logits and argmax ids, and
a plain argmax decode step: the median of `--calls` steps (verify, acceptance and
rollback), of the backend's executable.run() within them (the step's launch and its wait
for the device) and of the rest (the host's: slot values and their upload, the read-back,
acceptance, rollback). Plans are compiled before the first timed run. Writes the table to
$OUT/speculate.txt when OUT is set.
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from contextlib import contextmanager
from statistics import median
from time import perf_counter

EDIT = ("Fix the spelling mistake in this paragraph and repeat it otherwise unchanged:\n\n"
        "The city council met on Tuesday evening to discuss the new budget for the public "
        "library. After a long debate, the members agreed to extend the opening hours on "
        "weekends, to buy more books for children, and to repair the roof before the winter "
        "season begins. The mayor thanked the volunteers who organized the petition and "
        "promissed that the library would remain open during the repairs.")
FREE = "Write a short story about a robot who learns to paint."
WORKLOADS = {"edit": EDIT, "free": FREE}
#: the suffix of a mode whose greedy verification reads back every row's logits
LOGITS = "/logits"


@contextmanager
def verifying(mode: str | None):
    """Run `mode` as it is, or, for MODE/logits, with greedy verification reading back
    every row's logits (speculate.verify_sample answering None); yields the mode
    Model.generate takes."""
    from poot.models import speculate as spec

    if mode is None or not mode.endswith(LOGITS):
        yield mode
        return
    saved = spec.verify_sample
    spec.verify_sample = lambda sample: None
    try:
        yield mode.removesuffix(LOGITS)
    finally:
        spec.verify_sample = saved


def step_breakdown(model, prompt: str, widths: list[int], calls: int) -> list[str]:
    """Lines of where a greedy verification step's time goes (see the module docstring):
    each width reading back logits, then argmax ids, and a plain argmax decode step."""
    from poot.models import speculate as spec
    from poot.models.sampling import Sampler
    from poot.runtime.session import scoring

    s = model.session()
    ids = model.prompt_ids(prompt, True)
    seq = object()
    s.open(seq)
    lines = []
    try:
        s.prefill(seq, ids)
        history = list(ids)

        def verify(width: int, sample: str | None):
            drafts = [int(t) for t in ids[1:width]]
            got = s.verify(seq, [ids[-1], *drafts], width, sample)
            if sample is None:
                spec.accept(got, drafts, None, Sampler(), history)
            else:
                spec.accept_ids(got, drafts)
            s.rollback(seq, width)

        def plain(width: int, sample: str):
            s.decode_sampled({seq: ids[-1]}, sample, lambda b: {})
            s.rollback(seq, 1)

        cases = [(w, how, verify) for w in widths for how in (None, "argmax")]
        for width, how, step in [*cases, (1, "argmax", plain)]:
            exe = s.executor(width, 1, how if step is plain else scoring(how)).executable
            inside: list[float] = []
            run = exe.run

            def timed_run(run=run, inside=inside):
                t0 = perf_counter()
                run()
                inside.append(perf_counter() - t0)

            exe.run = timed_run
            total = []
            try:
                for i in range(calls + 3):        # 3 first: a device may record the step
                    del inside[:]
                    t0 = perf_counter()
                    step(width, how)
                    if i >= 3:
                        total.append((perf_counter() - t0, sum(inside)))
            finally:
                del exe.run
            whole = median(t for t, _ in total)
            dev = median(r for _, r in total)
            host = median(t - r for t, r in total)
            what = "plain argmax decode step" if step is plain else \
                f"verify width {width}, {'argmax ids' if how else 'logits'}"
            lines.append(f"      {what:30s}: step {1e3 * whole:7.3f} ms, executable.run "
                         f"{1e3 * dev:7.3f} ms, host {1e3 * host:7.3f} ms "
                         f"(median of {calls})")
    finally:
        s.close(seq)
    return lines


def main() -> None:
    import poot

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--speculate", action="append", default=None,
                    help="a mode to compare, MODE/logits for MODE verifying by logits "
                    "(repeatable; default: lookup, lookup/logits and self:8)")
    ap.add_argument("--draft-tokens", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), default=None)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--calls", type=int, default=20,
                    help="steps timed per line of the step breakdown (0: none)")
    args = ap.parse_args()
    modes = args.speculate or ["lookup", "lookup" + LOGITS, "self:8"]
    t0 = time.perf_counter()
    model = poot.load(args.model, args.backend, max_seq=args.max_seq)
    print(f"{model.checkpoint.path.name} on {model.backend.name} ({model.device}), "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, load "
          f"{os.getloadavg()[0]:.1f}; loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    lines = []
    #: each mode's AdaptiveK step times (a proposer keeps them for its next sequence;
    #: MODE/logits shares MODE's proposer but not its times)
    clocks: dict[str, dict] = {}
    for name in args.workload or ["edit", "free"]:
        prompt = WORKLOADS[name]
        tps: dict[str, list[float]] = {}
        ratios: dict[str, list[float]] = {}
        seen: dict[str, tuple] = {}
        for mode in [None, *modes]:          # compile every plan before timing
            with verifying(mode) as run:
                model.prepare(model.session(), len(model.prompt_ids(prompt, True)),
                              "argmax", run, args.draft_tokens)
        for _ in range(args.repeat):
            for mode in [None, *modes]:
                with verifying(mode) as run:
                    if run is not None:
                        model.proposer(run).step_seconds = clocks.setdefault(mode, {})
                    text = model.generate(prompt, chat=True, max_tokens=args.max_tokens,
                                          speculate=run, draft_tokens=args.draft_tokens)
                s = model.stats
                key = mode or "plain"
                tps.setdefault(key, []).append(s.decode_tps)
                ratios.setdefault(key, []).append(s.decode_tps / tps["plain"][-1])
                seen[key] = (text, s.generated_tokens, s.acceptance, s.verified,
                             s.accepted, dict(s.step_seconds))
        plain_text = seen["plain"][0]
        for key in ["plain", *modes]:
            text, n, rate, steps, acc, seconds = seen[key]
            per = (acc + steps) / steps if steps else 0.0
            line = (f"{name:5s} {key:13s} {n:4d} tokens {median(tps[key]):7.1f} tok/s "
                    f"x{median(ratios[key]):.2f} (rounds: "
                    f"{' '.join(f'{r:.2f}' for r in ratios[key])})  acceptance "
                    f"{100 * rate:5.1f}%  "
                    f"{per:4.2f} tok/verify  same text: {text == plain_text}")
            print(line, flush=True)
            lines.append(line)
            if seconds:       # what AdaptiveK measured in the last round
                line = "      step ms: " + ", ".join(f"{w}: {1e3 * t:.3f}"
                                                     for w, t in seconds.items())
                print(line, flush=True)
                lines.append(line)
        print(f"      answer: {plain_text[:160]!r}...", flush=True)
    if args.calls:
        print("where a greedy step's time goes (the edit prompt):", flush=True)
        from poot.models.speculate import widths

        for line in step_breakdown(model, EDIT, widths(args.draft_tokens), args.calls):
            print(line, flush=True)
            lines.append(line)
    print(f"load {os.getloadavg()[0]:.1f} at the end", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "speculate.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
