"""Models from the Hugging Face Hub through `huggingface_hub`, the Hub's maintained client.

A Hub reference is `[hf.co/]ORG/NAME[@REVISION][:QUANT]`. Files land in huggingface_hub's
own cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), shared with
every other tool that uses it; $HF_TOKEN, $HF_ENDPOINT (a mirror) and $HF_HUB_OFFLINE mean
what they mean there. Only what loading needs is fetched: from a GGUF repo the files of one
quantization (every shard of a split one), from a safetensors repo the config, tokenizer and
chat-template files and the weights its index names. A download goes to a temporary file
that is renamed into the cache only when whole, so a failed pull leaves no partial file.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from poot.errors import CheckpointError
from poot.optional import require

#: prefixes that make a name a Hub reference whatever else it looks like
HUB_PREFIXES = ("https://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
#: a quantization tag inside a GGUF file name, between separators
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I|T)?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)"
                    r"(?![A-Za-z0-9])", re.IGNORECASE)
_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
#: the quantizations taken when none is named, best first
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
#: what loading an HF folder reads besides its weights (poot.models.tokenizer, config,
#: poot_quant.safetensors_dir): config, generation defaults, tokenizer, chat template,
#: GPTQ/AWQ side files, and the shard index
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
              "quantize_config.json", "quant_config.json", "model.safetensors.index.json")


class HubError(CheckpointError):
    """A Hub model could not be fetched or found: missing, gated, no network, disk full."""


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    quant: str | None = None      # upper case
    revision: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.repo_id}{rev}" + (f":{self.quant}" if self.quant else "")


def parse_ref(text: str) -> HubRef | None:
    """The Hub reference `text` spells, or None when it is not one (a local path, a name)."""
    body = text
    prefixed = body.startswith(HUB_PREFIXES)
    for prefix in HUB_PREFIXES:
        if body.startswith(prefix):
            body = body[len(prefix):]
            break
    if not prefixed and (body.startswith((".", "/", "~")) or os.sep != "/" and os.sep in body):
        return None
    quant = revision = None
    name, colon, tag = body.rpartition(":")
    if colon and tag and "/" not in tag and "@" not in tag:
        body, quant = name, tag.upper()
    body, at, rev = body.partition("@")
    if at:
        revision = rev
    if not _REPO_ID.match(body) or (not prefixed and body.lower().endswith(".gguf")):
        if prefixed:
            raise HubError(f"{text!r} is not a Hub reference: expected "
                           f"hf.co/ORG/NAME[@REVISION][:QUANT]")
        return None
    if at and not revision:
        raise HubError(f"{text!r} names no revision after '@'")
    return HubRef(body, quant, revision)


# -- the Hub's settings, read when used (huggingface_hub reads its own at import) --

def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_cache() -> Path:
    """huggingface_hub's cache folder, by the same variables it reads."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expandvars(os.environ[variable])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


# -- which files a model needs --

@dataclass(frozen=True)
class GGUFChoice:
    tag: str | None          # the quantization, upper case (None: the file name has none)
    files: tuple[str, ...]   # repo paths, the first shard first

    @property
    def label(self) -> str:
        return self.tag or PurePosixPath(self.files[0]).name


def gguf_choices(files: list[str]) -> list[GGUFChoice]:
    """The repo's GGUF models: one per file, or per set of shards; projector files
    (mmproj-*) left out, as they are no language model."""
    groups: dict[tuple[str, str, int], list[tuple[int, str]]] = {}
    singles = []
    for f in sorted(files):
        p = PurePosixPath(f)
        if p.suffix.lower() != ".gguf" or p.name.lower().startswith("mmproj"):
            continue
        m = _SHARD.match(p.name)
        if m:
            key = (str(p.parent), m["prefix"], int(m["count"]))
            groups.setdefault(key, []).append((int(m["no"]), f))
        else:
            singles.append(GGUFChoice(_tag(f[:-len(p.suffix)]), (f,)))
    out = list(singles)
    for (parent, prefix, count), shards in groups.items():
        shards.sort()
        if [n for n, _ in shards] != list(range(1, count + 1)):
            continue                 # an incomplete set cannot load; it is not offered
        out.append(GGUFChoice(_tag(f"{parent}/{prefix}"), tuple(f for _, f in shards)))
    return sorted(out, key=lambda c: c.files[0])


