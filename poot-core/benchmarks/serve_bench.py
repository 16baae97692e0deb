"""`poot serve` under load: N concurrent streaming clients against a live server.

For each N in --clients, the same N requests (distinct prompts, greedy, --max-tokens each,
ignore_eos so every answer has its full length) are sent twice:
- together, one client thread each: aggregate tokens/s (all answers' tokens over the wall
  time from the first send to the last token), per request time to first token and
  tokens/s after it;
- one at a time, in the same order: the aggregate tokens/s of serving them serially.
The greedy texts of the two ways are compared (batching must change nothing but speed).
Last, the ratio the server's batching buys: aggregate tokens/s with the most clients over
the single-client figure. Lines starting "SUMMARY " are for collecting scripts.

Clients are plain http.client connections in threads (no client library to install where
the server runs); token counts come from the server's usage chunk.

    poot serve smollm2 --max-batch 32 &
    python poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000 --clients 1,8,32

--shared-prefix WORDS runs the shared-prefix workload instead, against each server of --url
(comma-separated: e.g. one with the prefix cache and one started with --no-prefix-cache):
every prompt is one seeded system text of WORDS words followed by a question of its own.
One request with the shared text goes first (a deployed server has served its system prompt
before), then for each N in --clients, N clients at once; it reports TTFT p50 and p90, the
prompt tokens the server prefilled and found cached (GET /stats), and, across servers, the
TTFT p50 ratio and whether the greedy texts are the same.

    poot serve smollm2 --port 8000 & poot serve smollm2 --port 8001 --no-prefix-cache &
    python poot-core/benchmarks/serve_bench.py --url http://127.0.0.1:8000,http://127.0.0.1:8001 \
        --shared-prefix 400 --clients 8 --max-tokens 16
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlsplit

PROMPTS = [
    "Once upon a time, in a small village by the sea,", "The history of the printing press",
    "Write a short story about a robot who learns to paint.", "The best way to learn a language",
    "In the year 2300, humanity", "A recipe for bread: first,", "The rules of chess are",
    "Dear diary, today", "The mitochondria is", "Ten facts about the ocean:",
    "How do airplanes fly?", "The old lighthouse keeper", "An essay on the value of sleep",
    "The detective opened the door and", "Photosynthesis is the process", "My grandmother told me",
]


def stream_one(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streaming completion; the times of its send, each text chunk ("times"), first
    token and end, its tokens (prompt tokens too)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read().decode()}")
    first, tokens, prompt_tokens, text, times = None, 0, 0, [], []
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            prompt_tokens = chunk["usage"]["prompt_tokens"]
        elif chunk["choices"] and chunk["choices"][0]["text"]:
            text.append(chunk["choices"][0]["text"])
            times.append(time.perf_counter())
            first = first or times[-1]
    end = time.perf_counter()
    conn.close()
    return {"start": t0, "first": first or end, "end": end, "tokens": tokens,
            "prompt_tokens": prompt_tokens, "times": times, "text": "".join(text)}


def together(url, model, prompts, max_tokens) -> list[dict]:
    out = [None] * len(prompts)

    def client(i):
        out[i] = stream_one(url, model, prompts[i], max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(o is None for o in out):
        raise RuntimeError("a client failed (see its traceback above)")
    return out


def serially(url, model, prompts, max_tokens) -> list[dict]:
    return [stream_one(url, model, p, max_tokens) for p in prompts]


def summary(runs: list[dict]) -> dict:
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    ttft = [r["first"] - r["start"] for r in runs]
    rate = [(r["tokens"] - 1) / (r["end"] - r["first"]) for r in runs
            if r["tokens"] > 1 and r["end"] > r["first"]]
    return {"tokens": tokens, "wall_s": wall, "agg_tps": tokens / wall,
            "ttft_med_s": statistics.median(ttft), "ttft_max_s": max(ttft),
            "req_tps_med": statistics.median(rate) if rate else 0.0}


def stats(url: str) -> dict:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/stats")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


#: the words of the shared-prefix workload's system text
WORDS = ("the bakery opens at seven and closes late every day except monday while orders for "
         "cakes tarts bread and pastries must reach the counter two days ahead payment by card "
         "or cash is welcome deliveries run on weekdays across the old town").split()


def shared_text(words: int, seed: int = 0) -> str:
    """A seeded system text of `words` words, the same on every run."""
    rng = random.Random(seed)
    return "System: " + " ".join(rng.choice(WORDS) for _ in range(words)) + ".\n"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def shared_prefix(urls: list[str], model: str, counts: list[int], words: int,
                  max_tokens: int) -> None:
    """The shared-prefix workload on each server (see the module docstring)."""
    system = shared_text(words)
    p50: dict[tuple[str, int], float] = {}
    texts: dict[tuple[str, int], list[str]] = {}
    for url in urls:
        s = stats(url)
        cache = "on" if s.get("prefix_cache") else "off"
        print(f"server {url}: {s['model']}, batch {s['max_batch']}, pool {s['pool_blocks']} "
              f"blocks of {s['block_size']}, prefix cache {cache}")
        stream_one(url, model, system + "Question: hello?\nAnswer:", max_tokens)
        for n in counts:
            prompts = [f"{system}Question: {PROMPTS[i % len(PROMPTS)]} ({i})\nAnswer:"
                       for i in range(n)]
            before = stats(url)
            runs = together(url, model, prompts, max_tokens)
            after = stats(url)
            d = {k: after.get(k, 0) - before.get(k, 0)
                 for k in ("prompt_tokens", "prefilled_tokens", "cached_prompt_tokens")}
            ttft = [r["first"] - r["start"] for r in runs]
            p50[url, n], texts[url, n] = statistics.median(ttft), [r["text"] for r in runs]
            print(f"  {n} clients, cache {cache}: TTFT p50 {p50[url, n]:.3f} s, p90 "
                  f"{percentile(ttft, 0.9):.3f} s; prompt tokens {d['prompt_tokens']}, "
                  f"prefilled {d['prefilled_tokens']}, cached {d['cached_prompt_tokens']}; "
                  f"wall {summary(runs)['wall_s']:.2f} s")
            print(f"SUMMARY serve shared prefix {words} words {n} clients cache {cache}: "
                  f"TTFT p50 s | {p50[url, n]:.3f}")
    for n in counts:
        for url in urls[1:]:
            same = sum(a == b for a, b in zip(texts[urls[0], n], texts[url, n], strict=True))
            print(f"SUMMARY serve shared prefix {n} clients: TTFT p50 {url} over {urls[0]} | "
                  f"{p50[url, n] / p50[urls[0], n]:.2f}x; greedy texts the same: {same} of {n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000",
                    help="the server (--shared-prefix: comma-separated servers, each in turn)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-serial", action="store_true", help="skip the one-at-a-time runs")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="WORDS",
                    help="the shared-prefix workload: prompts that start with one system "
                         "text of WORDS words (see the module docstring)")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    if args.shared_prefix:
        shared_prefix(args.url.split(","), args.model, counts, args.shared_prefix,
                      args.max_tokens)
        return 0
    s = stats(args.url)
    print(f"server: {s['model']}, batch {s['max_batch']} (decode plans {s['decode_batches']}), "
          f"pool {s['pool_blocks']} blocks; {args.max_tokens} tokens per request")
    stream_one(args.url, args.model, PROMPTS[0], 4)          # warm the server's paths
    head = (f"{'clients':>7} {'mode':>8} {'tokens':>7} {'wall s':>7} {'agg tok/s':>10} "
            f"{'TTFT med':>9} {'TTFT max':>9} {'req tok/s':>10}")
    print(head)
    agg = {}
    for n in counts:
        prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(n)]
        modes = [("together", together)] + ([] if args.no_serial else [("serial", serially)])
        texts = {}
        for mode, fn in modes:
            before = stats(args.url)
            runs = fn(args.url, args.model, prompts, args.max_tokens)
            texts[mode] = [x["text"] for x in runs]
            r = summary(runs)
            after = stats(args.url)
            d = {k: after.get(k, 0) - before.get(k, 0)
                 for k in ("steps", "turns_s", "decode_step_s", "prefill_step_s", "gc_s",
                           "gc_full", "decode_wait_s", "overlapped_steps")}
            print(f"{n:>7} {mode:>8} {r['tokens']:>7} {r['wall_s']:>7.2f} {r['agg_tps']:>10.1f} "
                  f"{r['ttft_med_s']:>9.3f} {r['ttft_max_s']:>9.3f} {r['req_tps_med']:>10.1f}"
                  f"  ({d['steps']} decode steps)")
            host = d["turns_s"] - d["decode_step_s"] - d["prefill_step_s"]
            print(f"{'':>16} engine: decode steps {d['decode_step_s']:.3f} s "
                  f"({d['decode_step_s'] / max(d['steps'], 1) * 1e3:.2f} ms each), prefill "
                  f"steps {d['prefill_step_s']:.3f} s, the rest of the turns {host:.3f} s "
                  f"({host / max(d['steps'], 1) * 1e3:.2f} ms a decode step), idle "
                  f"{r['wall_s'] - d['turns_s']:.3f} s; collector {d['gc_s']:.3f} s "
                  f"({d['gc_full']} full); waiting for launched steps {d['decode_wait_s']:.3f}"
                  f" s, {d['overlapped_steps']} steps launched while one ran")
            print(f"SUMMARY serve {n} clients {mode}: aggregate tok/s | {r['agg_tps']:.1f}")
            if mode == "together":
                agg[n] = r["agg_tps"]
        if len(texts) == 2:
            same = sum(a == b for a, b in zip(texts["together"], texts["serial"]))
            print(f"SUMMARY serve {n} clients: greedy texts together equal to one at a time | "
                  f"{same} of {n}")
    if 1 in agg and len(agg) > 1:
        top = max(agg)
        print(f"SUMMARY serve {top} clients over 1: aggregate ratio | {agg[top] / agg[1]:.2f}x")
    print(f"peak batch: {stats(args.url)['peak_batch']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
