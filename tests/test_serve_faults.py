"""`poot serve` under faults (issue 51), at CI size: ten rounds of 16 concurrent streams on
the cpu backend (the fuzzer's tiny Llama), a quarter leaving mid-stream, slow readers,
chat streams through the openai client, a full queue (429 with Retry-After), bodies over
the limit, invalid JSON and unknown fields; then the server still answers, its RSS grew
by under 5%, every KV block is back in the pool, no 5xx was sent and its log names every
refusal. The driver is poot-core/benchmarks/serve_faults.py (128 streams as a script)."""
from __future__ import annotations

import shutil

import pytest
from serve_process import benchmark, serve, tiny_llama


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the cpu backend needs gcc")
def test_ten_rounds_of_faults_leave_the_server_as_it_was(tmp_path):
    faults = benchmark("serve_faults")
    size = faults.Size(streams=16, batch=4)
    tiny = tiny_llama(tmp_path, size.max_seq)
    with serve(tiny, "--backend", "cpu", *size.server_args()) as server:
        report = faults.run(server.url, size, server.log, say=lambda line: None)
    assert report["failures"] == []
    assert len(report["rounds"]) == size.rounds == 10
    rounds = size.rounds + 1                       # and the warm-up's round 0
    assert report["refusals"] == {429: size.burst * rounds, 400: 2 * rounds, 413: 2 * rounds}
    assert report["statuses"][("stream", 200)] == \
        (size.streams - size.streams // 4) * rounds + size.batch
