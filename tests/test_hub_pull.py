"""`poot pull ORG/NAME[:QUANT]` and Hub names in `poot run/info`, through huggingface_hub
against tests/fake_hub.py (HF_ENDPOINT): which files a GGUF or safetensors repo needs,
quantization tags, split GGUFs, revisions, the offline cache, and the refusals (gated,
missing, wrong tag, no network, full disk), each one line with nothing partial left."""
from __future__ import annotations

import errno
import functools
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_hub import FakeHub
from poot.errors import CheckpointError
from poot.models import hf_hub, hub
from poot.models.hf_hub import HubError, HubRef, parse_ref, pick_gguf

GGUF_REPO = "poot-tests/tiny-qwen3-GGUF"
ST_REPO = "poot-tests/tiny-llama"


def gguf_bytes(tmp_path: Path, seed: int, split: int = 0) -> list[bytes]:
    """A 2-layer Qwen3 GGUF (tests/test_gguf_families.py), whole or in shards of
    `split` tensors written by gguf's own splitting writer."""
    import gguf
    from test_gguf_families import write_gguf

    folder = tmp_path / f"gguf-{seed}-{split}"
    folder.mkdir()
    writer = gguf.GGUFWriter
    try:
        if split:
            gguf.GGUFWriter = functools.partial(writer, split_max_tensors=split)
        write_gguf(folder / "m.gguf", "qwen3", seed=seed)
    finally:
        gguf.GGUFWriter = writer
    return [p.read_bytes() for p in sorted(folder.glob("*.gguf"))]


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """The files of a GGUF repo (two quantizations, a split one, a projector, a README)
    and of a safetensors repo (sharded weights, tokenizer, and files loading never reads)."""
    from poot_quant.safetensors_dir import write_folder
    from test_families import BASE, FAMILIES, random_tensors, write_tokenizer

    tmp = tmp_path_factory.mktemp("repos")
    f16 = gguf_bytes(tmp, 3, split=8)
    assert len(f16) > 1
    gguf_files = {"tiny-qwen3-Q4_K_M.gguf": gguf_bytes(tmp, 1)[0],
                  "tiny-qwen3-Q8_0.gguf": gguf_bytes(tmp, 2)[0],
                  "mmproj-tiny-qwen3-F16.gguf": b"GGUF not a language model",
                  "README.md": b"# tiny qwen3\n"}
    gguf_files.update({f"F16/tiny-qwen3-F16-{n:05d}-of-{len(f16):05d}.gguf": data
                       for n, data in enumerate(f16, start=1)})
    cfg = {**BASE, **FAMILIES["llama"]}
    folder = write_folder(tmp / "llama", random_tensors(cfg, seed=5), cfg, shards=2)
    write_tokenizer(folder)
    st_files = {p.name: p.read_bytes() for p in folder.iterdir()}
    st_files.update({"consolidated.safetensors": b"weights in another layout",
                     "pytorch_model.bin": b"pickle", "original/params.json": b"{}",
                     "README.md": b"# tiny llama\n"})
    return {"gguf": gguf_files, "st": st_files, "folder": folder}


@pytest.fixture
def fake(repos, tmp_path, monkeypatch):
    with FakeHub() as server:
        server.add(GGUF_REPO, repos["gguf"])
        server.add(ST_REPO, repos["st"])
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HOME"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
        monkeypatch.setenv("POOT_CACHE", str(tmp_path / "poot"))
        yield server


def downloads(server: FakeHub) -> set[str]:
    """The repo files fetched whole (small ones from the Hub, LFS ones from the CDN)."""
    out = set()
    for method, _, path, _, _ in server.requests:
        if method == "GET" and "/resolve/" in path:
            out.add(path.split("/", 6)[-1])
    cdn_port = int(server.cdn.rsplit(":", 1)[-1])
    lfs = {hashlib.sha256(d).hexdigest(): name for r in server.repos.values()
           for files in r.commits.values() for name, d in files.items()}
    out |= {lfs[p.rsplit("/", 1)[-1]] for m, port, p, _, _ in server.requests
            if m == "GET" and port == cdn_port}
    return out


def blobs_partial(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.name.endswith(".incomplete")]


