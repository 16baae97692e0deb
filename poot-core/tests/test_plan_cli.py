"""`poot plan`: the printed plan of the demo decoder, timed steps, and a clear refusal."""
from __future__ import annotations

import re

from poot.cli import main


def test_poot_plan_demo_prints_kernels_arena_and_runs_steps(capsys):
    assert main(["plan", "--demo", "--backend", "reference", "--layers", "4", "--run", "3"]) == 0
    out = capsys.readouterr().out
    assert "kernels:" in out and "no dispatch:" in out and "regions:" in out
    arena, total = re.search(r"arena (\d+) B for \d+ buffers totalling ([\d.]+) MiB", out).groups()
    assert int(arena) * 8 < float(total) * 2**20
    assert "(in place)" in out and "MatMul" in out
    assert "0 allocations in steps" in out


def test_poot_plan_paged_summary(capsys):
    assert main(["plan", "--demo", "--backend", "reference", "--kv", "paged", "--batch", "2",
                 "--max-seq", "32", "--summary", "--run", "2", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert "paged KV" in out and "kernels:" not in out and "tokens/s" in out


def test_poot_plan_of_a_missing_model_is_one_error_line(capsys, tmp_path):
    assert main(["plan", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("poot: error:") and len(err.strip().splitlines()) == 1