def _tag(stem: str) -> str | None:
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def pick_gguf(ref: HubRef, files: list[str],
              say: Callable[[str], None] | None = None) -> GGUFChoice | None:
    """The GGUF model `ref` names in a repo of `files`; None when the repo has no GGUF."""
    choices = gguf_choices(files)
    if not choices:
        if ref.quant:
            raise HubError(f"{ref.repo_id} has no GGUF files, so there is no quantization "
                           f"{ref.quant} to pick; `{ref.repo_id}` alone loads its safetensors")
        return None
    have = ", ".join(dict.fromkeys(c.label for c in choices))
    if ref.quant:
        for c in choices:
            if c.tag == ref.quant:
                return c
        raise HubError(f"{ref.repo_id} has no {ref.quant} GGUF; it has {have}")
    by_tag = {c.tag: c for c in reversed(choices)}
    chosen = next((by_tag[t] for t in DEFAULT_QUANTS if t in by_tag), None)
    if chosen is None and len(choices) == 1:
        chosen = choices[0]
    if chosen is None:
        raise HubError(f"{ref.repo_id} has no {', '.join(DEFAULT_QUANTS)} GGUF to take by "
                       f"default; name one of {have} as {ref.repo_id}:TAG")
    if say is not None:
        say(f"{ref.repo_id}: taking {chosen.label} ({chosen.files[0]}"
            + (f" and {len(chosen.files) - 1} more shards" if len(chosen.files) > 1 else "")
            + f"); it has {have}; name another as {ref.repo_id}:TAG")
    return chosen


def safetensors_side_files(ref: HubRef, files: list[str]) -> list[str]:
    """What an HF folder needs before its weights: the side files the repo has."""
    present = set(files)
    if "config.json" not in present:
        raise HubError(f"{ref.repo_id} has neither GGUF files nor an HF model (config.json); "
                       f"it has {_some(files)}")
    return [f for f in SIDE_FILES if f in present]


def safetensors_weights(ref: HubRef, files: list[str], index: Path | None) -> list[str]:
    """The weight files: the shards the index names, else model.safetensors, else every
    top-level *.safetensors."""
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            wanted = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HubError(f"{ref.repo_id}: model.safetensors.index.json has no readable "
                           f"weight_map ({exc})") from None
        missing = [f for f in wanted if f not in files]
        if missing:
            raise HubError(f"{ref.repo_id}: model.safetensors.index.json names "
                           f"{', '.join(missing)}, which the repo lacks")
        return wanted
    if "model.safetensors" in files:
        return ["model.safetensors"]
    top = [f for f in files if "/" not in f and f.endswith(".safetensors")]
    if not top:
        raise HubError(f"{ref.repo_id} has a config.json but no .safetensors weights (nor GGUF "
                       f"files); it has {_some(files)}")
    return top


def _some(files: list[str]) -> str:
    shown = ", ".join(sorted(files)[:8])
    return (shown + (f" and {len(files) - 8} more" if len(files) > 8 else "")) or "no files"


# -- talking to the Hub --

def _hf():
    return require("huggingface_hub")


@contextmanager
def _explained(ref: HubRef, revision: str) -> Iterator[None]:
    """huggingface_hub's exceptions as one-line HubErrors that say what to do."""
    hf = _hf()
    E = require("huggingface_hub.errors", "huggingface_hub")
    httpx2 = require("httpx2")     # huggingface_hub's HTTP client, whose errors it passes on
    where = f"{ref.repo_id} on {endpoint()}"
    try:
        yield
    except HubError:
        raise
    except E.GatedRepoError as exc:
        has_token = bool(hf.get_token())
        raise HubError(
            f"{where} is gated: " + ("the token in HF_TOKEN has not been granted access; "
                                     if has_token else "set HF_TOKEN to a token of an account ")
            + f"that accepted its terms at {endpoint()}/{ref.repo_id}") from None
    except E.RevisionNotFoundError:
        raise HubError(f"{where} has no revision {revision!r}") from None
    except E.RepositoryNotFoundError:
        raise HubError(f"no model {where} (a private one needs HF_TOKEN)") from None
    except E.RemoteEntryNotFoundError as exc:
        raise HubError(f"{where}: a file it listed is gone ({_first_line(exc)}); "
                       f"pull again") from None
    except E.IncompleteSnapshotError:
        raise HubError(f"the Hub cache {hub_cache()} holds only part of {ref} and "
                       f"{_why_offline()}; `poot pull {ref}` online completes it") from None
    except (E.LocalEntryNotFoundError, E.CachedRepoTreeNotFoundError, E.OfflineModeIsEnabled):
        raise HubError(f"{ref} is not in the Hub cache {hub_cache()} and {_why_offline()}; "
                       f"run `poot pull {ref}` online") from None
    except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError) as exc:
        raise HubError(f"cannot reach {endpoint()} for {ref}: {_first_line(exc)} (no network? "
                       f"HF_ENDPOINT names a mirror, HF_HUB_OFFLINE=1 uses the cache "
                       f"only)") from None
    except E.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(f"{where}: the Hub answered {status}: {_first_line(exc)}") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise HubError(f"disk full while fetching {ref} into {hub_cache()}: "
                           f"{exc.strerror}; nothing partial was kept") from None
        raise


