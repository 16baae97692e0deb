"""Which poot distributions are installed, at which versions, and whether a plugin's
distribution was built for this poot-core.

A plugin package declares the poot-core versions it works with the ordinary way, as a
dependency range in its metadata (`poot-core>=0.1.0,<0.2`). pip enforces that range when it
resolves, but not after `--no-deps`, a later `pip install poot-core==...` or a copied
site-packages; so the plugin manager checks it again before importing the plugin, and
refuses one built for another poot-core with a message instead of crashing in it.
"""
from __future__ import annotations

import poot
from poot.errors import IncompatiblePlugin
from poot.optional import is_poot


def core_version() -> str:
    """The version of the poot-core that is running (not whatever metadata says)."""
    return poot.__version__


def installed() -> dict[str, str]:
    """Every installed poot distribution (poot, poot-core, poot-quant, backends) by name,
    with its version; poot-core first."""
    from importlib.metadata import distributions

    found = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if is_poot(name) and name not in found:
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "poot-core", kv[0])))


def core_range(dist) -> str | None:
    """The poot-core version range that distribution `dist` declares (its unconditional
    requirement; None where it declares none or no range)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "poot-core" and not req.marker:
            return str(req.specifier) or None
    return None


def check_compatible(dist) -> None:
    """IncompatiblePlugin when the running poot-core is outside `dist`'s declared range."""
    from packaging.specifiers import SpecifierSet

    wanted = core_range(dist)
    if wanted is None or SpecifierSet(wanted).contains(core_version(), prereleases=True):
        return
    name = dist.metadata["Name"]
    raise IncompatiblePlugin(
        f"{name} {dist.version} is built for poot-core{wanted} but poot-core "
        f"{core_version()} is installed, so it is not loaded: pip install "
        f"'poot-core{wanted}', or a {name} release built for poot-core {core_version()}")


__all__ = ["core_version", "installed", "core_range", "check_compatible"]
