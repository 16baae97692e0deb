"""The models in poot's cache (<cache>/models, where `poot pull` puts them) and the model
repos in huggingface_hub's cache (`poot pull ORG/NAME`): what is there, and removing one.
`poot list` and `poot rm` are its commands."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from poot.errors import CheckpointError


@dataclass(frozen=True)
class CachedModel:
    name: str          # the known name ("smollm2") or else the file or folder name
    path: Path
    bytes: int
    modified: float    # seconds since the epoch


def models_dir() -> Path:
    from poot.paths import cache_dir

    return cache_dir() / "models"


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cached_models() -> list[CachedModel]:
    """Every GGUF file and HF folder (with config.json) in the cache, by name."""
    from poot.models.hub import KNOWN_MODELS

    names = {m.filename: name for name, m in KNOWN_MODELS.items()}
    root = models_dir()
    out = []
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        if p.name.startswith("."):
            continue            # a pull in progress
        if (p.is_file() and p.suffix.lower() == ".gguf") or (p / "config.json").is_file():
            out.append(CachedModel(names.get(p.name, p.name), p, _size(p), p.stat().st_mtime))
    return out + _hub_models()


def _hub_models() -> list[CachedModel]:
    """The model repos in huggingface_hub's cache (`poot pull ORG/NAME`), by repo id."""
    from poot.errors import MissingPackage
    from poot.models.hf_hub import cached_repos

    try:
        return [CachedModel(r.repo_id, r.path, r.bytes, r.last_modified)
                for r in cached_repos()]
    except MissingPackage:      # no huggingface_hub: no Hub models either
        return []


def find(name: str) -> CachedModel:
    """The cached model called `name` (its known name, or its file or folder name)."""
    models = cached_models()
    for m in models:
        if name in (m.name, m.path.name):
            return m
    have = ", ".join(m.name for m in models) or "none"
    raise CheckpointError(f"no model {name!r} in the cache {models_dir()} (it holds: {have}; "
                          f"`poot list` shows them)")


def remove(name: str) -> CachedModel:
    """Delete the cached model called `name` from the cache; what was removed."""
    m = find(name)
    if m.path.is_dir():
        shutil.rmtree(m.path)
    else:
        m.path.unlink()
    return m
