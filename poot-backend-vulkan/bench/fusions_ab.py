"""SmolLM2's decode step with and without the fusions vulkan and wgpu declare (the RMSNorm
inside the contractions that read it, the SwiGLU inside the gate|up GEMV), in one process:
"fused" asks for all of them (`Policy(fuse=OFFERED)`), "elected" is a plain compile (what
the device elects: all of them on a GPU, the SwiGLU alone on lavapipe), "apart" runs
without them. The plans are loaded, fed the same prompt, then stepped in turn, so machine
load falls on all alike. Per backend: dispatches, dependent batches (vulkan) or the waits
wgpu places (poot_wgpu.step.implicit_barriers), the median
and fastest step, and on vulkan the GPU profile by kernel kind of each plan (timestamps
after every operation, poot_vulkan.profile).

    python3 poot-backend-vulkan/bench/fusions_ab.py [--backends vulkan,wgpu] [--steps 12]
        [--random]

The real GGUF when the poot cache has it, else (or with --random) random Q4_1 weights of
SmolLM2's shape. Lines starting with "SUMMARY " are the results.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import numpy as np

#: the passes that make the fused step; the other plan runs without them
FUSIONS = frozenset({"norm_contraction", "gated"})


def executors(backend: str, step, weights) -> dict:
    import poot
    from poot.compiler.policy import Policy
    from poot.models.llama import const_inputs
    from poot.plan import plan
    from poot.runtime.executor import Executor

    consts = const_inputs(step, weights)
    offered = importlib.import_module(f"poot_{backend}.capability").OFFERED
    policies = (("fused", Policy(fuse=offered)), ("elected", None),
                ("apart", Policy(disable=FUSIONS)))
    return {name: Executor(plan(poot.compile(step.graph, backend, policy=policy)), consts)
            for name, policy in policies}


def run(ex, pos: int, token: int) -> int:
    slots = {"tokens": np.array([token], np.int32), "pos": np.array([pos], np.int32)}
    return int(ex.step(slots).result[-1])


def compare(backend: str, exs: dict, prompt: list[int], steps: int) -> None:
    """Executors `exs` (by name) fed `prompt`, then stepped in turn `steps` times."""
    state = {}
    for name, ex in exs.items():
        for pos, token in enumerate(prompt):
            nxt = run(ex, pos, token)
        state[name] = (len(prompt), nxt, [], [])
    for _ in range(steps):
        for name, ex in exs.items():
            pos, token, times, tokens = state[name]
            t0 = time.perf_counter()
            nxt = run(ex, pos, token)
            times.append(time.perf_counter() - t0)
            tokens.append(nxt)
            state[name] = (pos + 1, nxt, times, tokens)
    for name, ex in exs.items():
        times, tokens = state[name][2], state[name][3]
        recorded = ex.executable.step
        if backend == "vulkan":
            shape = (f"{ex.executable.dispatches} dispatches, {len(recorded.batches)} "
                     f"dependent batches")
        else:
            from poot_wgpu.step import implicit_barriers

            shape = (f"{len(recorded.dispatches)} dispatches, "
                     f"{implicit_barriers(recorded.dispatches)} implicit barriers")
        print(f"SUMMARY {backend} {name} | {shape}; step median "
              f"{1e3 * statistics.median(times):.1f} ms, fastest {1e3 * min(times):.1f} ms "
              f"over {len(times)}; tokens {tokens}", flush=True)
    if backend == "vulkan":
        from poot_vulkan.profile import profile

        for name, ex in exs.items():
            prof = profile(ex.executable.step, runs=5)
            print(f"--- vulkan {name}: GPU span {prof.span_ns / 1e6:.3f} ms")
            print(prof.table(), flush=True)


def decoder(random: bool):
    """SmolLM2's decode step graph, its weights and a prompt's ids: the real GGUF where the
    poot cache has it (unless `random`), else random Q4_1 weights of its shape."""
    from poot.models.greedy import open_decoder, random_decoder
    from poot.models.hub import smollm2_path
    from poot.models.tokenizer import Tokenizer

    path = None if random else smollm2_path()
    if path is None:
        step, weights = random_decoder(max_seq=64, sample="argmax")
        prompt = [1, 504, 3575, 282, 4649, 314]
    else:
        step, weights = open_decoder(str(path), max_seq=64, sample="argmax")
        prompt = Tokenizer.from_gguf(path).encode("The capital of France is")
    print(f"SUMMARY weights | {path or 'random Q4_1 of SmolLM2 shape'}", flush=True)
    return step, weights, prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="vulkan,wgpu")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--random", action="store_true")
    args = ap.parse_args()
    from poot.plugin import get_backend

    step, weights, prompt = decoder(args.random)
    for backend in args.backends.split(","):
        b = get_backend(backend)
        if not b.probe():
            print(f"SUMMARY {backend} | SKIPPED: {b.unavailable_reason()}")
            continue
        compare(backend, executors(backend, step, weights), prompt, args.steps)


if __name__ == "__main__":
    main()
