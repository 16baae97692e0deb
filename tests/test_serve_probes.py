"""`poot serve`'s probes and its record for `poot ps`, on the fuzzer's tiny Llama.

/health is liveness (200 while the scheduler runs: "warming", then "ok"; 503 once it has
failed), /ready is readiness (503 "warming" until every plan of the configured batch
exists, then 200 "ready"). While a server runs, <cache>/run/<pid>.json names it for
`poot ps`; it goes when the server exits, and a record left by a killed one is pruned."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_process import serve

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_ready_is_503_warming_until_every_plan_exists(tiny):
    from poot.models.runner import load
    from poot.serve.app import create_app
    from poot.serve.engine import Engine
    from starlette.testclient import TestClient

    model = load(str(tiny), "reference", kv="paged", max_seq=seeds.CTX, prefill_tokens=16)
    engine = Engine(model, name="tiny", max_batch=2)
    with TestClient(create_app(engine)) as client:    # the loop is not started: no plan
        r = client.get("/ready")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "warming" and body["plans_made"] == 0
        assert body["plans_waiting"] == 6       # prefill and both decode modes, batches 1, 2
        assert client.get("/health").json() == {"status": "warming"}
        assert client.get("/health").status_code == 200      # alive: no restart
        engine.warm(wait=True)
        assert client.get("/ready").json() == {"status": "ready"}
        assert client.get("/health").json() == {"status": "ok"}
        engine.broken = "the scheduler failed: a test"
        for path in ("/ready", "/health"):
            r = client.get(path)
            assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"


def _ps(env) -> str:
    r = subprocess.run([sys.executable, "-m", "poot", "ps"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_running_server_is_listed_by_ps_and_its_record_goes_with_it(tiny, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "cache"))
    env = dict(os.environ)
    run = tmp_path / "cache" / "run"
    with serve(tiny, "--max-batch", "1", "--max-seq", str(seeds.CTX), startup_s=120) as s:
        (record,) = run.glob("*.json")
        assert json.loads(record.read_text())["pid"] == s.proc.pid
        deadline = time.monotonic() + 120
        while "ready" not in (out := _ps(env)) and time.monotonic() < deadline:
            time.sleep(0.5)
        line = next(x for x in out.splitlines() if x.startswith(str(s.proc.pid)))
        assert "smollm2" in line and s.base in line and "reference" in line
        assert line.split()[-1] == "ready", out
    assert not list(run.glob("*.json"))             # removed on exit
    assert "no poot server is running" in _ps(env)


def test_ps_prunes_the_record_of_a_server_that_was_killed(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (run / f"{gone}.json").write_text(json.dumps({"pid": int(gone), "model": "old",
                                                  "url": "http://127.0.0.1:1/v1"}))
    (run / "junk.json").write_text("{not json")
    env = dict(os.environ, POOT_CACHE=str(tmp_path))
    assert "no poot server is running" in _ps(env)
    assert not list(run.iterdir())
