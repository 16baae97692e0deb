"""A small Hugging Face Hub for tests, on 127.0.0.1: the endpoints huggingface_hub calls
(read from its source: hf_api.model_info, list_repo_tree, file_download.get_hf_file_metadata
and http_get), pointed at by HF_ENDPOINT.

- GET /api/models/ORG/NAME[/revision/REV]: the repo's info, `sha` and `siblings` (with
  sizes and LFS hashes when asked with ?blobs=True).
- GET /api/models/ORG/NAME/tree/REV: the recursive file listing, one page.
- HEAD|GET /ORG/NAME/resolve/REV/PATH: a small file answers itself (ETag = its git blob id,
  X-Repo-Commit); an LFS file (.gguf, .safetensors) answers 302 to a second server, the
  "CDN", on another port, with X-Linked-Etag (its sha256), X-Linked-Size and X-Repo-Commit
  on the redirect, as the Hub does; the CDN serves byte ranges (206, Content-Range).
- The Hub's refusals, with its X-Error-Code: RepoNotFound (404; a private repo without its
  token too), GatedRepo (on a gated repo's files: 401 without a token, 403 with one not
  granted; its info and listing are open), RevisionNotFound (404), EntryNotFound (404).

`drop_after[path] = n` makes the CDN's next full GET of `path` close the connection after n
bytes (a dropped download, which huggingface_hub resumes with a Range request). `requests`
logs (method, host port, path, Range, Authorization) for the tests to check.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """A model repo: commits (sha -> files), branches (name -> sha), access."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    token: str | None = None      # the token granted access (gated) or owning it (private)

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        sha = hashlib.sha1(json.dumps(sorted((k, git_blob_id(v)) for k, v in files.items()))
                           .encode() + branch.encode() + bytes([len(self.commits)])).hexdigest()
        self.commits[sha] = dict(files)
        self.branches[branch] = sha
        return sha


class FakeHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, int, str, str | None, str | None]] = []
        self.drop_after: dict[str, int] = {}
        self.lock = threading.Lock()
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler(cdn))
                         for cdn in (False, True)]
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True)
                         for s in self._servers]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def __enter__(self) -> FakeHub:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()

    def add(self, repo_id: str, files: dict[str, bytes], **access) -> Repo:
        repo = self.repos.setdefault(repo_id, Repo(**access))
        repo.commit(files)
        return repo

    def blob(self, sha256: str) -> bytes | None:
        for repo in self.repos.values():
            for files in repo.commits.values():
                for data in files.values():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return data
        return None

    def _handler(self, cdn: bool):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _answer(self, head: bool):
                url = urlsplit(self.path)
                with hub.lock:
                    hub.requests.append((self.command, self.server.server_address[1],
                                         unquote(url.path), self.headers.get("Range"),
                                         self.headers.get("Authorization")))
                if cdn:
                    return self._cdn(url.path, head)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                query = parse_qs(url.query)
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    return self._api(parts[2] + "/" + parts[3], parts[4:], query)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve(parts[0] + "/" + parts[1], parts[3],
                                         "/".join(parts[4:]), head)
                self._send(404, b"not found")

            def _access(self, repo_id: str, files: bool = True) -> Repo | None:
                """The repo, or the Hub's refusal sent: a private repo is not found without
                its token; a gated one lists its files to anyone but serves them only to a
                token granted access."""
                repo = hub.repos.get(repo_id)
                auth = self.headers.get("Authorization") or ""
                token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
                if repo is None or (repo.token and not repo.gated and token != repo.token):
                    self._send(404, b"{}", {"X-Error-Code": "RepoNotFound",
                                            "X-Error-Message": "Repository not found"})
                    return None
                if files and repo.gated and token != repo.token:
                    self._send(403 if token else 401, b"{}", {
                        "X-Error-Code": "GatedRepo",
                        "X-Error-Message": f"Access to model {repo_id} is restricted."})
                    return None
                return repo

            def _commit(self, repo_id: str, repo: Repo, rev: str) -> str | None:
                sha = repo.branches.get(rev, rev if rev in repo.commits else None)
                if sha is None:
                    self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound",
                                            "X-Error-Message": f"Invalid rev id: {rev}"})
                return sha

            def _api(self, repo_id: str, rest: list[str], query):
                repo = self._access(repo_id, files=False)
                if repo is None:
                    return
                if rest[:1] == ["tree"] and len(rest) >= 2:
                    sha = self._commit(repo_id, repo, rest[1])
                    if sha:
                        self._json([_entry(p, d, "type") for p, d in
                                    sorted(repo.commits[sha].items())])
                    return
                rev = rest[1] if rest[:1] == ["revision"] and len(rest) >= 2 else "main"
                sha = self._commit(repo_id, repo, rev)
                if sha is None:
                    return
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                siblings = [_entry(p, d, "rfilename") if blobs else {"rfilename": p}
                            for p, d in sorted(repo.commits[sha].items())]
                self._json({"id": repo_id, "modelId": repo_id, "sha": sha,
                            "private": bool(repo.token and not repo.gated),
                            "gated": "manual" if repo.gated else False,
                            "siblings": siblings, "tags": [], "downloads": 0, "likes": 0})

            def _resolve(self, repo_id: str, rev: str, path: str, head: bool):
                repo = self._access(repo_id)
                if repo is None:
                    return
                sha = self._commit(repo_id, repo, rev)
                if sha is None:
                    return
                data = repo.commits[sha].get(path)
                if data is None:
                    self._send(404, b"{}", {"X-Error-Code": "EntryNotFound",
                                            "X-Repo-Commit": sha})
                    return
                if path.endswith(LFS_SUFFIXES):
                    digest = hashlib.sha256(data).hexdigest()
                    self._send(302, b"", {
                        "Location": f"{hub.cdn}/cdn/{digest}?name={path.rsplit('/', 1)[-1]}",
                        "X-Repo-Commit": sha, "X-Linked-Etag": f'"{digest}"',
                        "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_id(data)}"'})
                    return
                self._send(200, data, {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": sha},
                           head=head)

            def _cdn(self, path: str, head: bool):
                digest = path.rsplit("/", 1)[-1]
                data = hub.blob(digest)
                if data is None:
                    return self._send(404, b"no such blob")
                start = 0
                ranged = self.headers.get("Range")
                if ranged and ranged.startswith("bytes=") and ranged.endswith("-"):
                    start = int(ranged[len("bytes="):-1])
                body = data[start:]
                headers = {"ETag": f'"{digest}"', "Accept-Ranges": "bytes"}
                if ranged:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                name = parse_qs(urlsplit(self.path).query).get("name", [""])[0]
                with hub.lock:
                    cut = hub.drop_after.pop(name, None) if not ranged and not head else None
                if cut is not None:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(206 if ranged else 200, body, headers, head=head)

            def _json(self, value):
                self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

            def _send(self, status: int, body: bytes, headers=None, head: bool = False):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        return Handler


def _entry(path: str, data: bytes, key: str) -> dict:
    """A file as the tree listing (key "type") or model info's siblings ("rfilename")
    give it: size and git blob id, and for an LFS file its sha256."""
    out = {"path": path, "type": "file"} if key == "type" else {"rfilename": path}
    oid = git_blob_id(data)
    out.update({"size": len(data), ("oid" if key == "type" else "blobId"): oid})
    if path.endswith(LFS_SUFFIXES):
        out["lfs"] = {"oid" if key == "type" else "sha256": hashlib.sha256(data).hexdigest(),
                      "size": len(data), "pointerSize": 134}
    return out
