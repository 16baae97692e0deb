"""The C compiler's version line, part of every library's cache key: asked of the compiler
once per binary and kept in the kernel cache, so a run on a warm cache starts no process
(and imports no `subprocess`); a different binary at the same name is asked again."""
from __future__ import annotations

import os
import stat
import subprocess

from poot_cpu import compiler


def _fake_cc(path, line: str) -> None:
    path.write_text(f"#!/bin/sh\necho '{line}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _not_run(*args, **kwargs):
    raise AssertionError(f"ran {args}")


def test_the_version_line_is_asked_once_per_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "cache"))
    cc = tmp_path / "bin" / "fakecc"
    cc.parent.mkdir()
    _fake_cc(cc, "fakecc 1.0")
    monkeypatch.setenv("PATH", f"{cc.parent}{os.pathsep}{os.environ['PATH']}")
    ask = compiler.compiler_version.__wrapped__
    assert ask("fakecc") == "fakecc 1.0"
    memo = compiler._version_memo(str(cc))
    assert memo.read_text() == "fakecc 1.0" and memo.parent.parent == compiler.cache_dir()
    with monkeypatch.context() as m:    # not run again: the kept line answers
        m.setattr(subprocess, "run", _not_run)
        assert ask("fakecc") == "fakecc 1.0"
    cc.unlink()
    _fake_cc(cc, "fakecc 2.0 (a longer line)")   # reinstalled: another size and inode
    assert ask("fakecc") == "fakecc 2.0 (a longer line)"