def _why_offline() -> str:
    return "HF_HUB_OFFLINE=1 forbids the network" if offline() else "the Hub was not asked"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def pull(ref: HubRef, *, revision: str | None = None,
         say: Callable[[str], None] | None = _say) -> Path:
    """Fetch the model `ref` names (at `revision`, else the ref's, else main) into the Hub
    cache, with a progress bar; its local path: the GGUF's first shard, or the HF folder.
    Offline ($HF_HUB_OFFLINE), what the cache holds."""
    if offline():
        return cached(ref, revision=revision, say=say)
    hf = _hf()
    rev = revision or ref.revision or "main"
    api = hf.HfApi(endpoint=endpoint())
    with _explained(ref, rev):
        info = api.model_info(ref.repo_id, revision=rev, files_metadata=True)
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or ()}

        def fetch(files: list[str]) -> str:
            _check_space(ref, info.sha, {f: sizes[f] for f in files})
            return _download(ref, rev, files)

        return _model_files(ref, list(sizes), fetch, say)


def cached(ref: HubRef, *, revision: str | None = None,
           say: Callable[[str], None] | None = None) -> Path:
    """The model `ref` names from the Hub cache alone (no network); HubError when the
    cache lacks it or holds only part of it."""
    hf = _hf()
    rev = revision or ref.revision or "main"
    with _explained(ref, rev):
        tree = hf.get_cached_repo_tree(ref.repo_id, revision=rev, cache_dir=hub_cache())
        return _model_files(ref, [f.path for f in tree],
                            lambda files: _local(ref, rev, files), say)


def _model_files(ref: HubRef, files: list[str], fetch: Callable[[list[str]], str],
                 say: Callable[[str], None] | None) -> Path:
    """The model's path once `fetch` (the Hub, or the cache) has the files it needs: the
    chosen GGUF's shards, or an HF folder's side files and then the weights they name."""
    choice = pick_gguf(ref, files, say)
    if choice is not None:
        return Path(fetch(list(choice.files))) / choice.files[0]
    side = safetensors_side_files(ref, files)
    index = Path(fetch(side)) / "model.safetensors.index.json"
    weights = safetensors_weights(ref, files, index if index.is_file() else None)
    return Path(fetch(side + weights))


def resolve(ref: HubRef, *, pull_missing: bool) -> Path:
    """The model's local path: from the cache when it holds it whole, else pulled (when
    `pull_missing` and not offline), else a HubError saying how to get it."""
    try:
        return cached(ref)
    except HubError:
        if not pull_missing or offline():
            raise
    return pull(ref)


def _download(ref: HubRef, revision: str, files: list[str]) -> str:
    hf = _hf()
    return hf.snapshot_download(ref.repo_id, revision=revision, allow_patterns=files,
                                cache_dir=hub_cache(), endpoint=endpoint(),
                                library_name="poot")


def _local(ref: HubRef, revision: str, files: list[str]) -> str:
    hf = _hf()
    return hf.snapshot_download(ref.repo_id, revision=revision, allow_patterns=files,
                                cache_dir=hub_cache(), local_files_only=True)


def _check_space(ref: HubRef, commit: str | None, sizes: dict[str, int]) -> None:
    """Refuse before downloading what the disk cannot hold (huggingface_hub only warns)."""
    fd = require("huggingface_hub.file_download", "huggingface_hub")
    snapshot = hub_cache() / fd.repo_folder_name(repo_id=ref.repo_id, repo_type="model") \
        / "snapshots" / (commit or "")
    need = sum(n for f, n in sizes.items() if not (commit and (snapshot / f).is_file()))
    if need == 0:
        return
    there = hub_cache()
    while not there.exists() and there != there.parent:
        there = there.parent
    free = shutil.disk_usage(there).free
    if need > free:
        raise HubError(f"{ref} needs {_mib(need)} and {there} has {_mib(free)} free; "
                       f"free some space or point HF_HUB_CACHE elsewhere")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class CachedRepo:
    repo_id: str
    path: Path
    bytes: int
    revisions: tuple[str, ...]   # the refs (main, ...) or else commit hashes
    last_modified: float


def cached_repos() -> list[CachedRepo]:
    """The model repos in the Hub cache (any tool's), by id; [] when there is none."""
    root = hub_cache()
    if not root.is_dir():
        return []
    hf = _hf()
    info = hf.scan_cache_dir(root)
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        refs = sorted({r for rev in repo.revisions for r in rev.refs}) or \
            sorted(rev.commit_hash[:12] for rev in repo.revisions)
        out.append(CachedRepo(repo.repo_id, repo.repo_path, repo.size_on_disk, tuple(refs),
                              repo.last_modified))
    return out
