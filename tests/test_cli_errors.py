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


# -- flags are checked before anything loads ----------------------------------------------
MISSING = "/nonexistent/model.gguf"     # the flag's refusal comes first: nothing was opened


HI = ("--prompt", "hi")


@pytest.mark.parametrize("command, args, message", [
    ("run", ("--prompt", ""), "--prompt must not be empty"),
    ("run", (*HI, "--temperature", "-1"), "--temperature must be a number in [0, inf), got -1"),
    ("run", (*HI, "--temperature", "nan"), "--temperature must be a number"),
    ("run", (*HI, "--top-p", "2"), "--top-p must be a number in (0, 1], got 2"),
    ("run", (*HI, "--top-p", "0"), "--top-p must be a number in (0, 1], got 0"),
    ("run", (*HI, "--top-k", "65"), "--top-k must be a whole number in 0..64"),
    ("run", (*HI, "--repetition-penalty", "0"), "--repetition-penalty must be a number in (0,"),
    ("run", (*HI, "--seed", "-5"), "--seed must be a whole number in [0, 2^64)"),
    ("run", (*HI, "--stop", "x", "--stop", ""), "--stop must be a non-empty string"),
    ("run", (*HI, "--precision", "half"), "--precision must be one of exact, fast, got 'half'"),
    ("run", (*HI, "--kv-dtype", "q4"), "--kv-dtype must be one of f32, f16, q8_0, got 'q4'"),
    ("serve", ("--kv-dtype", "bf16"), "--kv-dtype must be one of f32, f16, q8_0"),
    ("run", (*HI, "--expert-pool", "0"), "--expert-pool must be a whole number of at least 1"),
    ("run", (*HI, "--lora", "/nonexistent/ad"), "--lora /nonexistent/ad: no such adapter"),
    ("serve", ("--max-batch", "0"), "--max-batch must be a whole number of at least 1, got 0"),
    ("serve", ("--max-queue", "-1"), "--max-queue must be a whole number of at least 0"),
    ("serve", ("--default-max-tokens", "0"), "--default-max-tokens must be a whole number"),
    ("serve", ("--port", "70000"), "--port must be in 0..65535, got 70000"),
    ("serve", ("--lora", "a=/nonexistent/ad"), "--lora a=/nonexistent/ad: no such adapter"),
])
def test_flags_are_refused_by_name_before_the_model_loads(command, args, message):
    r = _poot(command, MISSING, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("poot: error: " + message), lines[0]


def test_an_empty_prompt_on_stdin_is_refused():
    r = subprocess.run([sys.executable, "-m", "poot", "run", MISSING], input="\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == ("poot: error: the prompt read from stdin is empty (pass "
                                "--prompt, or run on a terminal to chat)")


def test_serve_refuses_a_port_in_use_before_the_model_loads():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _poot("serve", MISSING, "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("command, defaults", [
    ("run", ["--max-seq MAX_SEQ     KV capacity in positions: prompt and answer together",
             "(default: 1024)", "0 = greedy (default: 0.0)", "(default: dense)",
             "(default: 64 for a prompt"]),
    ("serve", ["(default: 8)", "(default: 1024)", "(default: 127.0.0.1)", "(default: 8000)",
               "(default: 16 for /v1/completions"]),
])
def test_help_shows_the_defaults(command, defaults):
    r = _poot(command, "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for d in defaults:
        assert " ".join(d.split()) in text, (d, r.stdout)


def test_a_folder_with_config_but_no_weights_says_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (tmp_path / "tokenizer.json").write_text("{}")
    r = _poot("run", str(tmp_path), "--prompt", "hi")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "poot-quant" not in lines[0]
    assert "no weights" in lines[0] and "*.safetensors" in lines[0]
    assert "config.json, tokenizer.json" in lines[0]


def test_backends_marks_the_default_pick():
    from poot.plugin import select_backend

    r = _poot("backends")
    assert r.returncode == 0, r.stderr
    marked = [x for x in r.stdout.splitlines() if x.endswith("<- default")]
    chosen, dev = select_backend()
    assert len(marked) == 1 and marked[0].startswith(f"{chosen.name} ("), r.stdout
    assert f"default: {chosen.name} on {dev}" in r.stdout
    # a higher-priority backend passed over says why (lavapipe's vulkan and wgpu in CI)
    from poot.plugin import backends, probe

    for b in backends().values():
        for d in probe(b)[0]:
            if d.is_software and b.language != "numpy":
                assert f"device {d} (software: runs only when named, --backend {b.name})" \
                    in r.stdout, r.stdout


def test_doctor_checks_the_c_compiler_and_openmp(tmp_path):
    import os
    import shutil

    r = _poot("doctor")
    assert r.returncode == 0, r.stderr
    if shutil.which("gcc"):
        assert "C compiler: gcc" in r.stdout and "OpenMP: works" in r.stdout, r.stdout
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"))
    r = subprocess.run([sys.executable, "-m", "poot", "doctor"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert f"C compiler: '{tmp_path / 'no-such-cc'}' is not on PATH" in r.stdout


def test_list_and_rm_work_on_the_model_cache(tmp_path):
    import os

    from fuzz import seeds

    models = tmp_path / "models"
    models.mkdir()
    seeds.tiny_llama_gguf(models / "tiny.gguf")
    env = dict(os.environ, POOT_CACHE=str(tmp_path), HF_HUB_CACHE=str(tmp_path / "hf"))

    def poot(*args):
        return subprocess.run([sys.executable, "-m", "poot", *args], capture_output=True,
                              text=True, timeout=120, env=env)

    listed = poot("list")
    assert listed.returncode == 0 and "tiny.gguf" in listed.stdout, listed.stdout
    assert poot("rm", "nosuch").returncode == 2
    assert (models / "tiny.gguf").exists()          # nothing deleted on a refusal
    gone = poot("rm", "tiny.gguf")
    assert gone.returncode == 0 and "deleted tiny.gguf" in gone.stdout
    assert not (models / "tiny.gguf").exists()
    assert "no models in" in poot("list").stdout
