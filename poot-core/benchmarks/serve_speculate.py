"""Speculative decoding in `poot serve`: decode tokens/s of one greedy chat stream with
speculation off (`"speculate": false`), by the server's proposer (prompt lookup or its draft
model), and with a `prediction`, against one live server started with `--speculate lookup`,
`draft:MODEL` or `self:N`.

Two workloads: "edit" asks to repeat a paragraph changing one word (the answer repeats its
input; the prediction is the paragraph), "free" asks for a story (no prediction). Each
round runs every mode of a workload one after another; a mode's ratio is the median over
the rounds of its tokens/s over plain decoding's in the same round. Tokens/s counts from
the first streamed text to the end (decode only: the prompt's prefill, cached or not, is
left out). The texts must equal plain decoding's. Each stream's acceptance (its tokens
accepted over proposed, from /stats; the server must serve nothing else meanwhile) is
printed beside its rate. Lines starting "SUMMARY " are for collecting scripts.

    poot serve smollm2 --backend cpu --speculate lookup --port 8000 &
    python poot-core/benchmarks/serve_speculate.py --url http://127.0.0.1:8000 --rounds 3
    poot serve smollm2 --backend cpu --speculate draft:smollm2 --port 8001 &   # plumbing
    python poot-core/benchmarks/serve_speculate.py --url http://127.0.0.1:8001
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

TEXT = ("The committee met on Tuesday to review the budget for the coming year. After a long "
        "discussion, the members agreed to increase funding for the library, to repair the "
        "roof of the community hall, and to hire two new staff members for the youth "
        "program. The chair thanked everyone for their work and closed the meeting at nine "
        "o'clock.")
WORKLOADS = {
    "edit": ("Repeat the following text exactly, changing only 'Tuesday' to 'Friday':\n\n"
             + TEXT, TEXT),
    "free": ("Write a short story about a lighthouse keeper.", None),
}


def stream(url: str, model: str, content: str, max_tokens: int, **extra):
    """One greedy streamed chat answer: its text, usage, and decode seconds (first text
    chunk to the end)."""
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    text, first, usage = [], None, None
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    return "".join(text), usage, time.perf_counter() - first


def speculation(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=60) as r:
        return json.load(r)["speculation"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    stream(args.url, args.model, "Hi", 4, speculate=False)           # warm
    proposer = speculation(args.url)["mode"]
    if proposer is None:
        raise SystemExit("the server does not speculate: start it with --speculate")
    for name, (prompt, prediction) in WORKLOADS.items():
        modes = {"plain": {"speculate": False}, proposer: {}}
        if prediction is not None:
            modes["prediction"] = {"prediction": {"type": "content", "content": prediction}}
        ratios = {m: [] for m in modes}
        for r in range(args.rounds):
            rate, texts = {}, {}
            for mode, extra in modes.items():
                s0 = speculation(args.url)
                texts[mode], usage, secs = stream(args.url, args.model, prompt,
                                                  args.max_tokens, **extra)
                s1 = speculation(args.url)
                rate[mode] = (usage["completion_tokens"] - 1) / secs
                details = usage.get("completion_tokens_details") or {}
                proposed = s1["proposed"] - s0["proposed"]
                print(f"{name} round {r} {mode}: {usage['completion_tokens']} tokens, "
                      f"{rate[mode]:.1f} decode tok/s"
                      + (f", accepted {s1['accepted'] - s0['accepted']}/{proposed} proposed "
                         f"in {s1['verify_steps'] - s0['verify_steps']} verify steps"
                         if proposed else "")
                      + (f", prediction accepted {details['accepted_prediction_tokens']} "
                         f"rejected {details['rejected_prediction_tokens']}" if details
                         else ""), flush=True)
                if texts[mode] != texts["plain"]:
                    print(f"{name} round {r} {mode}: TEXT DIFFERS from plain decoding")
            for mode in modes:
                ratios[mode].append(rate[mode] / rate["plain"])
        for mode, rs in ratios.items():
            print(f"SUMMARY {name} {mode} {statistics.median(rs):.2f}x plain "
                  f"(rounds {' '.join(f'{x:.2f}' for x in rs)})")
    print("speculation:", speculation(args.url))


if __name__ == "__main__":
    main()
