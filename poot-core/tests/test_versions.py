"""Versions that agree: a plugin built for another poot-core is refused before it is imported,
with a message; `poot --version` and `poot backends` show the installed versions."""
from __future__ import annotations

import re
import sys

import poot
import pytest
from poot import versions
from poot.plugin import PluginManager

PLUGIN = '''
from poot.plugin import hookimpl
IMPORTED = True

@hookimpl
def poot_backends():
    return []
'''


def plugin_distribution(site, name: str, module: str, core: str):
    """An installed distribution `name` whose `poot` entry point is `module`, declaring
    `poot-core{core}`."""
    site.distribution(name, module, PLUGIN, core=core,
                      extra="Requires-Dist: numpy>=1.26; extra == 'test'\n")


def test_plugin_for_another_core_is_refused_unimported(site):
    plugin_distribution(site, "poot-backend-future", "poot_future", ">=9.0,<10")
    plugin_distribution(site, "poot-backend-current", "poot_current", ">=0.1.0,<1")
    m = PluginManager()
    why = m.broken["poot_future"]
    assert why == (f"poot-backend-future 0.1.0 is built for poot-core<10,>=9.0 but poot-core "
                   f"{poot.__version__} is installed, so it is not loaded: pip install "
                   f"'poot-core<10,>=9.0', or a poot-backend-future release built for "
                   f"poot-core {poot.__version__}")
    assert "poot_future" not in sys.modules          # refused before its code ran
    assert "poot_current" not in m.broken and sys.modules["poot_current"].IMPORTED
    assert m.distributions["poot_current"] == "poot-backend-current 0.1.0"


def test_refused_backend_is_named_by_get_backend(site, monkeypatch):
    import poot.plugin
    from poot.errors import UnknownBackend

    plugin_distribution(site, "poot-backend-future", "poot_future", "==9.*")
    monkeypatch.setattr(poot.plugin, "_manager", PluginManager())
    with pytest.raises(UnknownBackend, match=r"plugin failed to load .*built for "
                                             r"poot-core==9\.\*"):
        poot.plugin.get_backend("poot_future")


def test_core_range_reads_only_the_unconditional_requirement(site):
    from importlib.metadata import distribution

    plugin_distribution(site, "poot-backend-current", "poot_current", ">=0.1.0,<1")
    assert versions.core_range(distribution("poot-backend-current")) == "<1,>=0.1.0"


def test_headers_read_as_the_email_parser_reads_them(site):
    """The plain reading of METADATA that plugin loading uses (the `email` parser stays
    unimported) gives the parser's fields: folded lines joined, the body not read."""
    from importlib.metadata import distribution

    plugin_distribution(site, "poot-backend-current", "poot_current", ">=0.1.0,<1")
    info = site.root / "poot_backend_current-0.1.0.dist-info" / "METADATA"
    info.write_text(info.read_text() + "Summary: a plugin\n  over two lines\n\n"
                    "Requires-Dist: not-a-field (the description)\n")
    dist = distribution("poot-backend-current")
    fields = versions.headers(dist)
    assert fields["requires-dist"] == dist.requires
    assert fields["summary"] == [" ".join(dist.metadata["Summary"].split())]
    assert versions.label(dist) == "poot-backend-current 0.1.0"


def test_version_lists_installed_packages(capsys):
    from poot.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"poot {poot.__version__} (poot-core ") and out.endswith(")\n")


def test_doctor_reports_each_part(capsys, tmp_path, monkeypatch):
    from poot.cli import main

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.gguf").write_bytes(b"\0" * 3072)
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("python 3.")
    assert f"\n  poot-core {poot.__version__}\n" in out and "\n    numpy>=1.26: " in out
    assert "\n  reference (priority 0, poot-core " in out
    assert "device reference:0" in out and "`poot run` picks: " in out
    assert f"\ncache {tmp_path}: " in out       # probing may add its own folders
    assert re.search(r"\n  models +3\.0 KiB\n", out)


RANGES = [">=0.1.0,<0.2", "<1,>=0.1.0", "==0.1.0", "==0.1", "!=0.1.0", ">0.1", "<=0.1",
          ">=0.1.0, <0.2", " (>=0.1.0,<0.2)", ">=0.10,<0.11", ">1.0.0", "<2"]


@pytest.mark.parametrize("version", ["0.1.0", "0.1", "0.2", "0.0.9", "0.1.1", "0.10.0",
                                     "1.0", "1.0.1", "9.0"])
def test_plain_ranges_are_decided_as_packaging_decides(version):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for spec in RANGES:
        for name in ("poot-core", "poot_core", "Poot.Core"):
            lines = ["numpy>=1.26", f"{name}{spec}", 'pytest>=8; extra == "test"']
            want = Version(version) in SpecifierSet(spec.strip(" ()"), prereleases=True)
            assert versions.plain_fit(lines, version) is want, (name, spec, version)


def test_other_ranges_are_left_to_packaging():
    for line in ["poot-core~=0.1", "poot-core==0.1.*", "poot-core>=0.1.0rc1",
                 "poot-core[models]>=0.1", "poot-core===0.1.0"]:
        assert versions.plain_fit([line], "0.1.0") is None, line
    assert versions.plain_fit(["poot-core>=0.1"], "0.2.0.dev1") is None
    # a conditional requirement, or none at all, leaves every version in
    assert versions.plain_fit(['poot-core>=9; extra == "x"', "numpy"], "0.1.0") is True
