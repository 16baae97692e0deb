"""`poot serve` on SIGTERM: it stops accepting at once, lets the running streams finish
within --shutdown-grace seconds, cancels those still running after it, and exits 0 (its
`poot ps` record removed). On the fuzzer's tiny Llama with a long context, so that a
stream outlasts the grace period."""
from __future__ import annotations

import http.client
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from serve_process import serve

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

CTX = 4096


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    kvs = seeds.set_kv(seeds.llama_kvs(), "llama.context_length", seeds.U32, CTX)
    return seeds.tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "long.gguf", kvs)


class Stream:
    """A streamed completion read on a thread: its chunks, and how it ended."""

    def __init__(self, server, max_tokens: int):
        client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0,
                               timeout=300)
        self.chunks, self.error, self.first = [], None, threading.Event()
        self.done = threading.Event()
        self.response = client.completions.create(
            model="smollm2", prompt="abc", max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for chunk in self.response:
                self.chunks.append(chunk)
                self.first.set()
        except Exception as exc:          # the server cut the stream
            self.error = exc
        finally:
            self.first.set()
            self.done.set()

    @property
    def finish_reason(self):
        return next((c.choices[0].finish_reason for c in self.chunks
                     if c.choices and c.choices[0].finish_reason), None)


def refused(server) -> bool:
    """True once /health is not served: the connection is refused, or (when it landed in
    the closing listener's backlog) reset or dropped unanswered."""
    try:
        urllib.request.urlopen(server.url + "/health", timeout=5)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    except (ConnectionResetError, http.client.RemoteDisconnected):
        return True
    return False


def stop(server, grace_s: float) -> int:
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(grace_s + 60)


def test_sigterm_lets_a_running_stream_finish_then_exits_0(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "cache"))
    with serve(tiny, "--max-batch", "2", "--max-seq", str(CTX), "--shutdown-grace", "120",
               startup_s=120) as server:
        stream = Stream(server, CTX - 8)
        assert stream.first.wait(120) and stream.error is None
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not refused(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stream.done.is_set(), "the stream ended before the test could look"
        assert refused(server)                   # no new connection while it drains
        assert server.proc.wait(180) == 0
        assert stream.done.wait(30)
    assert stream.error is None
    assert stream.finish_reason == "length"
    assert stream.chunks[-1].usage.completion_tokens == CTX - 8
    assert not list((tmp_path / "cache" / "run").glob("*.json"))


def test_sigterm_cancels_a_stream_still_running_after_the_grace(tiny):
    with serve(tiny, "--max-batch", "2", "--max-seq", str(CTX), "--shutdown-grace", "0.5",
               startup_s=120) as server:
        stream = Stream(server, CTX - 8)
        assert stream.first.wait(120) and stream.error is None
        t0 = time.monotonic()
        assert stop(server, 0.5) == 0
        took = time.monotonic() - t0
        assert stream.done.wait(30)
    assert stream.finish_reason is None            # cut, not finished
    assert took < 30
    assert any("graceful shutdown exceeded" in line for line in server.log), \
        "".join(server.log[-20:])