def test_hub_references_parse():
    assert parse_ref("Org/Name") == HubRef("Org/Name")
    assert parse_ref("hf.co/org/name-GGUF:q4_k_m") == HubRef("org/name-GGUF", "Q4_K_M")
    assert parse_ref("https://huggingface.co/org/n.1@v2:Q8_0") == HubRef("org/n.1", "Q8_0", "v2")
    assert parse_ref("org/name@0123abc") == HubRef("org/name", None, "0123abc")
    for local in ("smollm2", "./org/name", "/abs/org/name", "~/x/y", "dir/model.gguf", "a/b/c"):
        assert parse_ref(local) is None, local
    with pytest.raises(HubError, match="not a Hub reference"):
        parse_ref("hf.co/just-a-name")


def test_quant_tags_pick_a_file():
    files = ["a/README.md", "m-Q8_0.gguf", "m.Q4_K_M.gguf", "mmproj-m-F16.gguf",
             "UD-Q4_K_XL/m-UD-Q4_K_XL-00001-of-00002.gguf",
             "UD-Q4_K_XL/m-UD-Q4_K_XL-00002-of-00002.gguf",
             "m-Q6_K-00001-of-00003.gguf"]  # an incomplete set is not offered
    said = []
    assert pick_gguf(HubRef("o/m"), files, said.append).files == ("m.Q4_K_M.gguf",)
    assert said == ["o/m: taking Q4_K_M (m.Q4_K_M.gguf); it has Q4_K_XL, Q8_0, Q4_K_M; "
                    "name another as o/m:TAG"]
    assert pick_gguf(HubRef("o/m", "Q8_0"), files).files == ("m-Q8_0.gguf",)
    assert pick_gguf(HubRef("o/m", "Q4_K_XL"), files).files == tuple(files[4:6])
    with pytest.raises(HubError, match=r"^o/m has no Q6_K GGUF; it has Q4_K_XL, Q8_0, Q4_K_M$"):
        pick_gguf(HubRef("o/m", "Q6_K"), files)
    with pytest.raises(HubError, match="no Q4_K_M, Q4_0, Q8_0 GGUF to take by default; name "
                                       "one of Q5_K_M, Q6_K as o/m:TAG"):
        pick_gguf(HubRef("o/m"), ["m-Q5_K_M.gguf", "m-Q6_K.gguf"])
    assert pick_gguf(HubRef("o/m"), ["model.gguf"]).files == ("model.gguf",)
    assert pick_gguf(HubRef("o/m"), ["model.safetensors", "config.json"]) is None
    with pytest.raises(HubError, match="has no GGUF files"):
        pick_gguf(HubRef("o/m", "Q4_0"), ["model.safetensors", "config.json"])


def test_gguf_repo_default_quant_and_tags(fake, repos, capsys):
    from poot.models.loader import open_model

    path = hub.pull(GGUF_REPO)
    assert path.name == "tiny-qwen3-Q4_K_M.gguf" and path.read_bytes() == \
        repos["gguf"]["tiny-qwen3-Q4_K_M.gguf"]
    assert Path(os.environ["HF_HUB_CACHE"]) in path.parents and "snapshots" in path.parts
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{GGUF_REPO}: taking Q4_K_M (tiny-qwen3-Q4_K_M.gguf); it has F16, Q4_K_M, Q8_0; "
        f"name another as {GGUF_REPO}:TAG")
    assert downloads(fake) == {"tiny-qwen3-Q4_K_M.gguf"}
    # LFS files as on the Hub: HEAD answers 302 with X-Linked-*, the CDN gets no token
    cdn = int(fake.cdn.rsplit(":", 1)[-1])
    assert any(m == "HEAD" and "/resolve/" in p for m, _, p, _, _ in fake.requests)
    ckpt, config = open_model(f"hf.co/{GGUF_REPO}:q8_0")
    assert ckpt.path.name == "tiny-qwen3-Q8_0.gguf" and config.arch == "qwen3"
    ckpt, config = open_model(f"{GGUF_REPO}:F16")      # a split GGUF: every shard
    shards = {f for f in repos["gguf"] if f.startswith("F16/")}
    assert ckpt.path.name == f"tiny-qwen3-F16-00001-of-{len(shards):05d}.gguf"
    whole, _ = open_model(str(path))
    assert config.arch == "qwen3" and sorted(ckpt.tensors) == sorted(whole.tensors)
    assert downloads(fake) == {"tiny-qwen3-Q4_K_M.gguf", "tiny-qwen3-Q8_0.gguf", *shards}
    assert all(auth is None for m, port, _, _, auth in fake.requests if port == cdn)
    with pytest.raises(HubError, match=f"^{GGUF_REPO} has no Q5_K_M GGUF; it has F16, "
                                       f"Q4_K_M, Q8_0$"):
        hub.pull(f"{GGUF_REPO}:Q5_K_M")


