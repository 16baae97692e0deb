"""`poot serve` under faults: rounds of concurrent streams whose clients misbehave, then the
server's health read from its own /metrics, /stats and log (issue 51).

Each round, with the server started by `server_args(size)` (--max-queue = streams - batch):
- long streams take every batch row, then the other streams fill the queue, so that the
  requests of a burst find it full: each must be answered 429 with Retry-After;
- of all streams, a quarter leave once the burst is done: mid-stream (the long ones among
  them) or while queued, half closing the socket, half resetting it; a quarter read slowly through a small receive buffer, a quarter are
  chat streams read by the openai client, the rest plain completions read to the end;
- bad requests meanwhile: a body declared over the size limit, one sent chunked past it,
  invalid JSON, an unknown field: each its 4xx; and a client that leaves mid-body.
After each round, once the server is idle, every KV block must be back in the pool (the
free count equals the pool's size; prefix-cached blocks no sequence holds count as free).
After the rounds: the server still answers; its resident memory (the metric
process_resident_memory_bytes) grew by under 5% from the first round to the last (warm-up
first: once GET /ready says every plan is made, one stream per batch row runs to the end of
its context, so that the KV pool's pages are mapped, then a round 0 of faults; `warm_up`;
the heap still grows once in the round after it); no 5xx was sent, as the
clients saw it and as poot_http_requests_total counts; the log has one "refused" line for
every refusal sent, by status, and no traceback; the process has no more open file
descriptors than when warm (no connection's socket is kept).

    python poot-core/benchmarks/serve_faults.py                 # full size: 128 streams
    python poot-core/benchmarks/serve_faults.py --streams 16 --batch 4 --rounds 3

The script serves the fuzzer's tiny random-weight Llama (tests/fuzz/seeds.py) on --backend
(default cpu); tests/test_serve_faults.py runs `run` at a smaller size.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

MODEL = "smollm2"          # the name tests/serve_process.py serves under
TIMEOUT = 120.0            # no client waits longer for any answer
WARM_S = 600.0             # the longest the server may take to make its plans
FILL_S = 30.0              # the longest the streams may take to fill the queue
KEEP_ALIVE_S = 10.0        # past uvicorn's keep-alive (5 s): every client's socket is closed
SLOW_RCVBUF = 2048         # a slow reader's receive buffer: the server's writes back up
SLOW_READ = 256            # bytes a slow reader reads at a time
MAX_BODY = 4 << 20         # poot.serve.app.MAX_BODY (not imported: a client needs no poot)
RSS_GROWTH = 0.05
REFUSED = re.compile(r"refused (\S+) (\S+): (\d{3}) ")


@dataclass(frozen=True)
class Size:
    streams: int = 128          # concurrent streams a round
    batch: int = 32             # the server's --max-batch (the long streams); <= streams / 4
    rounds: int = 10
    burst: int = 4              # requests sent to the full queue a round
    tokens: int = 24            # an ordinary stream's answer length
    long_tokens: int = 1000     # a row holder's answer length (it leaves after the burst)
    slow_pause: float = 0.005   # a slow reader's pause between reads of SLOW_READ bytes
    max_seq: int = 1024

    def __post_init__(self):
        if not 0 < self.batch <= self.streams // 4:
            raise ValueError(f"batch must be in 1..streams / 4, got {self.batch} of "
                             f"{self.streams} streams")

    def server_args(self) -> list[str]:
        """The `poot serve` flags this size wants (the queue holds the streams beyond the
        batch's rows, so the burst finds it full)."""
        return ["--max-batch", str(self.batch), "--max-queue", str(self.streams - self.batch),
                "--max-seq", str(self.max_seq), "--kv-pool", str(self.batch * self.max_seq)]


FULL = Size()


@dataclass
class Tally:
    """What the clients saw, from their threads."""

    statuses: Counter = field(default_factory=Counter)     # (what, status) -> count
    refusals_sent: Counter = field(default_factory=Counter)  # status -> count
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, what: str, status: int | str) -> None:
        with self.lock:
            self.statuses[(what, status)] += 1

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)

    def refused(self, status: int) -> None:
        """A request sent that the server must refuse with `status` (and log)."""
        with self.lock:
            self.refusals_sent[status] += 1


def connect(url: str, rcvbuf: int | None = None) -> http.client.HTTPConnection:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)
    if rcvbuf is not None:   # set before connecting, so the window the server sees is small
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(TIMEOUT)
        sock.connect((u.hostname, u.port))
        conn.sock = sock
    return conn


