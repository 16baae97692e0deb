"""Split GGUFs (llama.cpp's gguf-split layout, written here by gguf.GGUFWriter's own
split_max_tensors): the first shard opens the whole model, equal to the unsplit file;
a missing, foreign or out-of-order shard is a CheckpointError naming it."""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
from poot.errors import CheckpointError
from poot_quant.gguf_file import open_gguf

Q = gguf.GGMLQuantizationType


def write(path, *, split_max_tensors: int = 0, seed: int = 0) -> None:
    """Five tensors (Q8_0 matrices and an f32 vector) and a few keys, split or not."""
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_block_count(2)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    for i in range(4):
        values = rng.standard_normal((4, 64)).astype(np.float32)
        w.add_tensor(f"blk.{i}.w", quantize(values, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def split(tmp_path):
    write(tmp_path / "whole.gguf")
    write(tmp_path / "m.gguf", split_max_tensors=2)
    shards = sorted(tmp_path.glob("m-*.gguf"))
    assert [p.name for p in shards] == [f"m-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    return tmp_path, shards


def test_the_first_shard_opens_the_whole_model(split):
    folder, shards = split
    whole, parts = open_gguf(folder / "whole.gguf"), open_gguf(shards[0])
    assert parts.path == shards[0] and parts.kind == "gguf"
    assert parts.metadata["split.count"] == 3 and parts.metadata["split.tensors.count"] == 5
    def keys(metadata):  # the header's own counts (GGUF.*) are the first shard's
        return {k: v for k, v in metadata.items() if not k.startswith(("split.", "GGUF."))}

    assert keys(parts.metadata) == keys(whole.metadata)
    assert sorted(parts.tensors) == sorted(whole.tensors)
    for name, info in whole.tensors.items():
        got = parts.tensors[name]
        assert got.storage == info.storage and got.shape == info.shape
        np.testing.assert_array_equal(got.dequantize(), info.dequantize())
    # each tensor reads its own shard's bytes
    files = {t.ref.checkpoint for t in parts.tensors.values()}
    assert files == {str(p) for p in shards}


def test_a_missing_shard_is_named(split):
    _, shards = split
    shards[2].unlink()
    with pytest.raises(CheckpointError, match="shard 3 .m-00003-of-00003.gguf. is missing"):
        open_gguf(shards[0])


def test_a_later_shard_is_refused_with_the_first_named(split):
    _, shards = split
    with pytest.raises(CheckpointError, match="shard 2 of 3.*open its first shard"):
        open_gguf(shards[1])


def test_shards_out_of_order_or_renamed(split, tmp_path):
    folder, shards = split
    shards[1].rename(folder / "tmp.gguf")
    shutil.copy(shards[2], shards[1])          # shard 3's file in shard 2's place
    with pytest.raises(CheckpointError, match="split.no/split.count are 2/3, expected 1/3"):
        open_gguf(shards[0])
    renamed = folder / "renamed.gguf"
    shutil.copy(shards[0], renamed)
    with pytest.raises(CheckpointError, match="its name is not the first shard's"):
        open_gguf(renamed)
