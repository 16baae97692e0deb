"""`poot run smollm2 --temperature 0.8 --seed 7` prints the same text on every installed
backend, run after run: the decode steps sample in the graph with the counter-based
generator, the first token is drawn on the host by the same algorithm."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ARGS = ("run", "smollm2", "--prompt", "The capital of France is", "--temperature", "0.8",
        "--seed", "7", "--max-tokens", "8", "--max-seq", "64", "--quiet")


def _run(backend: str) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "poot", *ARGS, "--backend", backend],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_seeded_run_prints_the_same_text_on_every_backend(smollm2_gguf):
    from poot import plugin

    texts = {"reference": _run("reference")}      # each run is a process of its own
    for name in ("cpu", "wgpu"):
        if plugin.probe(plugin.get_backend(name))[0]:
            texts[name] = _run(name)
    print(texts)
    assert len(texts) == 3, f"only {sorted(texts)} find a device here"
    assert len(set(texts.values())) == 1, texts
    assert texts["reference"].startswith("The capital of France is")
    assert len(texts["reference"]) > len("The capital of France is") + 4
