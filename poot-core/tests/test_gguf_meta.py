"""GGUF metadata as plain Python values, from files written by the gguf package's writer."""
from __future__ import annotations

import numpy as np
import pytest
from poot.errors import CheckpointError
from poot.models.gguf_meta import read_gguf_metadata


def write_gguf(path, fill) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    fill(writer)
    writer.add_tensor("w", np.random.default_rng(0).standard_normal(8).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def every_kind(writer) -> None:
    writer.add_string("t.text", "héllo 🙂")
    writer.add_uint32("t.u32", 49152)
    writer.add_int64("t.i64", -7)
    writer.add_float32("t.f32", 1e-5)
    writer.add_bool("t.flag", True)
    writer.add_array("t.words", ["Ġa", "▁b", "<|im_end|>"])
    writer.add_array("t.ints", [3, 1, 4, 1, 5])
    writer.add_array("t.floats", [0.5, -2.0])
    writer.add_array("t.flags", [True, False])


def test_values_come_back_as_plain_python(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, every_kind)
    meta = read_gguf_metadata(path)
    assert meta["general.architecture"] == "llama"
    assert meta["t.text"] == "héllo 🙂"
    assert meta["t.u32"] == 49152 and type(meta["t.u32"]) is int
    assert meta["t.i64"] == -7
    assert meta["t.f32"] == pytest.approx(1e-5) and type(meta["t.f32"]) is float
    assert meta["t.flag"] is True
    assert meta["t.words"] == ["Ġa", "▁b", "<|im_end|>"]
    assert meta["t.ints"] == [3, 1, 4, 1, 5] and all(type(v) is int for v in meta["t.ints"])
    assert meta["t.floats"] == [0.5, -2.0]
    assert meta["t.flags"] == [True, False] and all(type(v) is bool for v in meta["t.flags"])


def test_unreadable_files_are_checkpoint_errors(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, every_kind)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:60])
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    cases = [(tmp_path / "missing.gguf", "not found"), (truncated, "truncated or corrupted"),
             (not_gguf, "not a GGUF file")]
    for bad, message in cases:
        with pytest.raises(CheckpointError, match=message):
            read_gguf_metadata(bad)
