"""The C source of every plan SmolLM2 runs on the cpu backend stays within a byte budget.

A plan's translation unit is printed on every run that makes the plan (and hashed to find
its cached library), so its size is paid on every start: an expression printed as a tree
instead of a DAG once made the sampled decode step 7 MB (10 s per `poot run`). The
budgets sit about a quarter above the measured sizes; growth past one is a regression to
explain (raise the budget in the same change, with the reason), not noise.

`python poot-backend-cpu/tests/test_cpu_source_budget.py` prints every plan's size, its
largest kernel and the time to make its source.
"""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow

#: (tokens, batch, kv, sampling mode, head rows) -> bytes of the whole translation unit;
#: `poot run` makes the first four, `poot serve --max-batch 8` the paged ones
BUDGETS = {
    (32, 1, "dense", None, "rows"): 222_000,
    (1, 1, "dense", None, "all"): 140_000,
    (1, 1, "dense", "argmax", "all"): 141_000,
    (1, 1, "dense", "full", "all"): 174_000,
    (1, 8, "paged", "argmax", "all"): 257_000,
    (1, 8, "paged", "full", "all"): 304_000,
    (8, 8, "paged", None, "rows"): 253_000,
}
#: bytes of any one kernel function
KERNEL_BUDGET = 40_000
MAX_SEQ = 256


def kernel_sizes(source: str) -> dict[str, int]:
    """Bytes of each kernel function of a step source (to the next definition)."""
    sizes, name = {}, None
    for line in source.splitlines():
        if line.startswith("void poot_step"):
            name = None
        elif line.startswith("static void poot_"):
            name = line.split("(")[0].split()[-1]
            sizes[name] = 0
        if name is not None:
            sizes[name] += len(line) + 1
    return sizes


def step_source(model, key) -> str:
    from poot.plan import plan
    from poot_cpu.step import build_step

    tokens, batch, kv, sample, logits = key
    pool = MAX_SEQ * batch if kv == "paged" else None
    graph = model.step_graph(tokens, batch, kv, pool=pool, sample=sample, logits=logits)
    return build_step(plan(graph, (model.backend, model.device))).source


def measure(path) -> dict:
    """key -> (bytes, (largest kernel, its bytes), seconds to make the source)."""
    from poot.models.runner import load

    model = load(str(path), "cpu", max_seq=MAX_SEQ)
    out = {}
    for key in BUDGETS:
        t0 = time.perf_counter()
        source = step_source(model, key)
        took = time.perf_counter() - t0
        out[key] = (len(source), max(kernel_sizes(source).items(), key=lambda kv: kv[1]),
                    took)
    return out


def test_every_smollm2_plan_source_is_within_its_budget(cpu_backend, smollm2_gguf):
    over = []
    for key, (size, (kernel, kernel_bytes), _) in measure(smollm2_gguf).items():
        if size > BUDGETS[key]:
            over.append(f"{key}: {size} bytes (budget {BUDGETS[key]})")
        if kernel_bytes > KERNEL_BUDGET:
            over.append(f"{key}: kernel {kernel} has {kernel_bytes} bytes "
                        f"(budget {KERNEL_BUDGET})")
    assert not over, "\n".join(over)


def test_kernel_sizes_split_at_each_definition():
    source = ("#include <x.h>\nstatic void poot_a(int x) {\n}\n"
              "static void poot_b(void) {\n  f();\n}\nvoid poot_step(char** R) {\n}\n")
    assert kernel_sizes(source) == {"poot_a": len("static void poot_a(int x) {\n}\n"),
                                    "poot_b": len("static void poot_b(void) {\n  f();\n}\n")}


if __name__ == "__main__":
    from poot.models.hub import smollm2_path

    for key, (size, (kernel, kernel_bytes), took) in measure(smollm2_path()).items():
        print(f"{key}: {size:,} bytes (budget {BUDGETS[key]:,}); largest kernel {kernel} "
              f"{kernel_bytes:,} bytes; made in {took:.2f} s")
