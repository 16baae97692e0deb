"""SmolLM2's decode step counted per backend: dispatches, dependency levels (the longest
chain of kernels ordered by a read-after-write, write-after-read or write-after-write of
overlapping bytes), barriers (vulkan: the batches the recorded step cuts, less one; wgpu:
the dispatches it makes wait, poot_wgpu.step.implicit_barriers), and the kernels of one
layer by level; then the greedy token ids of a short generation. Counts, not times: run
on lavapipe they say what a GPU's step would record.

    python3 poot-backend-vulkan/bench/levels.py [--backends vulkan,wgpu] [--plans elected,gpu]
        [--max-seq 128] [--tokens 8] [--random] [--layer 1]

Each (backend, plan, POOT_LEVEL_CUTS off/on) runs in a child process, so the switch is
read fresh. "elected" is the device's own compile; "gpu" is what a GPU elects, on this
device: its table told to elect every offered fusion and wide workgroups declared where
the cuts are on. Lines starting with "SUMMARY " are the results.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys

PROMPT = "The capital of France is"


def as_gpu(backend: str) -> None:
    """Make this (software) device compile what a GPU elects."""
    if backend == "vulkan":
        import poot_vulkan.capability as cap
        import poot_vulkan.glsl as glsl
        from poot_vulkan.device import level_cuts

        glsl.wide_workgroups = lambda facts: level_cuts()
    else:
        import poot_wgpu.capability as cap
        import poot_wgpu.device as device
        from poot_wgpu.env import level_cuts

        device.wide_workgroups = lambda dev: level_cuts()
    cap.SOFTWARE_ELECT = cap.ELECT


def accesses(backend: str, step) -> tuple[list, list[str]]:
    """(byte ranges each kernel or copy touches, their names) in the step's order."""
    if backend == "vulkan":
        ops = step.ops
        return ([list(op.accesses()) for op in ops],
                [getattr(getattr(op, "pipeline", None), "name", "copy") for op in ops])
    return ([[(r["buffer"], r["offset"], r["offset"] + r["size"], w)
              for r, w in zip(d.resources, d.writes, strict=True)] for d in step.dispatches],
            [d.kernel.label for d in step.dispatches])


def levels(acc: list) -> list[int]:
    """Each operation's level: one past the deepest earlier one it conflicts with."""
    out: list[int] = []
    for i, a in enumerate(acc):
        lv = 0
        for j in range(i):
            if any(id(pb) == id(b) and s < pe and ps < e and (w or pw)
                   for b, s, e, w in a for pb, ps, pe, pw in acc[j]):
                lv = max(lv, out[j] + 1)
        out.append(lv)
    return out


def child(backend: str, plan: str, max_seq: int, tokens: int, random: bool,
          layer: int) -> dict:
    if plan == "gpu":
        as_gpu(backend)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "poot-backend-cuda", "bench"))
    from poot.models.hub import smollm2_path
    from poot.models.sampling import Sampler
    from smollm2_gpu import PROMPT_IDS, greedy, load

    random = random or smollm2_path() is None
    model = load(backend, max_seq, random)
    session = model.session()
    mode = model.sample_mode([Sampler()])
    ids = PROMPT_IDS if random else model.prompt_ids(PROMPT)
    model.prepare(session, prompt_tokens=len(ids), sample=mode)
    ex = session.executor(1, 1, mode if model.device_sampling else None)
    step = ex.executable.step
    acc, names = accesses(backend, step)
    lv = levels(acc)
    if backend == "vulkan":
        barriers = len(step.batches) - 1
    else:
        from poot_wgpu.step import implicit_barriers

        barriers = implicit_barriers(step.dispatches)
    kinds = collections.Counter(n.split("_")[1] if n.count("_") >= 2 else n for n in names)
    # one layer's kernels: the ones between its 3rd and 4th level-ordered block of a kind
    per_level = collections.defaultdict(list)
    for n, v in zip(names, lv, strict=True):
        per_level[v].append(n.removeprefix("poot_").rsplit("_", 1)[0])
    depth = max(lv) + 1
    per_layer = (depth - 4) // max(model.config.layers, 1) or 1
    first = 1 + layer * per_layer
    chain = [per_level[v] for v in range(first, min(first + per_layer + 1, depth))]
    token_ids = greedy(model, ids, tokens, on_device=True)["ids"] if tokens else []
    return {"dispatches": len(names), "levels": depth, "barriers": barriers,
            "kinds": dict(kinds.most_common()), "chain": chain, "ids": token_ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="vulkan,wgpu")
    ap.add_argument("--plans", default="elected,gpu")
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--layer", type=int, default=1, help="the layer whose chain is printed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        backend, plan = args.child.split(":")
        print("RESULT " + json.dumps(child(backend, plan, args.max_seq, args.tokens,
                                           args.random, args.layer)), flush=True)
        return
    for backend in args.backends.split(","):
        for plan in args.plans.split(","):
            row = {}
            for cuts in ("off", "on"):
                env = dict(os.environ, POOT_LEVEL_CUTS=cuts)
                cmd = [sys.executable, __file__, "--child", f"{backend}:{plan}",
                       "--max-seq", str(args.max_seq), "--tokens", str(args.tokens),
                       "--layer", str(args.layer)] + (["--random"] if args.random else [])
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode or not lines:
                    print(f"SUMMARY {backend} {plan} cuts={cuts} | FAILED rc "
                          f"{done.returncode}: {done.stderr[-2000:]}", flush=True)
                    continue
                row[cuts] = r = json.loads(lines[-1][len("RESULT "):])
                print(f"SUMMARY {backend} {plan} cuts={cuts} | {r['dispatches']} dispatches, "
                      f"{r['levels']} levels, {r['barriers']} barriers; ids {r['ids']}",
                      flush=True)
                print(f"  kinds {r['kinds']}")
                for i, kernels in enumerate(r["chain"]):
                    print(f"  layer {args.layer} level {i}: {', '.join(kernels)}")
            if len(row) == 2:
                same = row["off"]["ids"] == row["on"]["ids"]
                print(f"SUMMARY {backend} {plan} | levels {row['off']['levels']} -> "
                      f"{row['on']['levels']}, dispatches {row['off']['dispatches']} -> "
                      f"{row['on']['dispatches']}, barriers {row['off']['barriers']} -> "
                      f"{row['on']['barriers']}; token ids "
                      f"{'the same' if same else 'DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
