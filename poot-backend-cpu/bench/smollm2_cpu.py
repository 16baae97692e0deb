"""SmolLM2-135M (Q4_1 GGUF) on this CPU: poot's cpu backend, llama.cpp and poot's reference
backend side by side, measured in one run with the same thread count.

For each engine, in its own process (so peak RSS is its own): prefill of a 256-token
prompt (tok/s), greedy decode of 64 tokens (tok/s), peak resident memory. llama.cpp is
llama-cpp-python (a benchmark-only dependency: pip install 'poot-backend-cpu[bench]'),
skipped with the import error where it is not installed (a wheel builds from source in
~1 h on 2 loaded cores; faster: `CMAKE_ARGS=-DLLAMA_BUILD=OFF pip install` the sdist, build
its vendor/llama.cpp alone with cmake (`--target llama`, BUILD_SHARED_LIBS=ON, a few
minutes) and point LLAMA_CPP_LIB_PATH at the build's bin/; where llama.cpp's AMX kernel
crashes, as on one AVX-512 Xeon, configure GGML_NATIVE=OFF and GGML_AMX_INT8=OFF with the
ISA options on: docs/performance.md, 2026-12-03). The engines run back to back,
`--repeat` rounds of them, and the table gives each figure's median over the rounds with
the load average before and after: on a machine shared with other work only figures of
one run compare.

    python poot-backend-cpu/bench/smollm2_cpu.py [--threads 2] [--repeat 3]
        [--engines cpu,llama.cpp,reference]   # cpu/apart: q, k, v and gate, up apart
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

PROMPT_TOKENS = 256
DECODE_TOKENS = 64
TEXT = ("The history of the city begins with a small settlement on the river, where "
        "traders met to exchange grain, salt and cloth. ")


def gguf_path() -> str:
    from poot.models.hub import smollm2_path

    path = smollm2_path()
    if path is None:
        sys.exit("SmolLM2 GGUF not found: run `poot pull smollm2`")
    return str(path)


def prompt_ids(tokenize) -> list[int]:
    ids = tokenize(TEXT * 40)
    return ids[:PROMPT_TOKENS]


def run_poot(engine: str) -> dict:
    """A poot backend by name; "NAME/apart": with q, k and v as three weights and gate and
    up as two (the model's stack_qkv and stack_ffn off), for comparing the stacked
    projections."""
    import poot

    backend, _, how = engine.partition("/")
    t0 = time.perf_counter()
    model = poot.load(gguf_path(), backend=backend, max_seq=PROMPT_TOKENS + DECODE_TOKENS + 8)
    model.stack_qkv = model.stack_ffn = how != "apart"
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


def run_llama(threads: int) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(gguf_path(), n_threads=threads, n_threads_batch=threads, n_ctx=512,
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


def child(engine: str, threads: int) -> None:
    result = run_llama(threads) if engine == "llama.cpp" else run_poot(engine)
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def measure(engine: str, threads: int, env: dict) -> dict | str:
    """One engine's figures from a child process, or why it gave none."""
    proc = subprocess.run([sys.executable, __file__, "--child", engine, "--threads",
                           str(threads)], env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(line[7:])


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", default="cpu,llama.cpp,reference")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.threads)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    size = os.path.getsize(gguf_path()) / 2**20
    engines = args.engines.split(",")
    print(f"# SmolLM2-135M Q4_1 GGUF ({size:.0f} MiB), {args.threads} threads, "
          f"{platform.processor() or platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load()}")
    runs: dict[str, list[dict]] = {e: [] for e in engines}
    skipped: dict[str, str] = {}
    for rnd in range(args.repeat):
        for engine in engines:
            if engine in skipped:
                continue
            r = measure(engine, args.threads, env)
            if isinstance(r, str):
                skipped[engine] = r
                continue
            runs[engine].append(r)
            print(f"round {rnd + 1} {engine:<10} decode {r['decode']:7.1f} tok/s, prefill "
                  f"{r['prefill']:7.1f} tok/s, peak RSS {r['rss_mib']:4.0f} MiB, "
                  f"load {load()}", flush=True)
    print(f"# medians over {args.repeat} rounds; load average at the end {load()}")
    print(f"{'engine':<12} {'decode tok/s':>12} {'prefill tok/s':>14} {'peak RSS MiB':>13}"
          f"  device")
    rows = {}
    for engine in engines:
        if engine in skipped:
            print(f"{engine:<12} skipped: {skipped[engine]}")
            continue
        rows[engine] = r = {k: statistics.median(x[k] for x in runs[engine])
                            for k in ("decode", "prefill", "rss_mib")}
        print(f"{engine:<12} {r['decode']:>12.1f} {r['prefill']:>14.1f} {r['rss_mib']:>13.0f}"
              f"  {runs[engine][0]['device']}")
    if "cpu" in rows:
        cpu = rows["cpu"]
        for peer in ("llama.cpp", "reference"):
            if peer in rows:
                print(f"cpu / {peer}: decode {cpu['decode'] / rows[peer]['decode']:.2f}x, "
                      f"prefill {cpu['prefill'] / rows[peer]['prefill']:.2f}x")
        print(f"cpu peak RSS / GGUF size: {cpu['rss_mib'] / size:.2f}x")


if __name__ == "__main__":
    main()