def test_safetensors_repo_fetches_only_what_loading_reads(fake, repos):
    import poot

    folder = hub.pull(ST_REPO)
    assert folder.is_dir() and folder.name == fake.repos[ST_REPO].branches["main"]
    want = {"config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"}
    assert downloads(fake) == want
    assert {p.name for p in folder.iterdir()} == want
    # the pulled model computes what the folder it was built from computes
    local = poot.load(str(repos["folder"]), backend="reference", max_seq=32)
    pulled = poot.load(ST_REPO, backend="reference", max_seq=32)
    ids = pulled.tokenizer.encode("the three")
    assert ids == local.tokenizer.encode("the three")
    np.testing.assert_array_equal(pulled.prefill_logits(ids), local.prefill_logits(ids))


def test_revisions(fake, repos):
    v2 = {**repos["gguf"], "tiny-qwen3-Q4_K_M.gguf": repos["gguf"]["tiny-qwen3-Q8_0.gguf"]}
    sha = fake.repos[GGUF_REPO].commit(v2, branch="v2")
    main = hub.pull(GGUF_REPO)
    other = hub.pull(GGUF_REPO, revision="v2")
    assert other.parent.name == sha and other.read_bytes() != main.read_bytes()
    assert hub.resolve_model(f"{GGUF_REPO}@v2") == other
    assert hub.resolve_model(f"{GGUF_REPO}@{sha}") == other
    with pytest.raises(HubError, match=f"^{GGUF_REPO} on {fake.endpoint} has no revision "
                                       f"'nope'$"):
        hub.pull(GGUF_REPO, revision="nope")
    with pytest.raises(CheckpointError, match="--revision is for Hub repos"):
        hub.pull("smollm2", revision="v2")


