"""Every error a user can cause is one clear line from the real command, not a traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _poot(*args):
    return subprocess.run([sys.executable, "-m", "poot", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (("run", "/nonexistent/model.gguf", "--prompt", "hi"), "not found"),
    (("run", "nosuchmodel", "--prompt", "hi"), "unknown model 'nosuchmodel'"),
    (("info", "/nonexistent/folder"), "not found"),
])
def test_user_errors_are_one_line(args, message):
    r = _poot(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("poot: error:") and message in lines[-1].lower(), r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_backend_names_the_installed_ones(tmp_path, smollm2_gguf):
    r = _poot("run", str(smollm2_gguf), "--prompt", "hi", "--backend", "nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown backend 'nope'" in r.stderr and "reference" in r.stderr


def test_unsupported_architecture_is_refused(tmp_path):
    import gguf

    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(1)
    import numpy as np

    w.add_tensor("token_embd.weight", np.ones((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = _poot("info", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unsupported architecture 'bert'" in r.stderr


def test_damaged_gguf_is_refused(tmp_path, smollm2_gguf):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(smollm2_gguf.read_bytes()[:5000])
    r = _poot("info", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(bad) in r.stderr or "cut.gguf" in r.stderr


@pytest.mark.parametrize("content, message", [
    (b"hello, this is a plain text file\n", "is not a GGUF file (it starts with text 'hello"),
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "is not a GGUF file (it is a PNG image)"),
    (b"", "is empty"),
])
@pytest.mark.parametrize("command", ["run", "info"])
def test_a_file_named_gguf_that_is_not_one_says_what_it_is(tmp_path, content, message, command):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    r = _poot(command, str(path), *(["--prompt", "hi"] if command == "run" else []))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert message in lines[0] and str(path) in lines[0], r.stderr
    assert "no installed plugin" not in r.stderr


@pytest.mark.parametrize("flag, value", [("--max-tokens", "-1"), ("--max-tokens", "0"),
                                         ("--max-seq", "0"), ("--max-seq", "-3")])
def test_counts_below_one_are_refused_in_one_line(flag, value, smollm2_gguf):
    r = _poot("run", str(smollm2_gguf), "--prompt", "hi", flag, value)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == f"poot: error: {flag} must be a whole number of at least 1, got {value}"


def test_a_small_max_seq_runs(smollm2_gguf):
    """A KV capacity below the prefill chunk (32) runs rather than failing in the IR."""
    r = _poot("run", str(smollm2_gguf), "--prompt", "Hi", "--max-seq", "4", "--max-tokens", "2",
              "--quiet")
    assert r.returncode == 0, r.stderr
