"""SmolLM2's decode step on wgpu bound two ways, in one process: "as loaded" (buffers a
dispatch only reads bound read-only, outputs that would make wgpu order independent
batch-mates moved to banks: poot_wgpu.kernel.read_only, poot_wgpu.banks) and "one arena"
(every binding read_write, every value on its planned arena bytes, as before those
two), the same plan otherwise. Both are fed the same prompt, then stepped in turn
(poot-backend-vulkan/bench/fusions_ab.py's comparison): dispatches, the waits wgpu places
(poot_wgpu.step.implicit_barriers), median and fastest step, and the tokens of each.

    python3 poot-backend-wgpu/benchmarks/bindings_ab.py [--steps 16] [--random]

The real GGUF when the poot cache has it, else (or with --random) random Q4_1 weights of
SmolLM2's shape. Lines starting with "SUMMARY " are the results.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "poot-backend-vulkan", "bench"))


@contextlib.contextmanager
def one_arena():
    """Plans loaded inside bind everything read_write and move no output."""
    import poot_wgpu.kernel as kernel
    import poot_wgpu.runtime as runtime

    saved = kernel.read_only, runtime.bank_outputs
    kernel.read_only = lambda resources, writes: (False,) * len(resources)
    runtime.bank_outputs = lambda *args, **kw: []
    try:
        yield
    finally:
        kernel.read_only, runtime.bank_outputs = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--random", action="store_true")
    args = ap.parse_args()
    import poot
    from fusions_ab import compare, decoder
    from poot.models.llama import const_inputs
    from poot.plan import plan
    from poot.plugin import get_backend
    from poot.runtime.executor import Executor

    backend = get_backend("wgpu")
    if not backend.probe():
        print(f"SUMMARY wgpu | SKIPPED: {backend.unavailable_reason()}")
        return
    step, weights, prompt = decoder(args.random)
    consts = const_inputs(step, weights)
    planned = plan(poot.compile(step.graph, "wgpu"))
    exs = {"as loaded": Executor(planned, consts)}
    with one_arena():
        exs["one arena"] = Executor(planned, consts)
    compare("wgpu", exs, prompt, args.steps)


if __name__ == "__main__":
    main()
