"""Which poot distributions are installed, at which versions, and whether a plugin's
distribution was built for this poot-core.

A plugin package declares the poot-core versions it works with the ordinary way, as a
dependency range in its metadata (`poot-core>=0.1.0,<0.2`). pip enforces that range when it
resolves, but not after `--no-deps`, a later `pip install poot-core==...` or a copied
site-packages; so the plugin manager checks it again before importing the plugin, and
refuses one built for another poot-core with a message instead of crashing in it.
"""
from __future__ import annotations

import re

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


def headers(dist) -> dict[str, list[str]] | None:
    """The core metadata fields of `dist` (a .dist-info's METADATA: name -> its values in
    order), read as plain `Name: value` lines: `dist.metadata` would import and keep the
    `email` package's parser for the life of a run; None where there is no METADATA
    file (an .egg-info: ask `dist` itself)."""
    text = dist.read_text("METADATA")
    if text is None:
        return None
    fields: dict[str, list[str]] = {}
    last = None
    for line in text.splitlines():
        if not line:
            break                      # the description (the message body) follows
        if line[0] in " \t" and last is not None:
            last[-1] += " " + line.strip()
            continue
        name, _, value = line.partition(":")
        last = fields.setdefault(name.strip().lower(), [])
        last.append(value.strip())
    return fields


def label(dist) -> str:
    """`dist`'s "name version", for listings."""
    fields = headers(dist)
    if fields is None:
        return f"{dist.metadata['Name']} {dist.version}"
    return f"{(fields.get('name') or [''])[0]} {(fields.get('version') or [''])[0]}"


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


#: a release version: numbers and dots, no pre-, post- or dev-release, no local part
_RELEASE = re.compile(r"\d+(?:\.\d+)*")
#: a requirement's name, and a poot-core requirement whose range is comparisons with
#: release versions only
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PLAIN_RANGE = re.compile(r"\s*\(?((?:\s*(?:>=|<=|==|!=|<|>)\s*\d+(?:\.\d+)*\s*,?)+)\s*\)?\s*")
_CLAUSE = re.compile(r"(>=|<=|==|!=|<|>)\s*(\d+(?:\.\d+)*)")
_COMPARE = {">=": tuple.__ge__, "<=": tuple.__le__, "==": tuple.__eq__, "!=": tuple.__ne__,
            "<": tuple.__lt__, ">": tuple.__gt__}


def _release(version: str) -> tuple[int, ...]:
    """A release version as integers without trailing zeros (1.0 == 1.0.0 in PEP 440)."""
    parts = [int(x) for x in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def plain_fit(requires, version: str) -> bool | None:
    """Whether release `version` is in the range of the first unconditional poot-core
    requirement of `requires`, where that range compares with release versions only (then
    PEP 440 is integer tuples, and packaging's specifier machinery, a MiB resident for the
    life of a run, is not imported); True where there is none; None where the range is of
    another form (wildcards, ~=, pre-releases, extras), for packaging to decide."""
    if not _RELEASE.fullmatch(version):
        return None
    for line in requires or ():
        name = _NAME.match(line)
        if ";" in line or name is None or \
                re.sub(r"[-_.]+", "-", name.group(1)).lower() != "poot-core":
            continue
        plain = _PLAIN_RANGE.fullmatch(line[name.end():])
        if plain is None:
            return None
        have = _release(version)
        return all(_COMPARE[op](have, _release(v)) for op, v in _CLAUSE.findall(plain[1]))
    return True


def check_compatible(dist) -> None:
    """IncompatiblePlugin when the running poot-core is outside `dist`'s declared range."""
    fields = headers(dist)
    fits = plain_fit(dist.requires if fields is None else fields.get("requires-dist", []),
                     core_version())
    if fits is None:
        from packaging.specifiers import SpecifierSet

        wanted = core_range(dist)
        fits = wanted is None or SpecifierSet(wanted).contains(core_version(), prereleases=True)
    if fits:
        return
    wanted = core_range(dist)
    name = dist.metadata["Name"]
    raise IncompatiblePlugin(
        f"{name} {dist.version} is built for poot-core{wanted} but poot-core "
        f"{core_version()} is installed, so it is not loaded: pip install "
        f"'poot-core{wanted}', or a {name} release built for poot-core {core_version()}")


__all__ = ["core_version", "installed", "headers", "label", "core_range", "plain_fit",
           "check_compatible"]
