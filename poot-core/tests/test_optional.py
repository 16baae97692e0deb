"""Optional packages: a missing one is one line naming the package and the pip command that
installs it, read from the declaring distribution's metadata; never a traceback."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from poot import optional
from poot.errors import MissingPackage, PootError


class Blocker:
    """A meta-path finder that makes `import NAME` (and its submodules) fail the way a
    package that is not installed fails."""

    def __init__(self, *names: str):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(f"{n}.") for n in self.names):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture
def block(monkeypatch):
    """block("tokenizers", ...): those packages cannot be imported and have no metadata,
    as in a venv without them; the modules named in `reimport` are imported afresh, and
    every module first imported during the test is dropped after it."""
    before = set(sys.modules)
    touched: list[str] = []
    blockers: list[Blocker] = []

    def apply(*names: str, reimport: tuple[str, ...] = ()):
        touched.extend(names + reimport)
        for mod in list(sys.modules):
            if any(mod == n or mod.startswith(f"{n}.") for n in names + reimport):
                monkeypatch.delitem(sys.modules, mod)
        # in place: a finder that a module imported meanwhile adds to sys.meta_path stays
        # (importlib_metadata's does, and takes the standard library's away)
        blocker = Blocker(*names)
        sys.meta_path.insert(0, blocker)
        blockers.append(blocker)
        real = optional.installed_version
        monkeypatch.setattr(optional, "installed_version",
                            lambda p: None if p in names else real(p))

    yield apply
    for blocker in blockers:
        sys.meta_path.remove(blocker)
    for mod in set(sys.modules) - before:
        if any(mod == n or mod.startswith(f"{n}.") for n in touched):
            del sys.modules[mod]


def fake_distribution(root, name: str, requires: list[str], entry_points: str = ""):
    """A dist-info folder on `root` (put on sys.path), read by importlib.metadata as an
    installed distribution is."""
    info = root / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 0.1.0",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    return info


def test_present_package_is_the_module():
    assert optional.require("json.decoder") is importlib.import_module("json.decoder")


def test_a_name_in_its_parent_is_found_as_from_import_finds_it():
    import os

    assert optional.require("os.path") is os.path                  # a submodule
    assert optional.require("importlib.import_module") is importlib.import_module
    with pytest.raises(MissingPackage, match=r"pytest .* is installed but `import "
                                             r"importlib.no_such_name` fails"):
        optional.require("importlib.no_such_name", "pytest")


def test_missing_package_names_the_extra_that_declares_it(tmp_path, monkeypatch, block):
    fake_distribution(tmp_path, "poot-fake", ['fakelib>=2.1; extra == "models"',
                                              "otherlib>=1.5,<2"])
    monkeypatch.syspath_prepend(str(tmp_path))
    block("fakelib", "otherlib")
    with pytest.raises(MissingPackage) as exc:
        optional.require("fakelib.sub")
    text = str(exc.value)
    assert text == ("the Python package fakelib is not installed (poot-fake[models] needs "
                    "it): pip install 'poot-fake[models]'")
    assert isinstance(exc.value, ImportError) and isinstance(exc.value, PootError)
    with pytest.raises(MissingPackage, match=r"pip install 'otherlib<2,>=1.5'$"):
        optional.require("other_module", "otherlib")


def test_undeclared_package_is_named_plainly(block):
    block("nowhere_declared")
    with pytest.raises(MissingPackage, match=r"not installed: pip install nowhere-dist$"):
        optional.require("nowhere_declared", "nowhere-dist")


def test_installed_but_broken_package_says_so(monkeypatch, block):
    block("json")
    monkeypatch.setattr(optional, "installed_version", lambda p: "9.9")
    with pytest.raises(MissingPackage, match=r"json 9\.9 is installed but `import json` "
                                             r"fails \(ModuleNotFoundError"):
        optional.require("json")


def test_chat_template_without_jinja2(block):
    from poot.models import chat

    block("jinja2")
    with pytest.raises(MissingPackage, match=r"jinja2 is not installed.*pip install"):
        chat.compile_template("{{ messages }}")


def test_tokenizer_without_tokenizers(block, tmp_path):
    from poot.models import tokenizer

    block("tokenizers")
    with pytest.raises(MissingPackage, match=r"tokenizers is not installed.*pip install"):
        tokenizer.Tokenizer.from_hf_folder(tmp_path)


def test_poot_run_without_tokenizers_is_one_line(block, gemma3_gguf, capsys):
    from poot.cli import main

    block("tokenizers")   # a SentencePiece vocabulary's (a byte-level one needs none)
    assert main(["run", str(gemma3_gguf), "--prompt", "hi", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poot: error: the Python package tokenizers "
                                               "is not installed"), err
    assert "pip install" in err[0]


def test_poot_quant_without_gguf_reads_a_gguf_and_names_it_to_quantize(block, smollm2_gguf):
    block("gguf", reimport=("poot_quant",))
    plugin = importlib.import_module("poot_quant.plugin")  # reading needs only its own tables
    assert plugin.poot_open_checkpoint(path=str(smollm2_gguf), format_hint=None) is not None
    q4_0 = importlib.import_module("poot_quant.gguf_blocks").Q4_0()
    with pytest.raises(MissingPackage, match=r"gguf is not installed .*pip install"):
        q4_0.quantize_blocks(np.zeros((1, 32), np.float32))


def test_loader_says_why_poot_quant_did_not_load(monkeypatch, smollm2_gguf):
    import poot.plugin
    from poot.errors import CheckpointError
    from poot.models.loader import open_checkpoint

    m = poot.plugin.PluginManager(load_entry_points=False)
    m.broken["quant"] = "failed to import: MissingPackage: the Python package gguf is ..."
    monkeypatch.setattr(poot.plugin, "_manager", m)
    with pytest.raises(CheckpointError, match=r"no installed plugin reads this file "
                                              r"\(poot-quant failed to load \(quant: failed"):
        open_checkpoint(smollm2_gguf)


def test_poot_serve_without_uvicorn_is_one_line(block, capsys):
    from poot.cli import main

    block("uvicorn")
    assert main(["serve", "smollm2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uvicorn is not installed" in err[0] and "pip install" in err[0]
