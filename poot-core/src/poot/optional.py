"""Optional Python packages: import one, or refuse in one line that says what to install.

Every import of a package that some installs lack (the model runner's tokenizers and
jinja2, poot-quant's gguf, a backend's driver bindings) goes through `require`. A missing
one raises MissingPackage, a PootError (so the `poot` command prints one line, never a
traceback) and an ImportError (so code that falls back on ImportError still does). The
install command comes from the metadata of the installed poot distribution that declares
the package: its extra (`pip install 'poot-core[models]'`) or its version range
(`pip install 'cuda-bindings>=13.0'`), so no version is written twice.
"""
from __future__ import annotations

import importlib
import re
from types import ModuleType

from poot.errors import MissingPackage

_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def require(module: str, package: str | None = None) -> ModuleType:
    """`import module`, or MissingPackage naming `package` (the distribution pip installs,
    by default the module's top-level name) and the command that installs it."""
    try:
        return _import(module)
    except MissingPackage:
        raise
    except ImportError as exc:
        package = package or module.partition(".")[0]
        have = installed_version(package)
        if have is None:
            raise MissingPackage(_not_installed(package), name=module) from None
        # installed, but its import fails (a missing shared library or submodule, ...)
        raise MissingPackage(f"the Python package {package} {have} is installed but "
                             f"`import {module}` fails ({type(exc).__name__}: {exc})",
                             name=module) from None


def _import(module: str) -> ModuleType:
    """`import module`, or what `from parent import leaf` gives where `leaf` is a name in
    its parent rather than a submodule (hip-python's `hip.hip`)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        parent, _, leaf = module.rpartition(".")
        if not parent or exc.name != module:
            raise
        found = getattr(importlib.import_module(parent), leaf, None)
        if found is None:
            raise
        return found


def installed_version(package: str) -> str | None:
    """The installed version of distribution `package`, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def declaration(package: str) -> tuple[str, str | None, str] | None:
    """(poot distribution, its extra or None, the requirement without its marker) of the
    first installed poot distribution that declares `package`, or None."""
    from importlib.metadata import distributions

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    want = canonicalize_name(package)
    found = []
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if not is_poot(name):
            continue
        for line in dist.requires or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) != want:
                continue
            extra = extra_of(req)
            req.marker = None
            found.append((name, extra, str(req)))
    # poot-core before the rest, so a package core declares is installed through core
    found.sort(key=lambda f: (f[0] != "poot-core", f[1] is not None, f[0]))
    return found[0] if found else None


def extra_of(req) -> str | None:
    """The extra a packaging Requirement belongs to (`extra == "models"`), or None."""
    found = _EXTRA.search(str(req.marker)) if req.marker else None
    return found.group(1) if found else None


def is_poot(distribution: str) -> bool:
    """Whether `distribution` is one of poot's own (poot, poot-core, poot-backend-*...)."""
    from packaging.utils import canonicalize_name

    name = canonicalize_name(distribution)
    return name == "poot" or name.startswith("poot-")


def install_command(package: str) -> str:
    """The pip command that installs `package` the way poot declares it."""
    return _command(package, declaration(package))


def _command(package: str, found) -> str:
    if found is None:
        return f"pip install {package}"
    dist, extra, requirement = found
    return f"pip install '{dist}[{extra}]'" if extra else f"pip install '{requirement}'"


def _not_installed(package: str) -> str:
    found = declaration(package)
    by = "" if found is None else f" ({found[0]}{f'[{found[1]}]' if found[1] else ''} needs it)"
    return f"the Python package {package} is not installed{by}: {_command(package, found)}"


__all__ = ["require", "installed_version", "declaration", "install_command", "extra_of", "is_poot"]
