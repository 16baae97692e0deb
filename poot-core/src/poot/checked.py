"""Values from files poot did not write, checked before use.

`Values` reads one mapping of untrusted values (a GGUF's metadata, a config.json) with a
checked type, range and finiteness per key; `load_json`/`parse_json` read side files as UTF-8
JSON with a depth limit; `confined` keeps a path a checkpoint names inside its folder. Every
refusal is a ConfigError naming the file, the key and the value.
"""
from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from poot.errors import ConfigError

#: deeper JSON than this is refused (real configs and tokenizer.json nest < 10 deep)
MAX_JSON_DEPTH = 64
#: side files larger than this are refused before they are read (tokenizer.json ~ 10-30 MB)
MAX_SIDE_FILE = 512 * 1024 * 1024

MISSING: Any = object()

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict = 2, 60, 60, 6, 4


def show(value: Any) -> str:
    """A short repr of an untrusted value (bounded in length and depth)."""
    return _repr.repr(value)


def _kind(value: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


class Values:
    """Checked reads from one mapping of untrusted values; `file` names it in errors."""

    def __init__(self, values: Any, file: str | Path):
        self.file = str(file)
        if not isinstance(values, Mapping):
            raise ConfigError(f"{self.file}: expected an object of keys, found "
                              f"{_kind(values)} {show(values)}", file=self.file)
        self.values = values

    def fail(self, key: str, value: Any, problem: str):
        raise ConfigError(f"{self.file}: {key} = {show(value)} {problem}", file=self.file,
                          key=key, value=value)

    def has(self, key: str) -> bool:
        return self.values.get(key) is not None

    def _get(self, key: str, default: Any) -> Any:
        value = self.values.get(key)
        if value is None and default is MISSING:
            raise ConfigError(f"{self.file} lacks {key!r}", file=self.file, key=key)
        return value

    def integer(self, key: str, default: Any = MISSING, *, lo: int | None = None,
                hi: int | None = None) -> int:
        value = self._get(key, default)
        if value is None:
            return default
        return self.check_int(key, value, lo, hi)

    def check_int(self, key: str, value: Any, lo: int | None, hi: int | None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, value, f"is {_kind(value)}, not an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.fail(key, value, f"is outside [{lo if lo is not None else '-inf'}, "
                                  f"{hi if hi is not None else 'inf'}]")
        return value

    def number(self, key: str, default: Any = MISSING, *, lo: float | None = None,
               hi: float | None = None, positive: bool = False) -> float:
        """A finite int or float in [lo, hi] (> 0 with positive)."""
        value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, value, f"is {_kind(value)}, not a number")
        try:
            value = float(value)
        except OverflowError:
            self.fail(key, value, "is too large for a float")
        if not math.isfinite(value):
            self.fail(key, value, "is not finite")
        if positive and value <= 0:
            self.fail(key, value, "is not positive")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.fail(key, value, f"is outside [{lo}, {hi}]")
        return value

    def _typed(self, key: str, default: Any, types: type | tuple, noun: str) -> Any:
        value = self._get(key, default)
        if value is None:
            return default
        if not isinstance(value, types):
            self.fail(key, value, f"is {_kind(value)}, not {noun}")
        return value

    def text(self, key: str, default: Any = MISSING) -> str:
        return self._typed(key, default, str, "a string")

    def flag(self, key: str, default: Any = MISSING) -> bool:
        return self._typed(key, default, bool, "true/false")

    def mapping(self, key: str, default: Any = MISSING) -> dict:
        value = self._typed(key, default, Mapping, "an object")
        return value if value is default else dict(value)

    def sequence(self, key: str, default: Any = MISSING, *, max_len: int | None = None) -> list:
        items = self._typed(key, default, (list, tuple), "a list")
        if items is default:
            return default
        if max_len is not None and len(items) > max_len:
            self.fail(key, items, f"has {len(items)} elements, more than {max_len}")
        return list(items)

    def int_list(self, key: str, default: Any = MISSING, *, lo: int | None = None,
                 hi: int | None = None, max_len: int | None = None) -> list[int]:
        items = self.sequence(key, default, max_len=max_len)
        if items is default:
            return default
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int) \
                    or (lo is not None and item < lo) or (hi is not None and item > hi):
                self.fail(f"{key}[{i}]", item, f"is not an integer in [{lo}, {hi}]")
        return items

    def number_list(self, key: str, default: Any = MISSING, *,
                    max_len: int | None = None) -> list[float]:
        items = self.sequence(key, default, max_len=max_len)
        if items is default:
            return default
        for i, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, (int, float)) \
                    or not math.isfinite(item):
                self.fail(f"{key}[{i}]", item, "is not a finite number")
        return [float(x) for x in items]

    def text_list(self, key: str, default: Any = MISSING, *,
                  max_len: int | None = None) -> list[str]:
        items = self.sequence(key, default, max_len=max_len)
        if items is default:
            return default
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{key}[{i}]", item, f"is {_kind(item)}, not a string")
        return items


