"""`poot compile`: the demo step compiled, explained and validated from the command line."""
from __future__ import annotations

from poot.cli import main


def test_compile_demo_explain(capsys):
    assert main(["compile", "--demo", "--explain", "--target", "reference", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "94 primitive eqns -> 30 eqns for reference" in out
    assert "Attention at" in out and ": rewritten (" in out and ": kept (" in out
    assert "rewritten graph:" in out and "= Attention" in out
    assert "validated: the oracle agrees" in out


def test_compile_without_a_composite(capsys):
    assert main(["compile", "--demo", "--target", "reference", "--without", "Attention",
                 "--kv", "paged", "--tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "reference-without-Attention" in out and "attention: " in out


def test_unknown_target_is_one_error_line(capsys):
    assert main(["compile", "--demo", "--target", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown backend 'nope'" in err[0]
