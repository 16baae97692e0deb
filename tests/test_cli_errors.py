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
