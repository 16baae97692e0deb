"""SmolLM2-135M (Q4_1 GGUF) and Gemma 3 270M (Q4_K_M GGUF: Q8_0, Q5_0, Q4_K and Q6_K
weights) on this CPU: poot's cpu backend (exact and fast precision), llama.cpp and poot's
reference backend side by side, measured in one run with the same thread count.

For each engine, in its own process (so peak RSS is its own): prefill of a 256-token
prompt (tok/s), greedy decode of 64 tokens (tok/s), peak resident memory (the process's, or
a child's where larger: the C compiler on a cold kernel cache). llama.cpp is
llama-cpp-python (a benchmark-only dependency: pip install 'poot-backend-cpu[bench]'),
skipped with the import error where it is not installed (a wheel builds from source in
~1 h on 2 loaded cores; faster: `CMAKE_ARGS=-DLLAMA_BUILD=OFF pip install` the sdist, build
its vendor/llama.cpp alone with cmake (`--target llama`, BUILD_SHARED_LIBS=ON, a few
minutes) and point LLAMA_CPP_LIB_PATH at the build's bin/; where llama.cpp's AMX kernel
crashes, as on one AVX-512 Xeon, configure GGML_NATIVE=OFF and GGML_AMX_INT8=OFF with the
ISA options on: docs/performance.md, 2026-12-03). The engines run back to back,
`--repeat` rounds of them, and the table gives each figure's median over the rounds with
the load average before and after: on a machine shared with other work only figures of
one run compare, and llama.cpp's OpenMP threads spin unless `OMP_WAIT_POLICY=passive` is
set for the run (poot's threads sleep by default): under load the spinning collapses.

    python poot-backend-cpu/bench/smollm2_cpu.py [--threads 2] [--repeat 3]
        [--models smollm2,gemma3] [--engines cpu,cpu/fast,llama.cpp,reference]
        # cpu/fast: --precision fast (q8 rows into the packed contractions, f16 KV);
        # cpu/apart: q, k, v and gate, up apart
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

# an engine's process imports only what it measures with (its peak RSS is the figure):
# argparse, platform, statistics and subprocess are the parent's

PROMPT_TOKENS = 256
DECODE_TOKENS = 64
TEXT = ("The history of the city begins with a small settlement on the river, where "
        "traders met to exchange grain, salt and cloth. ")


MODELS = {"smollm2": ("SmolLM2-135M Q4_1", "smollm2_path"),
          "gemma3": ("Gemma 3 270M Q4_K_M", "gemma3_path")}
PULL = {"gemma3": "gemma3-270m"}


def gguf_path(model: str = "smollm2") -> str:
    from poot.models import hub

    label, finder = MODELS[model]
    path = getattr(hub, finder)()
    if path is None:
        sys.exit(f"{label} GGUF not found: run `poot pull {PULL.get(model, model)}`")
    return str(path)


def prompt_ids(tokenize) -> list[int]:
    ids = tokenize(TEXT * 40)
    return ids[:PROMPT_TOKENS]


def run_poot(engine: str, model_name: str) -> dict:
    """A poot backend by name; "NAME/fast": at the fast precision; "NAME/apart": with q, k
    and v as three weights and gate and up as two (the model's stack_qkv and stack_ffn
    off), for comparing the stacked projections."""
    import poot

    backend, *how = engine.split("/")
    t0 = time.perf_counter()
    model = poot.load(gguf_path(model_name), backend=backend,
                      max_seq=PROMPT_TOKENS + DECODE_TOKENS + 8,
                      precision="fast" if "fast" in how else "exact")
    model.stack_qkv = model.stack_ffn = "apart" not in how
    ids = prompt_ids(model.tokenize)
    list(model.generate(ids[:8], max_tokens=2))           # plans and compiles both steps
    setup = time.perf_counter() - t0
    list(model.generate(ids, max_tokens=1))
    prefill = model.stats.prompt_tokens / model.stats.prefill_seconds
    list(model.generate(ids[:8], max_tokens=DECODE_TOKENS))
    s = model.stats
    decode = (s.generated_tokens - 1) / s.decode_seconds
    return {"prefill": prefill, "decode": decode, "setup": setup,
            "device": str(model.device)}


def run_llama(threads: int, model_name: str) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(gguf_path(model_name), n_threads=threads, n_threads_batch=threads, n_ctx=512,
                n_batch=PROMPT_TOKENS, verbose=False)
    setup = time.perf_counter() - t0
    ids = prompt_ids(lambda t: llm.tokenize(t.encode()))
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = len(ids) / (time.perf_counter() - t0)
    llm.reset()
    llm.eval(ids[:8])
    t0 = time.perf_counter()
    for _ in range(DECODE_TOKENS - 1):
        tok = llm.sample(top_k=1, temp=0.0)
        llm.eval([tok])
    decode = (DECODE_TOKENS - 1) / (time.perf_counter() - t0)
    import llama_cpp

    return {"prefill": prefill, "decode": decode, "setup": setup,
            "device": f"llama-cpp-python {llama_cpp.__version__}"}


def child(engine: str, threads: int, model_name: str) -> None:
    result = run_llama(threads, model_name) if engine == "llama.cpp" \
        else run_poot(engine, model_name)
    # the run's peak, as `/usr/bin/time -v` gives it: the process or, where larger, a
    # child it waited for (the C compiler, on a cold kernel cache)
    result["rss_mib"] = max(resource.getrusage(who).ru_maxrss for who in
                            (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
    print("RESULT " + json.dumps(result))


def measure(engine: str, threads: int, model_name: str, env: dict) -> dict | str:
    """One engine's figures from a child process, or why it gave none."""
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child", engine, "--threads",
                           str(threads), "--models", model_name], env=env,
                          capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(line[7:])


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    import argparse
    import platform
    import statistics

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--engines", default="cpu,cpu/fast,llama.cpp,reference")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    engines = args.engines.split(",")
    models = args.models.split(",")
    print(f"# {args.threads} threads, {platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load()}")
    runs = {(m, e): [] for m in models for e in engines}
    skipped: dict[tuple, str] = {}
    for rnd in range(args.repeat):
        for m in models:
            for engine in engines:
                if (m, engine) in skipped:
                    continue
                r = measure(engine, args.threads, m, env)
                if isinstance(r, str):
                    skipped[m, engine] = r
                    continue
                runs[m, engine].append(r)
                print(f"round {rnd + 1} {m:<8} {engine:<10} decode {r['decode']:7.1f} tok/s, "
                      f"prefill {r['prefill']:7.1f} tok/s, peak RSS {r['rss_mib']:4.0f} MiB, "
                      f"load {load()}", flush=True)
    print(f"# medians over {args.repeat} rounds; load average at the end {load()}")
    for m in models:
        size = os.path.getsize(gguf_path(m)) / 2**20
        print(f"\n{MODELS[m][0]} GGUF ({size:.0f} MiB)")
        print(f"{'engine':<12} {'decode tok/s':>12} {'prefill tok/s':>14} {'peak RSS MiB':>13}"
              f"  device")
        rows = {}
        for engine in engines:
            if (m, engine) in skipped:
                print(f"{engine:<12} skipped: {skipped[m, engine]}")
                continue
            rows[engine] = r = {k: statistics.median(x[k] for x in runs[m, engine])
                                for k in ("decode", "prefill", "rss_mib")}
            print(f"{engine:<12} {r['decode']:>12.1f} {r['prefill']:>14.1f} "
                  f"{r['rss_mib']:>13.0f}  {runs[m, engine][0]['device']}")
        for mine in (e for e in engines if e.startswith("cpu") and e in rows):
            for peer in ("llama.cpp", "reference"):
                if peer in rows:
                    print(f"{mine} / {peer}: decode "
                          f"{rows[mine]['decode'] / rows[peer]['decode']:.2f}x, prefill "
                          f"{rows[mine]['prefill'] / rows[peer]['prefill']:.2f}x")
            print(f"{mine} peak RSS / GGUF size: {rows[mine]['rss_mib'] / size:.2f}x")


def child_main(argv: list[str]) -> None:
    """`--child ENGINE --threads N --models MODEL`, as measure() passes them."""
    opts = dict(zip(argv[::2], argv[1::2], strict=True))
    child(opts["--child"], int(opts["--threads"]), opts["--models"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[1:])
    else:
        main()