def post(url: str, path: str, body: bytes):
    """(status, headers, body) of one request."""
    conn = connect(url)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def get(url: str, path: str) -> bytes:
    conn = connect(url)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def metrics(url: str) -> dict[str, float]:
    """The Prometheus text of /metrics as {'name{labels}': value}."""
    out = {}
    for line in get(url, "/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def ready(url: str) -> bool:
    """Wait until GET /ready answers 200: every plan of the configured batch is made, so
    that the rounds measure a warm server's memory."""
    deadline = time.monotonic() + WARM_S
    while time.monotonic() < deadline:
        conn = connect(url)
        try:
            conn.request("GET", "/ready")
            if conn.getresponse().status == 200:
                return True
        finally:
            conn.close()
        time.sleep(0.2)
    return False


def stats(url: str) -> dict:
    return json.loads(get(url, "/stats"))


def wait_for(url: str, test, seconds: float = TIMEOUT) -> bool:
    deadline = time.monotonic() + seconds
    while not test(stats(url)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def completion(prompt: str, tokens: int, stream: bool = True) -> bytes:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


# -- the clients -----------------------------------------------------------------------------
def read_stream(url: str, prompt: str, tokens: int, tally: Tally, mode: str = "read",
                hold: threading.Event | None = None, leave_after: int = 1,
                pause: float = 0.0) -> None:
    """A streamed completion. mode "read": read to [DONE]; "slow": read SLOW_READ bytes at a
    time with pauses through a small buffer; "close" / "reset": leave after `leave_after`
    events (0: perhaps while queued) once `hold` is set, closing the socket or resetting
    the connection."""
    conn = connect(url, SLOW_RCVBUF if mode == "slow" else None)
    try:
        conn.request("POST", "/v1/completions", body=completion(prompt, tokens),
                     headers={"content-type": "application/json"})
        sock = conn.sock
        r = conn.getresponse()
        tally.saw("stream", r.status)
        if r.status != 200:
            tally.problem(f"a stream got {r.status}: {r.read()[:200]!r}")
            return
        if mode in ("close", "reset"):
            for _ in range(leave_after):
                while not r.readline().startswith(b"data: "):
                    pass
            hold.wait(TIMEOUT)
            if mode == "reset":    # linger 0: close sends RST, the server's next write fails
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            r.close()
            return
        body = bytearray()
        while chunk := r.read1(SLOW_READ) if mode == "slow" else r.read():
            body += chunk
            if mode == "slow":
                time.sleep(pause)
        events = [e for e in body.decode().split("\n\n") if e.startswith("data: ")]
        if not events or events[-1] != "data: [DONE]":
            tally.problem(f"a {mode} stream did not end in [DONE]: {bytes(body[-200:])!r}")
            return
        use, last = (json.loads(e[len("data: "):]) for e in events[-2:-4:-1])
        if last["choices"][0]["finish_reason"] != "length" or \
                use["usage"]["completion_tokens"] != tokens:
            tally.problem(f"a {mode} stream ended early: {events[-3:-1]}")
    except OSError as exc:
        tally.problem(f"a {mode} stream failed: {type(exc).__name__}: {exc}")
    finally:
        conn.close()


def chat_stream(url: str, tokens: int, tally: Tally, k: int) -> None:
    """A chat stream through the openai client, its deltas accumulated."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                           timeout=TIMEOUT)
    try:
        text, reason = [], None
        for chunk in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"tell me about {k}"}],
                max_tokens=tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True}):
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                reason = chunk.choices[0].finish_reason or reason
        tally.saw("chat", 200)
        if reason != "length":
            tally.problem(f"a chat stream ended with {reason!r}")
    except openai.APIStatusError as exc:
        tally.saw("chat", exc.status_code)
        tally.problem(f"a chat stream got {exc.status_code}: {exc.message}")
    except openai.APIError as exc:
        tally.problem(f"a chat stream failed: {exc}")
    finally:
        client.close()


def busy(url: str, tally: Tally) -> None:
    """A request to the full queue: 429 with Retry-After."""
    status, headers, body = post(url, "/v1/completions", completion("hi", 1, stream=False))
    tally.saw("busy", status)
    if status == 429:
        tally.refused(429)
        if not headers.get("retry-after", headers.get("Retry-After", "")).isdigit():
            tally.problem(f"a 429 without Retry-After: {headers}")
    else:
        tally.problem(f"a request to the full queue got {status}: {body[:200]!r}")


def bad_requests(url: str, tally: Tally) -> None:
    """Bodies over the limit (declared, and chunked without a length), invalid JSON, an
    unknown field: each refused with its 4xx and an OpenAI error object."""
    cases = [("invalid json", b'{"model": "smollm2", "prompt": ', 400),
             ("unknown field", json.dumps({"model": MODEL, "prompt": "hi",
                                           "max_tokens": 1, "temprature": 0}).encode(), 400)]
    for what, body, want in cases:
        status, _, reply = post(url, "/v1/completions", body)
        expect(tally, what, status, reply, want)
    expect(tally, "declared too large", *declared_too_large(url), 413)
    expect(tally, "chunked too large", *chunked_too_large(url), 413)
    leave_mid_body(url)
    tally.saw("left mid-body", "-")


def leave_mid_body(url: str) -> None:
    """A client that leaves while sending its body: nothing to answer, nothing to log."""
    conn = connect(url)
    try:
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", "1000")
        conn.endheaders(b'{"model": ')
        time.sleep(0.05)                  # the server is reading the body by now
    finally:
        conn.close()


def expect(tally: Tally, what: str, status: int | str, reply: bytes, want: int) -> None:
    tally.saw(what, status)
    tally.refused(want)
    if status != want:
        tally.problem(f"{what}: got {status}, not {want}: {reply[:200]!r}")
    elif "error" not in json.loads(reply):
        tally.problem(f"{what}: {status} without an error object: {reply[:200]!r}")


def declared_too_large(url: str) -> tuple[int | str, bytes]:
    """A Content-Length over the limit: the server answers before the body comes."""
    conn = connect(url)
    try:
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(MAX_BODY + 1))
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def chunked_too_large(url: str) -> tuple[int | str, bytes]:
    """A chunked body that passes the limit: sent until the server answers."""
    conn = connect(url)
    piece = b" " * (64 << 10)
    try:
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("transfer-encoding", "chunked")
        conn.endheaders()
        try:
            for _ in range((MAX_BODY + 2 * len(piece)) // len(piece)):
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        except OSError:
            pass                          # the server answered and closed: read its answer
        r = conn.getresponse()
        return r.status, r.read()
    except OSError as exc:
        return type(exc).__name__, b"{}"
    finally:
        conn.close()


# -- a round and the run ---------------------------------------------------------------------
def one_round(url: str, size: Size, tally: Tally, k: int) -> None:
    hold = threading.Event()         # set once the burst found the queue full: leavers go
    threads = []

    def start(fn, *args, **kw):
        t = threading.Thread(target=fn, args=args, kwargs=kw, daemon=True)
        t.start()
        threads.append(t)

    leaving = [("close", "reset")[i % 2] for i in range(size.streams // 4)]
    for i, mode in enumerate(leaving[:size.batch]):   # the batch's rows, until the burst
        start(read_stream, url, f"round {k} long {i}", size.long_tokens, tally, mode, hold,
              leave_after=1 + i % 2)
    if not wait_for(url, lambda s: s["active"] == size.batch):
        tally.problem(f"round {k}: the long streams did not all get a row")
    quarter = size.streams // 4
    rest = leaving[size.batch:] + ["slow"] * quarter + ["chat"] * quarter
    rest += ["read"] * (size.streams - size.batch - len(rest))
    for i, mode in enumerate(rest):
        if mode == "chat":
            start(chat_stream, url, size.tokens, tally, i)
        else:
            start(read_stream, url, f"round {k} stream {i}", size.tokens, tally, mode, hold,
                  leave_after=i % 3, pause=size.slow_pause)
    queue = size.streams - size.batch
    if wait_for(url, lambda s: s["queued"] == queue, FILL_S):
        for _ in range(size.burst):
            busy(url, tally)
    else:
        tally.problem(f"round {k}: the queue never held {queue} (rows freed first: "
                      f"raise long_tokens)")
    hold.set()
    bad_requests(url, tally)
    for t in threads:
        t.join(TIMEOUT)
        if t.is_alive():
            tally.problem(f"round {k}: a client still waits after {TIMEOUT} s")


def warm_up(url: str, size: Size, tally: Tally) -> float:
    """The server's RSS once warm: after one stream per batch row to the end of its
    context (the OS maps the KV pool's pages as they are first written: this writes
    nearly every block) and one round of faults (round 0)."""
    threads = [threading.Thread(target=read_stream, daemon=True,
                                args=(url, f"warm {i}", size.long_tokens, tally))
               for i in range(size.batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    one_round(url, size, tally, 0)
    wait_for(url, lambda s: s["active"] == 0 and s["queued"] == 0)
    return metrics(url)["process_resident_memory_bytes"]


def run(url: str, size: Size, log: list[str], say=partial(print, flush=True)) -> dict:
    """The rounds against a running server whose log lines `log` collects; a report with
    its `failures` (empty: the server passed)."""
    import openai  # noqa: F401  (imported before the first round: it takes a while)

    tally, rounds = Tally(), []
    if not ready(url):
        return {"failures": ["the server was not ready (GET /ready) within "
                             f"{WARM_S:.0f} s"]}
    base = warm_up(url, size, tally)
    fds = metrics(url)["process_open_fds"]
    say(f"warm: RSS {base / 2**20:.1f} MiB, {fds:.0f} open fds")
    for k in range(size.rounds):
        t0 = time.perf_counter()
        one_round(url, size, tally, k + 1)
        idle = wait_for(url, lambda s: s["active"] == 0 and s["queued"] == 0)
        m, st = metrics(url), stats(url)
        rounds.append({"seconds": time.perf_counter() - t0, "idle": idle,
                       "plans": st["plans_made"],
                       "rss": m["process_resident_memory_bytes"],
                       "free": m['poot_kv_blocks{state="free"}'],
                       "used": m['poot_kv_blocks{state="used"}']})
        r = rounds[-1]
        say(f"round {k + 1}: {r['seconds']:.1f} s, RSS {r['rss'] / 2**20:.1f} MiB, "
            f"KV blocks free {r['free']:.0f} used {r['used']:.0f}, plans {r['plans']}")
    status, _, reply = post(url, "/v1/completions", completion("still there?", 2, False))
    time.sleep(0.5)                   # the log lines of the last refusals reach the reader
    final = metrics(url)
    logged = Counter(int(m.group(3)) for line in list(log)
                     if (m := REFUSED.search(line)))
    failures = list(tally.problems)
    if status != 200:
        failures.append(f"the server no longer answers: {status} {reply[:200]!r}")
    for k, r in enumerate(rounds):
        if not r["idle"] or r["used"] != 0:
            failures.append(f"round {k + 1}: {r['used']:.0f} KV blocks not back in the "
                            f"pool")
    deadline = time.monotonic() + KEEP_ALIVE_S   # idle connections' sockets close by then
    while (left := metrics(url)["process_open_fds"]) > fds and time.monotonic() < deadline:
        time.sleep(0.2)
    if left > fds:
        failures.append(f"{left - fds:.0f} more open file descriptors than when warm")
    # against the first round's, not the warm figure: the heap still grows once in the first
    # round after warm-up (a leak grows it every round)
    growth = rounds[-1]["rss"] / rounds[0]["rss"] - 1
    if growth >= RSS_GROWTH:
        failures.append(f"RSS grew by {growth:.1%} from round 1 to round {size.rounds}")
    fives = {k: v for k, v in final.items() if k.startswith("poot_http_requests_total")
             and re.search(r'status="5', k) and v}
    fives.update({f"client {w}": n for (w, s), n in tally.statuses.items()
                  if isinstance(s, int) and s >= 500})
    if fives:
        failures.append(f"5xx answers: {fives}")
    tracebacks = sum("Traceback" in line for line in list(log))
    if tracebacks:
        failures.append(f"the log holds {tracebacks} tracebacks")
    if logged != tally.refusals_sent:
        failures.append(f"refusals sent by status {dict(tally.refusals_sent)}, logged "
                        f"{dict(logged)}")
    return {"rounds": rounds, "rss_warm": base, "rss_growth": growth, "open_fds": left, "statuses": dict(tally.statuses),
            "refusals": dict(tally.refusals_sent), "logged": dict(logged),
            "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--streams", type=int, default=FULL.streams)
    ap.add_argument("--batch", type=int, default=FULL.batch)
    ap.add_argument("--rounds", type=int, default=FULL.rounds)
    args = ap.parse_args()
    size = Size(streams=args.streams, batch=args.batch, rounds=args.rounds)
    tests = Path(__file__).resolve().parents[2] / "tests"
    sys.path.insert(0, str(tests))
    import tempfile

    from serve_process import serve, tiny_llama

    with tempfile.TemporaryDirectory() as folder:
        model = tiny_llama(Path(folder), size.max_seq)
        with serve(model, "--backend", args.backend, *size.server_args()) as server:
            report = run(server.url, size, server.log)
    print("SUMMARY " + json.dumps({k: v for k, v in report.items() if k != "statuses"}))
    for f in report["failures"]:
        print("FAIL " + f)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
