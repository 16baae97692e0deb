"""The open-loop load benchmark (poot-core/benchmarks/serve_load.py) against a live
`poot serve` (the reference backend: no plans to compile), at a size that runs in seconds:
every request answers, the shared system text is found in the prefix cache, the latency
figures are ordered."""
from __future__ import annotations

import math

from serve_process import benchmark, serve, tiny_llama


def test_the_schedule_is_seeded_poisson_and_shares_the_prefix():
    load = benchmark("serve_load")
    w = load.Workload(requests=400, rate=20.0, input_words=10, output_tokens=8,
                      prefix_share=0.25, prefix_words=30)
    plan = w.schedule()
    assert plan == w.schedule() and plan != load.Workload(**{**vars(w), "seed": 1}).schedule()
    gaps = [b[0] - a[0] for a, b in zip(plan, plan[1:])]
    assert 0.04 < sum(gaps) / len(gaps) < 0.06                    # 1 / rate
    shared = sum(p.startswith("System: ") for _, p, _ in plan) / len(plan)
    assert 0.18 < shared < 0.32
    assert {n for *_, n in plan} <= set(range(4, 13))             # 8 +- 50%
    assert all(at == 0 for at, *_ in load.Workload(requests=5).schedule())   # rate inf


def test_a_load_run_answers_every_request_and_hits_the_prefix_cache(tmp_path):
    load = benchmark("serve_load")
    w = load.Workload(requests=10, rate=40.0, input_words=6, output_tokens=6,
                      prefix_share=0.6, prefix_words=40, max_concurrency=4)
    with serve(tiny_llama(tmp_path, 512), "--max-batch", "4",
               "--max-seq", "512") as server:
        report = load.run(server.url, "smollm2", w)
    m = load.metrics(report)
    assert report["failures"] == [] and m["completed"] == w.requests
    assert report["cached_prompt_tokens"] > 0
    assert report["prefilled_tokens"] + report["cached_prompt_tokens"] == \
        report["prompt_tokens"]
    for name in ("ttft", "tpot", "itl", "e2e"):
        d = m[name]
        assert 0 < d["p50"] <= d["p90"] <= d["p99"] and math.isfinite(d["mean"])
    assert m["ttft"]["p99"] <= m["e2e"]["p99"]
