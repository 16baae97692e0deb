"""The HTTP side of `poot serve` alone: what streaming a turn's tokens to N clients costs.

The real app (poot.serve.app) under uvicorn, in front of a stand-in for the engine that
makes no steps: each turn it hands one text event to every open stream, through the app's
`deliver`, and waits until the event loop has run that hand-over before the next turn.
N streaming clients (threads over http.client in a process of their own) read --tokens pieces
each. Prints the event loop thread's CPU time per turn (what the scheduler thread competes with
for the interpreter while a real step runs).

With --step-ms, each turn stands in for a device step as the engine makes one: --releases
short calls that let go of the interpreter (a step's slot uploads and launch), then a wait
of --step-ms without it (the device), then the hand-over, without waiting for the event
loop to run it (as the engine does). The turn's time past --step-ms is what the scheduler
thread lost to the event loop, at the switch interval --switch-ms.

    python poot-core/benchmarks/serve_sse.py --clients 32 --tokens 200
    python poot-core/benchmarks/serve_sse.py --clients 32 --step-ms 5.75 --switch-ms 0.1
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import cProfile
import functools
import http.client
import json
import os
import pstats
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from poot.models.runner import load


class StandIn:
    """The Engine's HTTP-facing surface, with turns that only deliver text."""

    def __init__(self, limits, tokenizer, tokens: int, step_s: float = 0.0,
                 releases: int = 0):
        from poot.serve.engine import Event, deliver_here

        self.limits, self.tokenizer, self.tokens = limits, tokenizer, tokens
        self.step_s, self.releases = step_s, releases
        self.broken = None
        self.deliver = deliver_here
        self.jobs: list = []
        self.lock = threading.Lock()
        self.Event = Event
        self.turn_times: list[float] = []

    def submit(self, gen, emit):
        job = SimpleNamespace(emit=emit, left=self.tokens, prompt=len(gen.prompt_ids))
        with self.lock:
            self.jobs.append(job)
        return job

    def submit_choices(self, gen, emits):
        return [self.submit(gen, emit) for emit in emits]

    def cancel(self, job):
        with self.lock:
            if job in self.jobs:
                self.jobs.remove(job)

    def stats(self):
        return {}

    def run(self, loop, want: int, stop: threading.Event):
        while not stop.is_set():
            with self.lock:
                jobs = list(self.jobs)
            if len(jobs) < want:
                time.sleep(0.001)
                continue
            t = time.perf_counter()
            if self.step_s:
                self.device_step()
            events = []
            for job in jobs:
                job.left -= 1
                events.append((job, self.Event("text", text=" word")))
                if job.left == 0:
                    events.append((job, self.Event("done", finish_reason="length",
                                                   prompt_tokens=job.prompt,
                                                   completion_tokens=self.tokens)))
                    self.cancel(job)
            handed = threading.Event()
            self.deliver(events)
            if not self.step_s:
                loop.call_soon_threadsafe(handed.set)
                handed.wait()
            self.turn_times.append(time.perf_counter() - t)

    def device_step(self):
        """A step's calls that release the interpreter: short ones, then the device wait."""
        for _ in range(self.releases):
            os.write(self.null, b"x")
        time.sleep(self.step_s)

    @functools.cached_property
    def null(self) -> int:
        return os.open(os.devnull, os.O_WRONLY)


def client(port: int, out: list, i: int):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": "m", "prompt": "hi", "max_tokens": 10, "stream": True}),
        headers={"content-type": "application/json"})
    r = conn.getresponse()
    n = sum(1 for line in r if line.startswith(b"data: {"))
    out[i] = n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--profile", action="store_true", help="cProfile the event loop")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="each turn waits this long for a stand-in device step")
    ap.add_argument("--releases", type=int, default=6,
                    help="calls of a stand-in step that release the interpreter before it")
    ap.add_argument("--switch-ms", type=float, default=None,
                    help="the interpreter's switch interval (default: the engine's)")
    ap.add_argument("--read", action="store_true", help="be the clients (a process apart)")
    args = ap.parse_args()
    if args.read:
        out = [0] * args.clients
        threads = [threading.Thread(target=client, args=(args.port, out, i))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(sum(out))
        return 0
    import uvicorn
    from poot.serve.app import create_app
    from poot.serve.protocol import Limits

    model = load("smollm2", "reference", kv="paged", max_seq=128)
    from poot.serve.engine import SWITCH_S

    sys.setswitchinterval(SWITCH_S if args.switch_ms is None else args.switch_ms / 1e3)
    engine = StandIn(Limits("m", 128, 4096, 49152), model.tokenizer, args.tokens,
                     args.step_ms / 1e3, args.releases)
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1",
                                           port=args.port, log_level="warning"))
    loop_box: list = []
    prof = cProfile.Profile()

    def serve():
        loop = asyncio.new_event_loop()
        loop_box.append(loop)
        if args.profile:
            prof.runcall(loop.run_until_complete, server.serve())
        else:
            loop.run_until_complete(server.serve())

    threading.Thread(target=serve, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    stop = threading.Event()
    runner = threading.Thread(target=engine.run, args=(loop_box[0], args.clients, stop))
    runner.start()
    def loop_cpu() -> float:
        box = concurrent.futures.Future()
        loop_box[0].call_soon_threadsafe(lambda: box.set_result(time.thread_time()))
        return box.result()

    cpu0 = loop_cpu()
    t0 = time.perf_counter()
    got = subprocess.run([sys.executable, __file__, "--clients", str(args.clients),
                          "--port", str(args.port), "--read"], check=True, text=True,
                         capture_output=True).stdout
    wall = time.perf_counter() - t0
    cpu = loop_cpu() - cpu0
    stop.set()
    runner.join()
    server.should_exit = True
    tt = sorted(engine.turn_times)
    print(f"{args.clients} streams x {args.tokens} pieces in {wall:.2f} s: {len(tt)} turns, "
          f"event loop CPU {cpu / len(tt) * 1e3:.2f} ms a turn "
          f"({cpu / len(tt) / args.clients * 1e6:.0f} us a stream), {got.strip()} chunks read")
    if args.step_ms:
        med = tt[len(tt) // 2] * 1e3
        print(f"stand-in steps of {args.step_ms} ms ({args.releases} releases before each), "
              f"switch interval {sys.getswitchinterval() * 1e3:.2f} ms: median turn "
              f"{med:.2f} ms, {med - args.step_ms:.2f} ms past the step")
    if args.profile:
        time.sleep(0.5)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
