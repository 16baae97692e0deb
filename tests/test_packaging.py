"""The monorepo's packages agree: one version, poot-core ranges that hold it, the `poot`
distribution's extras naming every backend; and every import of an optional package goes
through poot.optional.require (so a missing one is one line, never a traceback)."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import poot
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p.parent for p in ROOT.glob("*/pyproject.toml"))
#: top-level modules of packages some installs lack (every one poot imports)
OPTIONAL = {"tokenizers", "jinja2", "tqdm", "gguf", "safetensors", "starlette", "uvicorn",
            "pytest", "cuda", "hip", "wgpu", "vulkan", "msgpack", "elftools",
            "huggingface_hub", "httpx2", "prometheus_client"}
#: modules that only pytest loads (the conformance suite's plugin and test files)
PYTEST_ONLY = "poot-core/src/poot/conformance/"


def project(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


def test_every_package_is_found():
    names = {project(p)["name"] for p in PACKAGES}
    assert names == {"poot", "poot-core", "poot-quant", "poot-backend-cpu", "poot-backend-cuda",
                     "poot-backend-rocm", "poot-backend-wgpu", "poot-backend-vulkan"}


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_one_version_and_ranges_that_hold_it(folder):
    meta = project(folder)
    assert meta["version"] == poot.__version__
    assert meta["license"] == "Apache-2.0" and (folder / meta["readme"]).is_file()
    assert (folder / "LICENSE").read_text().startswith("\n                                 "
                                                       "Apache License")
    for line in meta.get("dependencies", []) + sum(meta.get("optional-dependencies",
                                                            {}).values(), []):
        req = Requirement(line)
        if req.name.startswith("poot") and req.name != meta["name"]:  # not its own extras
            assert req.specifier, f"{meta['name']}: {line} has no version range"
            assert req.specifier.contains(poot.__version__), f"{meta['name']}: {line}"


def test_the_poot_distribution_names_every_backend():
    meta = project(ROOT / "poot-meta")
    extras = meta["optional-dependencies"]
    backends = {p.name.removeprefix("poot-backend-") for p in PACKAGES
                if p.name.startswith("poot-backend-")}
    assert backends <= set(extras)
    for name in backends - {"cpu"}:
        assert extras[name] == [f"poot-backend-{name}=={poot.__version__}"]
    assert f"poot-backend-cpu=={poot.__version__}" in meta["dependencies"]
    assert Requirement(extras["all"][0]).extras == backends - {"cpu"}


def optional_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                  if n.partition(".")[0] in OPTIONAL]
    return found


def test_optional_packages_are_imported_through_require():
    sources = [p for folder in PACKAGES for p in (folder / "src").rglob("*.py")
               if not str(p.relative_to(ROOT)).startswith(PYTEST_ONLY)]
    assert len(sources) > 100
    offenders = [hit for p in sources for hit in optional_imports(p)]
    assert not offenders, ("import these through poot.optional.require, so that a missing "
                           "package is one line:\n" + "\n".join(offenders))