def test_offline_runs_from_the_cache_it_filled(fake, monkeypatch):
    from poot.models.loader import open_model

    path = hub.pull(GGUF_REPO)
    folder = hub.pull(ST_REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake.requests.clear()
    assert hub.resolve_model(GGUF_REPO, pull_missing=True) == path
    assert hub.pull(ST_REPO) == folder
    _, config = open_model(ST_REPO)
    assert config.arch == "llama" and fake.requests == []
    with pytest.raises(HubError, match=r"holds only part of .*:Q8_0 and HF_HUB_OFFLINE=1 "
                                       r"forbids the network"):
        hub.resolve_model(f"{GGUF_REPO}:Q8_0", pull_missing=True)
    with pytest.raises(HubError, match="^poot-tests/never-pulled is not in the Hub cache .* "
                                       "HF_HUB_OFFLINE=1 forbids"):
        hub.pull("poot-tests/never-pulled")
    assert fake.requests == []


def test_no_network(fake, monkeypatch):
    path = hub.pull(GGUF_REPO)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    with pytest.raises(HubError, match=r"^cannot reach http://127.0.0.1:9 for "
                                       r"poot-tests/tiny-llama: .*no network\?"):
        hub.pull(ST_REPO)
    assert hub.resolve_model(GGUF_REPO, pull_missing=True) == path   # the cache still serves


def test_gated_private_and_missing_repos(fake, repos, monkeypatch):
    files = {"m-Q4_0.gguf": repos["gguf"]["tiny-qwen3-Q8_0.gguf"]}
    fake.add("poot-tests/gated", files, gated=True, token="hf_granted")
    fake.add("poot-tests/private", files, token="hf_owner")
    cache = Path(os.environ["HF_HUB_CACHE"])
    with pytest.raises(HubError, match="^poot-tests/gated on .* is gated: set HF_TOKEN to a "
                                       "token of an account that accepted its terms at "):
        hub.pull("poot-tests/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(HubError, match="the token in HF_TOKEN has not been granted access"):
        hub.pull("poot-tests/gated")
    with pytest.raises(HubError, match=r"^no model poot-tests/private on .* \(a private one "
                                       r"needs HF_TOKEN\)$"):
        hub.pull("poot-tests/private")
    with pytest.raises(HubError, match="^no model poot-tests/absent on "):
        hub.resolve_model("poot-tests/absent", pull_missing=True)
    assert not list(cache.rglob("*.gguf"))
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    assert hub.pull("poot-tests/gated").name == "m-Q4_0.gguf"
    monkeypatch.setenv("HF_TOKEN", "hf_owner")
    assert hub.pull("poot-tests/private").read_bytes() == files["m-Q4_0.gguf"]


def test_a_dropped_download_resumes_with_a_range(fake):
    """huggingface_hub keeps what it has read in whole chunks (DOWNLOAD_CHUNK_SIZE) and asks
    for the rest with a Range when a connection drops mid-file."""
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    data = b"GGUF" + np.random.default_rng(0).bytes(DOWNLOAD_CHUNK_SIZE + 4096)
    fake.add("poot-tests/large", {"large-Q4_0.gguf": data})
    fake.drop_after["large-Q4_0.gguf"] = DOWNLOAD_CHUNK_SIZE + 1000
    path = hub.pull("poot-tests/large")
    assert path.read_bytes() == data
    assert f"bytes={DOWNLOAD_CHUNK_SIZE}-" in {r for _, _, _, r, _ in fake.requests}
    assert blobs_partial(Path(os.environ["HF_HUB_CACHE"])) == []


def test_a_full_disk_leaves_nothing_partial(fake, monkeypatch):
    import huggingface_hub.file_download as fd

    cache = Path(os.environ["HF_HUB_CACHE"])
    real = hf_hub.shutil.disk_usage
    monkeypatch.setattr(hf_hub.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1000))
    with pytest.raises(HubError, match=r"needs 0\.\d MiB and .* has 0\.0 MiB free"):
        hub.pull(GGUF_REPO)
    monkeypatch.setattr(hf_hub.shutil, "disk_usage", real)
    original = fd.http_get

    def fills_the_disk(url, temp_file, **kw):   # the disk fills during the write
        temp_file.write(b"GGUF partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fd, "http_get", fills_the_disk)
    with pytest.raises(HubError, match=r"^disk full while fetching .*: No space left on "
                                       r"device; nothing partial was kept$"):
        hub.pull(GGUF_REPO)
    assert blobs_partial(cache) == [] and not list(cache.rglob("*.gguf"))
    monkeypatch.setattr(fd, "http_get", original)
    assert hub.pull(GGUF_REPO).is_file()


def poot_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_cli_pull_info_and_refusals(fake):
    done = poot_cli("pull", GGUF_REPO, "--revision", "main")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "tiny-qwen3-Q4_K_M.gguf" and path.is_file()
    assert "taking Q4_K_M" in done.stderr
    info = poot_cli("info", f"hf.co/{GGUF_REPO}:Q8_0")
    assert info.returncode == 0, info.stderr
    assert "tiny-qwen3-Q8_0.gguf" in info.stdout and "qwen3" in info.stdout
    # offline as huggingface_hub itself reads it (at import), with no Hub to reach
    offline = poot_cli("info", GGUF_REPO, env={"HF_HUB_OFFLINE": "1",
                                               "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 0 and "tiny-qwen3-Q4_K_M.gguf" in offline.stdout, \
        offline.stderr
    for args, message in ((("pull", "poot-tests/absent"), "no model poot-tests/absent on"),
                          (("pull", f"{GGUF_REPO}:IQ2_XS"), "has no IQ2_XS GGUF; it has")):
        done = poot_cli(*args)
        assert done.returncode != 0
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0], done.stderr
    doctor = poot_cli("doctor")
    assert f"Hub cache {os.environ['HF_HUB_CACHE']}: " in doctor.stdout
    assert f"  {GGUF_REPO} (main) " in doctor.stdout
    listed = poot_cli("list")
    assert listed.returncode == 0 and GGUF_REPO in listed.stdout, listed.stderr
    gone = poot_cli("rm", GGUF_REPO)
    assert gone.returncode == 0 and f"deleted {GGUF_REPO}" in gone.stdout, gone.stderr
    assert GGUF_REPO not in poot_cli("list").stdout and not path.exists()


def test_the_real_smollm2_through_the_hub(fake, smollm2_gguf):
    """The real checkpoint served as a one-file GGUF repo arrives byte for byte and writes
    the text the local file writes."""
    import poot

    data = Path(smollm2_gguf).read_bytes()
    fake.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
             {"smollm2-135m-instruct-q4_1.gguf": data, "README.md": b"# SmolLM2\n"})
    path = hub.pull("hf.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    assert path.name == "smollm2-135m-instruct-q4_1.gguf"
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()
    prompt = "The capital of France is"
    pulled = poot.load("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", backend="cpu", max_seq=64)
    text = pulled.generate(prompt, max_tokens=8)
    assert "Paris" in text
    assert text == poot.load(str(smollm2_gguf), backend="cpu", max_seq=64).generate(
        prompt, max_tokens=8)
