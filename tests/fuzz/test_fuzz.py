"""The fuzzer's short run: a few hundred mutated inputs per target, only ok and typed outcomes.

The long run (10,000 inputs per target) is a documented command, with its figures, in
docs/reliability.md.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).parent / "fuzz.py"


def test_short_fuzz_run_has_only_ok_and_typed_outcomes(tmp_path):
    out = tmp_path / "fuzz.json"
    r = subprocess.run([sys.executable, str(FUZZ), "--inputs", "200", "--timeout", "20",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text()) if out.is_file() else []
    assert {x["target"] for x in results} == {"gguf", "safetensors", "hf", "ir"}, r.stderr
    for x in results:
        assert x["inputs"] == 200 and x["ok"] + x["typed"] == 200, (x, r.stdout)
        assert x["typed"] > 0  # the mutations reach the checks
    assert r.returncode == 0, r.stdout + r.stderr
