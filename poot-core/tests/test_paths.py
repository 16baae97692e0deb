"""poot.paths: the cache root, and the private runtime folder the Vulkan loader wants."""
from __future__ import annotations

import os
import stat

from poot.paths import cache_dir, private_runtime_dir


def test_the_cache_root_follows_poot_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("POOT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "poot"


def test_a_private_runtime_dir_is_kept_and_an_open_one_replaced(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(mine))
    private_runtime_dir("t")
    assert os.environ["XDG_RUNTIME_DIR"] == str(mine)
    mine.chmod(0o755)                       # readable by others: the loader would warn
    private_runtime_dir("t")
    made = os.environ["XDG_RUNTIME_DIR"]
    assert made == str(tmp_path / f"poot-t-xdg-{os.getuid()}")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    os.chmod(made, 0o755)                   # the named folder is not private: a fresh one
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(mine))
    private_runtime_dir("t")
    fresh = os.environ["XDG_RUNTIME_DIR"]
    assert fresh not in (made, str(mine)) and os.path.basename(fresh).startswith("poot-t-xdg-")
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o700
