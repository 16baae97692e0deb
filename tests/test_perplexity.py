"""The accuracy tool on the real SmolLM2-135M and Gemma 3 270M checkpoints
(poot.models.perplexity, `poot perplexity`), scored over the shipped public-domain text
(tests/texts/README.md).

Perplexity is checked against the independent numpy forwards (tests/reference_llama.py,
tests/reference_gemma3.py); a configuration against itself is zero apart; the compiled
cpu backend lies within float rounding of the reference backend; and the gate of issue 49:
`fast` (f16 KV, and q8_0 KV) against `exact` on the reference and cpu backends, mean KL
<= 0.01, perplexity within 1% and top-1 agreement >= 97% (the last is not met where
TOP1_SHORT says: those cases are expected failures, strict, so that one that starts to
hold is noticed). The gate scores two windows of 512 tokens to keep the run short;
docs/performance.md has the whole text's figures from `poot perplexity`.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from poot.models.divergence import log_softmax
from poot.models.perplexity import evaluate, evaluate_many, scored, windows

pytestmark = pytest.mark.slow

TEXT = Path(__file__).parent / "texts" / "areopagitica.txt"

#: one window size for every configuration, so that each (model, backend) plans its exact
#: configuration once; the cpu backend runs more windows (the reference backend runs a
#: step in numpy)
WINDOW = 512
#: windows the gate scores (2 x 255 positions)
GATE_WINDOWS = 2
#: Gemma 3's 262,144-entry vocabulary makes a reference step over every position of a long
#: window the costliest part of this module: its reference backend scores a shorter one, the
#: same in every test, so that it loads and plans once
GEMMA3_WINDOW = 128

_models: dict = {}


@pytest.fixture(scope="module")
def paths(smollm2_gguf, gemma3_gguf):
    yield {"smollm2": str(smollm2_gguf), "gemma3": str(gemma3_gguf)}
    # the loaded configurations hold gigabytes: free them for the worker's next files
    _models.clear()
    _gate.clear()


def loaded(path: str, backend: str, window: int, precision: str = "exact",
           kv_dtype: str | None = None):
    """One configuration of a model, loaded once for the module."""
    import poot

    key = (path, backend, window, precision, kv_dtype)
    if key not in _models:
        _models[key] = poot.load(path, backend, max_seq=window, precision=precision,
                                 kv_dtype=kv_dtype)
    return _models[key]


def text_ids(model, window: int, count: int) -> list[int]:
    ids = model.tokenize(TEXT.read_text(encoding="utf-8"), add_special=False)
    assert len(ids) >= 20_000            # the shipped text is long enough for a full run
    return ids[: window * count]


def test_perplexity_matches_the_independent_numpy_forward(paths):
    """Two windows of each model on the reference backend: the tool's perplexity equals
    the one computed from an independent forward of the same windows (the second window
    runs over the first one's cache: what it left there must not leak in)."""
    from reference_gemma3 import prefill_logits as gemma_logits
    from reference_llama import prefill_logits as llama_logits

    for name, forward, window in (("smollm2", llama_logits, 64),
                                  ("gemma3", gemma_logits, GEMMA3_WINDOW)):
        model = loaded(paths[name], "reference", window)
        ids = text_ids(model, window, 2)
        got = evaluate(model, ids, window)
        tok = model.tokenizer
        nll = []
        for w in windows(ids, window, tok.bos_id if tok.add_bos else None):
            logp = log_softmax(forward(paths[name], w))
            rows = scored(window)
            nll += [-logp[j, w[j + 1]] for j in range(rows.start, rows.stop)]
        want = math.exp(np.mean(nll))
        print(f"{name}: PPL {got.ppl.value:.4f}, numpy forward {want:.4f}")
        assert got.count == len(nll) == 2 * (window // 2 - 1)
        assert got.ppl.value == pytest.approx(want, rel=2e-3)


def test_a_configuration_against_itself_is_zero_apart(paths):
    model = loaded(paths["smollm2"], "reference", WINDOW)
    twin = loaded(paths["smollm2"], "reference", WINDOW, kv_dtype="f32")
    s = evaluate(model, text_ids(model, WINDOW, 1), WINDOW, base=twin)
    assert s.count == WINDOW // 2 - 1
    assert s.kl.value == 0 and s.kl_max == 0 and s.same_top.value == 1
    assert s.ratio.value == 1 and s.ppl.value == s.ppl_base.value


@pytest.mark.parametrize("name, window", [("smollm2", WINDOW), ("gemma3", GEMMA3_WINDOW)])
def test_cpu_lies_within_rounding_of_the_reference_backend(paths, name, window):
    cpu = loaded(paths[name], "cpu", window)
    ref = loaded(paths[name], "reference", window)
    s = evaluate(cpu, text_ids(cpu, window, 1), window, base=ref)
    print(f"{name} cpu against reference:", *s.lines(), sep="\n  ")
    assert 0 < s.kl.value < 1e-5
    assert s.same_top.value >= 0.99
    assert abs(s.ratio.value - 1) < 1e-3


#: fast against exact by (model path, backend): {KV dtype: Summary}, for the tests below
_gate: dict = {}
KV_DTYPES = ("f16", "q8_0")


def gate_summary(path: str, backend: str, kv_dtype: str):
    if (path, backend) not in _gate:
        fast = [loaded(path, backend, WINDOW, "fast", kv) for kv in KV_DTYPES]
        exact = loaded(path, backend, WINDOW)
        got = evaluate_many(fast, text_ids(exact, WINDOW, GATE_WINDOWS), WINDOW, base=exact)
        for kv, s in zip(KV_DTYPES, got, strict=True):
            print(f"{Path(path).name} {backend} fast, KV {kv} against exact:", *s.lines(),
                  sep="\n  ")
        _gate[path, backend] = dict(zip(KV_DTYPES, got, strict=True))
    return _gate[path, backend][kv_dtype]


#: the gate in CI: SmolLM2 on both backends, Gemma 3 on cpu (on the reference backend its
#: all-position steps would take most of this module's time; `poot perplexity --backend
#: reference` measures it, docs/performance.md)
GATE = [(name, backend, kv) for name, backend in (("smollm2", "reference"), ("smollm2", "cpu"),
                                                  ("gemma3", "cpu"))
        for kv in KV_DTYPES]

#: where the fast policy flips more than 3% of the top-1 tokens over the gate's windows; over
#: the whole text it does for both models (docs/performance.md, "The accuracy tool")
TOP1_SHORT = {("smollm2", "reference", "f16"), ("smollm2", "reference", "q8_0"),
              ("smollm2", "cpu", "f16"), ("smollm2", "cpu", "q8_0"),
              ("gemma3", "reference", "f16"), ("gemma3", "cpu", "q8_0")}


@pytest.mark.parametrize("name, backend, kv_dtype", GATE)
def test_fast_against_exact_keeps_kl_and_perplexity(paths, name, backend, kv_dtype):
    s = gate_summary(paths[name], backend, kv_dtype)
    assert s.kl.value <= 0.01
    assert abs(s.ratio.value - 1) <= 0.01


@pytest.mark.parametrize("name, backend, kv_dtype", [
    pytest.param(*case, marks=pytest.mark.xfail(
        strict=True, reason="issue 49's gate: fast's int8 activation rows flip more than 3% "
                            "of top-1 tokens here")) if case in TOP1_SHORT else case
    for case in GATE])
def test_fast_against_exact_keeps_the_top1_token(paths, name, backend, kv_dtype):
    s = gate_summary(paths[name], backend, kv_dtype)
    assert s.same_top.value >= 0.97


def _poot(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "poot", "perplexity", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_the_command_reports_what_the_python_api_computes(paths):
    """`poot perplexity` on the cpu backend, over the text's first window (the plans are
    those the gate compiled: the cpu backend caches them by their source)."""
    run = _poot(paths["smollm2"], "--text", str(TEXT), "--backend", "cpu", "--window",
                str(WINDOW), "--max-tokens", str(WINDOW + 5), "--precision", "fast",
                "--against", "exact", "--json", "--quiet")
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["tested"] == "cpu, fast, KV f16"
    assert got["base"] == "cpu, exact, KV f32"
    fast = loaded(paths["smollm2"], "cpu", WINDOW, "fast", "f16")
    exact = loaded(paths["smollm2"], "cpu", WINDOW)
    want = evaluate(fast, text_ids(fast, WINDOW, 1), WINDOW, base=exact)
    assert got["count"] == want.count == WINDOW // 2 - 1
    for key in ("ppl", "ppl_base", "ratio", "kl", "same_top"):
        assert got[key]["value"] == pytest.approx(getattr(want, key).value, rel=1e-9), key
    assert got["kl_percentiles"]["99.0"] == pytest.approx(want.kl_percentiles[99.0], rel=1e-9)


@pytest.mark.parametrize("args, says", [
    (["--window", "2"], "--window must be a whole number of at least 4, got 2"),
    (["--window", "4096"], "less than one window of 4096"),
    (["--precision", "fastest"], "fastest"),
    (["--against-kv-dtype", "q4"], "q4"),
])
def test_bad_input_is_one_line(paths, args, says):
    run = _poot(paths["smollm2"], "--text", str(TEXT), "--backend", "reference",
                "--max-tokens", "100", "--quiet", *args)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poot: error:") and says in lines[0], \
        run.stderr


def test_a_missing_text_is_one_line(paths, tmp_path):
    run = _poot(paths["smollm2"], "--text", str(tmp_path / "none.txt"), "--quiet")
    assert run.returncode == 2
    assert run.stderr.startswith("poot: error: --text") and run.stderr.count("\n") == 1
