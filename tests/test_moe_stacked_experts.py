"""Mixtral, Qwen2-MoE and Qwen3-MoE folders holding their experts stacked as transformers 5
holds them (what its `save_pretrained(save_original_format=False)` writes; the default save
reverts to one tensor per expert): the numpy forward's logits of the same weights, per-expert,
on reference and cpu; stacks of the wrong shape or missing a half refused by name.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from reference_decoder import forward
from test_families import (BACKEND, BASE, DIM, FAMILIES, IDS, check_logits, random_tensors,
                           rel_err, transformers5, write_tokenizer)

#: an HF per-expert matrix (4.x, and transformers 5's default save): layer, expert, matrix
_PER_EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\."
                         r"(w1|w3|w2|gate_proj|up_proj|down_proj)\.weight")
_ROLE = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down",
         "down_proj": "down"}


def stacked_experts(tensors: dict) -> dict:
    """The per-expert tensors as transformers 5 holds them, for any MoE family: per layer
    mlp.experts.gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and
    mlp.experts.down_proj [E, H, I]; Mixtral's block_sparse_moe router as mlp.gate."""
    out, parts = {}, {}
    for name, array in tensors.items():
        m = _PER_EXPERT.fullmatch(name)
        if m is None:
            out[name.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = array
        else:
            parts.setdefault(int(m.group(1)), {})[int(m.group(2)), _ROLE[m.group(3)]] = array
    for layer, mats in parts.items():
        p, n = f"model.layers.{layer}.mlp.experts.", len(mats) // 3
        out[p + "gate_up_proj"] = np.stack([np.concatenate([mats[j, "gate"], mats[j, "up"]])
                                            for j in range(n)])
        out[p + "down_proj"] = np.stack([mats[j, "down"] for j in range(n)])
    return out


MOE = ["mixtral", "qwen2-moe", "qwen3-moe"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (folder of stacked experts, its 4.x config, the numpy forward's logits)."""
    from poot_quant.safetensors_dir import write_folder

    out = {}
    for family in MOE:
        cfg = {**BASE, **FAMILIES[family], "num_hidden_layers": 2}
        tensors = random_tensors(cfg, seed=len(family))
        folder = tmp_path_factory.mktemp("moe-stacked") / family
        write_folder(folder, stacked_experts(tensors), transformers5(cfg), 1, None)
        write_tokenizer(folder)
        out[family] = folder, cfg, forward(tensors, cfg, IDS)
    return out


@pytest.mark.parametrize("family", MOE)
def test_stacked_experts_match_numpy_reference(folders, family):
    """One step of IDS, then the session's chunked prefill and decode."""
    import poot

    folder, _, want = folders[family]
    check_logits(poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6), want)


@pytest.mark.parametrize("family", MOE)
def test_stacked_experts_on_cpu(folders, family):
    """One step of IDS on cpu (its session over the same expert stacks: test_families)."""
    import poot

    folder, _, want = folders[family]
    model = poot.load(str(folder), backend="cpu", max_seq=32, prefill_tokens=6)
    assert rel_err(model.prefill_logits(IDS), want) < 1e-4


def rewritten(folder, out, change) -> str:
    """A copy of `folder` with its tensors passed through `change`."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, out)
    tensors = change(load_file(str(folder / "model.safetensors")))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def test_a_transposed_stack_is_refused_naming_it(tmp_path, folders):
    from poot.errors import ConfigError
    from poot.models.loader import open_model

    name = "model.layers.1.mlp.experts.gate_up_proj"
    ffn = FAMILIES["mixtral"].get("intermediate_size", BASE["intermediate_size"])

    def transpose(t):
        return {**t, name: np.ascontiguousarray(np.swapaxes(t[name], 1, 2))}
    path = rewritten(folders["mixtral"][0], tmp_path / "t", transpose)
    with pytest.raises(ConfigError, match=rf"tensor '{name}' is \[4, {DIM}, {2 * ffn}\], "
                                          rf"but the config implies \[4, {2 * ffn}, {DIM}\]"):
        open_model(path)


@pytest.mark.parametrize("drop", ["gate_up_proj", "down_proj"])
def test_a_stack_missing_its_other_half_is_refused(tmp_path, folders, drop):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    name = f"model.layers.0.mlp.experts.{drop}"
    path = rewritten(folders["qwen3-moe"][0], tmp_path / "t",
                     lambda t: {n: a for n, a in t.items() if n != name})
    with pytest.raises(CheckpointError, match=rf"lack tensor '{name}' \(the other half of "
                                              rf"layer 0's stacked experts\)"):
        open_model(path)


def test_a_layer_without_experts_names_both_layouts(tmp_path, folders):
    from poot.errors import CheckpointError
    from poot.models.loader import open_model

    path = rewritten(folders["mixtral"][0], tmp_path / "t",
                     lambda t: {n: a for n, a in t.items() if ".layers.1.mlp.experts." not in n})
    with pytest.raises(CheckpointError, match=r"lack layer 1's experts \(model\.layers\.1\."
                                              r"block_sparse_moe\.experts\.0\.w1\.weight, or "
                                              r"model\.layers\.1\.mlp\.experts\.gate_up_proj\)"):
        open_model(path)
