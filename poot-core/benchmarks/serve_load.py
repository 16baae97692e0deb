"""`poot serve` under an open-loop load, measured as `vllm bench serve` measures a server.

A seeded synthetic workload: `requests` prompts whose lengths (in words) and answer lengths
(in tokens) are drawn uniformly within +-range_ratio of input_words and output_tokens; a
share (prefix_share) of them start with one system text of prefix_words words, the rest
with text of their own; they arrive as a Poisson process at `rate` requests a second
(inf: all at once), at most max_concurrency in flight (0: no cap). Each streams a greedy
completion that runs to its length (ignore_eos). Per server of --url (comma-separated,
each in turn: e.g. one with the prefix cache and one started with --no-prefix-cache):
duration, request throughput, output and total tokens/s, and TTFT, TPOT (time per output
token after the first), ITL (between streamed chunks) and E2E latency at mean, p50, p90
and p99; the prompt tokens the server prefilled and found cached (GET /stats); across
servers, whether the greedy texts are the same. Lines starting "SUMMARY " are for
collecting scripts.

    poot serve smollm2 --port 8000 & poot serve smollm2 --port 8001 --no-prefix-cache &
    python poot-core/benchmarks/serve_load.py --requests 200 --rate 8 --prefix-share 0.5 \
        --url http://127.0.0.1:8000,http://127.0.0.1:8001
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_bench import WORDS, percentile, shared_text, stats, stream_one  # noqa: E402


@dataclass(frozen=True)
class Workload:
    requests: int = 200
    rate: float = math.inf
    input_words: int = 200
    output_tokens: int = 128
    range_ratio: float = 0.5
    prefix_share: float = 0.5
    prefix_words: int = 400
    max_concurrency: int = 0
    seed: int = 0

    def schedule(self) -> list[tuple[float, str, int]]:
        """(arrival second, prompt, max_tokens) of each request, the same for a seed."""
        rng = random.Random(self.seed)
        system = shared_text(self.prefix_words, self.seed)

        def drawn(mean: int) -> int:
            lo = max(1, round(mean * (1 - self.range_ratio)))
            return rng.randint(lo, max(lo, round(mean * (1 + self.range_ratio))))

        out, t = [], 0.0
        for i in range(self.requests):
            words = " ".join(rng.choice(WORDS) for _ in range(drawn(self.input_words)))
            head = system if rng.random() < self.prefix_share else f"Note {i}: "
            out.append((t, f"{head}{words}\nAnswer:", drawn(self.output_tokens)))
            if self.rate != math.inf:
                t += rng.expovariate(self.rate)
        return out


def run(url: str, model: str, w: Workload) -> dict:
    """The workload against one server: each request's stream_one record (or its
    failure), the wall time, and the server's prefill counters over the run."""
    plan = w.schedule()
    runs: list[dict | None] = [None] * len(plan)
    failures: list[str] = []
    gate = threading.BoundedSemaphore(w.max_concurrency) if w.max_concurrency else None

    def client(i: int, prompt: str, max_tokens: int) -> None:
        try:
            runs[i] = stream_one(url, model, prompt, max_tokens)
        except Exception as exc:  # a failed request is counted, the run goes on
            failures.append(f"request {i}: {type(exc).__name__}: {exc}")
        finally:
            if gate:
                gate.release()

    before = stats(url)
    threads = []
    t0 = time.perf_counter()
    for i, (at, prompt, max_tokens) in enumerate(plan):
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        if gate:
            gate.acquire()
        threads.append(threading.Thread(target=client, args=(i, prompt, max_tokens)))
        threads[-1].start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = stats(url)
    counters = {k: after.get(k, 0) - before.get(k, 0)
                for k in ("prompt_tokens", "prefilled_tokens", "cached_prompt_tokens")}
    return {"runs": runs, "failures": failures, "wall_s": wall, **counters}


def metrics(report: dict) -> dict:
    """Throughput and the latency distributions (seconds) of a `run` report."""
    done = [r for r in report["runs"] if r is not None]
    wall = report["wall_s"]
    out_tokens = sum(r["tokens"] for r in done)
    lat = {"ttft": [r["first"] - r["start"] for r in done],
           "tpot": [(r["end"] - r["first"]) / (r["tokens"] - 1) for r in done
                    if r["tokens"] > 1],
           "itl": [b - a for r in done for a, b in zip(r["times"], r["times"][1:])],
           "e2e": [r["end"] - r["start"] for r in done]}
    dist = {name: {"mean": statistics.fmean(xs), "p50": percentile(xs, 0.5),
                   "p90": percentile(xs, 0.9), "p99": percentile(xs, 0.99)}
            for name, xs in lat.items() if xs}
    return {"completed": len(done), "failed": len(report["failures"]), "wall_s": wall,
            "req_per_s": len(done) / wall, "output_tps": out_tokens / wall,
            "total_tps": (out_tokens + sum(r["prompt_tokens"] for r in done)) / wall,
            **dist}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000",
                    help="comma-separated servers, each in turn")
    ap.add_argument("--model", default="smollm2")
    for f in dataclasses.fields(Workload):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                        default=f.default)
    args = ap.parse_args()
    w = Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Workload)})
    print(f"workload: {w}")
    texts = {}
    for url in args.url.split(","):
        s = stats(url)
        cache = "on" if s.get("prefix_cache") else "off"
        stream_one(url, args.model, "Hello", 4)                 # warm the server's paths
        report = run(url, args.model, w)
        m = metrics(report)
        texts[url] = [r and r["text"] for r in report["runs"]]
        print(f"server {url} ({s['model']}, batch {s['max_batch']}, prefix cache {cache}): "
              f"{m['completed']} done, {m['failed']} failed in {m['wall_s']:.2f} s; "
              f"{m['req_per_s']:.2f} req/s, output {m['output_tps']:.1f} tok/s, total "
              f"{m['total_tps']:.1f} tok/s; prompt tokens {report['prompt_tokens']}, "
              f"prefilled {report['prefilled_tokens']}, cached "
              f"{report['cached_prompt_tokens']}")
        for failure in report["failures"][:5]:
            print(f"  {failure}")
        for name in ("ttft", "tpot", "itl", "e2e"):
            d = m.get(name)
            if d:
                row = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in d.items())
                print(f"  {name.upper():4s} ms: {row}")
                print(f"SUMMARY serve load {url} cache {cache}: {name.upper()} p50 / p99 ms | "
                      f"{1e3 * d['p50']:.1f} / {1e3 * d['p99']:.1f}")
        print(f"SUMMARY serve load {url} cache {cache}: output tok/s | {m['output_tps']:.1f}")
    urls = list(texts)
    for url in urls[1:]:
        same = sum(a == b and a is not None for a, b in zip(texts[urls[0]], texts[url]))
        print(f"SUMMARY serve load: greedy texts of {url} as {urls[0]}'s | {same} of "
              f"{w.requests}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
