"""`poot serve` as a subprocess on a free loopback port, for the server's tests."""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def benchmark(name: str):
    """poot-core/benchmarks/NAME.py, imported as a module (its drivers are tested here)."""
    path = Path(__file__).parents[1] / "poot-core" / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def tiny_llama(folder: Path, context: int) -> Path:
    """The fuzzer's tiny Llama (tests/fuzz/seeds.py: random weights, a byte vocabulary,
    a ChatML template) with `context` positions, as a GGUF in `folder`."""
    sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
    import seeds

    kvs = seeds.set_kv(seeds.llama_kvs(), "llama.context_length", seeds.U32, context)
    return seeds.tiny_llama_gguf(Path(folder) / "tiny.gguf", kvs)


def openai_client(server: Server, timeout: float = 120):
    import openai

    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0,
                         timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url, self.log = proc, url, []

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url + "/stats", timeout=30) as r:
            return json.load(r)

    def wait_idle(self, timeout: float = 60.0) -> dict:
        """The stats once no sequence is active or queued (the engine frees blocks at its
        next turn after a client leaves)."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if (s["active"] == 0 and s["queued"] == 0) or time.monotonic() > deadline:
                return s
            time.sleep(0.1)


@contextmanager
def serve(model: str, *args: str, startup_s: float = 600.0):
    """Start `poot serve MODEL --backend reference ARGS` and yield a Server once it listens."""
    port = free_port()
    cmd = [sys.executable, "-m", "poot", "serve", str(model), "--backend", "reference",
           "--host", "127.0.0.1", "--port", str(port), "--name", "smollm2", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = Server(proc, f"http://127.0.0.1:{port}")
    listening = threading.Event()

    def drain():
        for line in proc.stdout:
            server.log.append(line)
            if "Uvicorn running on" in line:
                listening.set()
        listening.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        if not listening.wait(startup_s) or proc.poll() is not None:
            raise RuntimeError("poot serve did not start:\n" + "".join(server.log))
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
