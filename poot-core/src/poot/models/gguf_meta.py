"""Read a GGUF file's key/value metadata as plain Python values.

GGUFReader keeps every field as raw numpy "parts"; this module turns them into str, int,
float, bool and lists so that the rest of poot never touches the reader's layout.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from poot.errors import CheckpointError


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every key/value of a GGUF file (including the GGUF.* header fields) as plain values.

    Read once per file version in a process (a 262144-token vocabulary takes GGUFReader
    seconds); each call gets its own dict (the lists inside are shared: do not mutate)."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None:
        return _read(path)
    return dict(_cached(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _cached(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    return _read(Path(path))


def _read(path: Path) -> dict[str, Any]:
    reader = open_gguf(path)
    return {name: field_value(field, path) for name, field in reader.fields.items()}


def open_gguf(path: str | Path):
    """A GGUFReader on `path`, or a CheckpointError that names the file and what is wrong."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return GGUFReader(path, "r")
    except (ValueError, IndexError, OSError, KeyError) as exc:
        # GGUFReader reports a truncated or corrupted header as a bare numpy/ValueError.
        raise CheckpointError(f"cannot read GGUF file {path}: truncated or corrupted ({exc})") \
            from exc


def field_value(field, path: str | Path = "<gguf>") -> Any:
    """One ReaderField as a plain Python value."""
    from gguf import GGUFValueType

    types = list(field.types)
    if not types:
        raise CheckpointError(f"{path}: metadata field {field.name!r} has no type")
    if types[0] != GGUFValueType.ARRAY:
        return _scalar(field.parts[field.data[0]], types[0], field.name, path)
    if len(types) > 2:
        raise CheckpointError(
            f"{path}: metadata field {field.name!r} is a nested array, which poot does not read")
    if len(types) == 1:  # an empty array carries no element type
        return []
    element = types[1]
    if element == GGUFValueType.STRING:
        return [_text(field.parts[i], field.name, path) for i in field.data]
    values = np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data])
    if element == GGUFValueType.BOOL:
        return [bool(v) for v in values]
    return values.tolist()


def _scalar(part, gtype, name: str, path) -> Any:
    from gguf import GGUFValueType

    if gtype == GGUFValueType.STRING:
        return _text(part, name, path)
    value = np.asarray(part).reshape(-1)[0].item()
    return bool(value) if gtype == GGUFValueType.BOOL else value


def _text(part, name: str, path) -> str:
    try:
        return bytes(part).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: metadata field {name!r} holds invalid UTF-8 ({exc})") \
            from exc
