"""docs/python.md's examples, run in order in one namespace on the real SmolLM2: each block
must run, and what they print must hold the answers the page shows."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples():
    assert len(blocks()) >= 10


def test_every_example_runs(smollm2_gguf):
    namespace: dict = {}
    out = io.StringIO()
    for n, code in enumerate(blocks()):
        # the checkpoint the tests use, wherever it is, in place of the cached name
        code = code.replace('poot.load("smollm2"', f'poot.load({str(smollm2_gguf)!r}')
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, f"{DOC.name} example {n + 1}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"example {n + 1} failed:\n{code}") from exc
    printed = out.getvalue()
    assert "Paris" in printed and "Berlin" in printed, printed
    assert "\n''\n" in printed, printed        # the raw question's empty answer
    assert printed.count("PromptError") + printed.count("RequestError") + \
        printed.count("SamplingError") == 3, printed


README = DOC.parents[1] / "README.md"
FIRST_SCREEN = 45      # lines


def test_the_readme_first_screen_shows_the_chat_and_the_python_example():
    top = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    for line in ("    bash scripts/main.sh", "    bash scripts/test.sh",   # as they were
                 "$ poot run smollm2", ">>> What is the capital of France?", ">>> /bye",
                 "import poot", 'model = poot.load("smollm2")', "model.generate("):
        assert line in top, line


def test_the_readme_python_example_runs(smollm2_gguf):
    (code,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    code = code.replace('poot.load("smollm2"', f'poot.load({str(smollm2_gguf)!r}')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert "Paris" in out.getvalue()