# -- JSON side files --------------------------------------------------------------------------
def check_depth(value: Any, where: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse containers nested deeper than `limit` (an iterative walk)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise ConfigError(f"{where}: JSON nested deeper than {limit} levels", file=where)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def parse_json(text: str | bytes, where: str | Path, *, expect: type | None = dict) -> Any:
    """JSON from an untrusted file: malformed, too deep or of the wrong kind is a ConfigError."""
    where = str(where)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})", file=where) \
                from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: invalid JSON ({exc})", file=where) from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels",
                          file=where) from None
    check_depth(value, where)
    if expect is not None and not isinstance(value, expect):
        raise ConfigError(f"{where}: expected a JSON {'object' if expect is dict else 'list'}, "
                          f"found {_kind(value)}", file=where)
    return value


def load_json(path: str | Path, *, expect: type | None = dict) -> Any:
    """parse_json of a file's bytes (a file larger than MAX_SIDE_FILE is refused unread)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_SIDE_FILE:
            raise ConfigError(f"{path}: {size} bytes, larger than the {MAX_SIDE_FILE}-byte "
                              f"limit for a side file", file=str(path))
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})", file=str(path)) \
            from None
    return parse_json(data, path, expect=expect)


def read_text(path: str | Path) -> str:
    """A side file's UTF-8 text (a chat template), or a ConfigError."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SIDE_FILE:
            raise ConfigError(f"{path}: larger than the {MAX_SIDE_FILE}-byte side-file limit",
                              file=str(path))
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})", file=str(path)) \
            from None


# -- paths a checkpoint names -----------------------------------------------------------------
def _hub_blob(root: Path, target: Path) -> bool:
    """A Hugging Face cache snapshot (<repo>/snapshots/<commit>) links each file to its
    content in <repo>/blobs: that link stays inside the repo's own cache folder."""
    return root.parent.name == "snapshots" and target.parent == root.parent.parent / "blobs"


def confined(folder: str | Path, name: Any, where: str | Path, key: str = "") -> Path:
    """`folder / name` for a relative `name` that stays inside `folder` (symlinks resolved);
    an absolute path, a `..` step or a link leading out is a ConfigError."""
    where = str(where)
    label = f"{where}: {key} = {show(name)}" if key else f"{where}: {show(name)}"
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ConfigError(f"{label} is not a file name", file=where, key=key, value=name)
    rel = Path(name)
    if rel.is_absolute() or name.startswith(("/", "\\")) or ".." in rel.parts \
            or ".." in name.replace("\\", "/").split("/"):
        raise ConfigError(f"{label} leads outside the model folder {folder}", file=where,
                          key=key, value=name)
    if len(name) > 1024 or any(len(part) > 255 for part in rel.parts):
        raise ConfigError(f"{label} is too long for a file name", file=where, key=key,
                          value=name)
    try:
        root = Path(folder).resolve()
        target = (root / rel).resolve()
    except (OSError, RuntimeError) as exc:  # a link loop, an unreadable folder
        raise ConfigError(f"{label} cannot be resolved ({exc})", file=where, key=key,
                          value=name) from None
    if target != root and root not in target.parents and not _hub_blob(root, target):
        raise ConfigError(f"{label} resolves to {target}, outside the model folder {root}",
                          file=where, key=key, value=name)
    return target
