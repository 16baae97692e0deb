"""PEFT LoRA adapters (poot.models.lora) on random-weight HF folders, against the numpy
forward of tests/reference_decoder.py over the base weights merged with each adapter
(W + scale * B @ A, merged here in numpy, never by poot).

Adapters are written with the `safetensors` package in PEFT's layout: adapter_config.json
and adapter_model.safetensors holding base_model.model.<module>.lora_A/lora_B.weight.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from reference_decoder import forward
from safetensors.numpy import save_file
from test_families import BASE, FAMILIES, IDS, make_folder, random_tensors, rel_err

BACKEND = os.environ.get("POOT_FAMILY_BACKEND", "reference")
ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


#: every key PEFT 0.18 writes to adapter_config.json, at its default
PEFT_DEFAULTS = {
    "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None,
    "auto_mapping": None, "base_model_name_or_path": "random", "bias": "none",
    "corda_config": None, "ensure_weight_tying": False, "eva_config": None,
    "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True,
    "init_lora_weights": True, "layer_replication": None, "layers_pattern": None,
    "layers_to_transform": None, "loftq_config": {}, "lora_bias": False, "lora_dropout": 0.05,
    "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
    "peft_type": "LORA", "peft_version": "0.18.0", "qalora_group_size": 16, "rank_pattern": {},
    "revision": None, "target_parameters": None, "task_type": "CAUSAL_LM",
    "trainable_token_indices": None, "use_dora": False, "use_qalora": False,
    "use_rslora": False}


def write_adapter(folder, tensors, cfg, modules, r, alpha, seed, **config):
    """A PEFT adapter of rank r over `modules` of every layer; returns (path, merged)."""
    rng = np.random.default_rng(seed)
    out, merged = {}, dict(tensors)
    scale = alpha / (np.sqrt(r) if config.get("use_rslora") else r)
    for i in range(cfg["num_hidden_layers"]):
        for mod in modules:
            name = f"model.layers.{i}.{mod}"
            if name + ".weight" not in tensors:     # (a module some layers lack)
                continue
            w = tensors[name + ".weight"]
            a = (0.3 * rng.standard_normal((r, w.shape[1]))).astype(np.float32)
            b = (0.3 * rng.standard_normal((w.shape[0], r))).astype(np.float32)
            out[f"base_model.model.{name}.lora_A.weight"] = a
            out[f"base_model.model.{name}.lora_B.weight"] = b
            merged[name + ".weight"] = w + np.float32(scale) * (b @ a)
    folder.mkdir(parents=True)
    save_file(out, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        **PEFT_DEFAULTS, "r": r, "lora_alpha": alpha,
        "target_modules": sorted({m.split(".")[-1] for m in modules}), **config}))
    return folder, merged


def tokenizer_sized_folder(tmp_path, family: str):
    """A random-weight folder whose vocabulary is the test tokenizer's 261 tokens (so that
    `poot run` can print every token the model picks); returns (folder, config, tensors)."""
    from poot_quant.safetensors_dir import write_folder
    from test_families import write_tokenizer

    cfg = {**BASE, **FAMILIES[family], "vocab_size": 261}
    tensors = random_tensors(cfg, seed=7)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = tensors[name][:261]
    folder = tmp_path / f"{family}-261"
    write_folder(folder, tensors, cfg, 1, None)
    write_tokenizer(folder)
    return folder, cfg, tensors


@pytest.fixture(scope="module")
def two_adapters(tmp_path_factory):
    """A qwen2 folder (q/k/v biases) and two adapters of different ranks and targets."""
    tmp = tmp_path_factory.mktemp("lora")
    folder, cfg, tensors = make_folder(tmp, "qwen2-yarn")
    a, merged_a = write_adapter(tmp / "attn", tensors, cfg, ATTN, 4, 8, seed=1)
    b, merged_b = write_adapter(tmp / "mlp", tensors, cfg, MLP + ATTN[:1], 2, 4, seed=2,
                                use_rslora=True)
    return folder, cfg, tensors, {"attn": (a, merged_a), "mlp": (b, merged_b)}


def load(two_adapters, backend):
    import poot

    folder, _, _, ads = two_adapters
    return poot.load(str(folder), backend=backend, max_seq=32, prefill_tokens=6,
                     lora=[(name, str(path)) for name, (path, _) in ads.items()])


def check_batched_adapters(two_adapters, backend: str, whole_prompt: bool = True) -> None:
    """One prompt step per adapter (`whole_prompt`), then paged decode steps of three
    sequences (adapter "attn", adapter "mlp", no adapter) in one batch: each row matches
    its merged model."""
    _, cfg, tensors, ads = two_adapters
    model = load(two_adapters, backend)
    want = {"attn": forward(ads["attn"][1], cfg, IDS), "mlp": forward(ads["mlp"][1], cfg, IDS),
            None: forward(tensors, cfg, IDS)}
    for name in ("attn", None) if whole_prompt else ():
        assert rel_err(model.prefill_logits(IDS, adapter=name), want[name]) < 1e-4, name
    session = model.session("paged", batch=3)
    names = ["attn", "mlp", None]
    for s, name in enumerate(names):
        session.open(s, model.adapter_rows(name))
    try:
        for s, name in enumerate(names):
            assert rel_err(session.prefill(s, IDS[:14]), want[name][13]) < 1e-4, name
        for i in range(14, 17):
            got = session.decode({s: IDS[i] for s in range(3)})
            for s, name in enumerate(names):
                assert rel_err(got[s], want[name][i]) < 1e-4, (name, i)
    finally:
        for s in range(3):
            session.close(s)


def test_adapters_match_the_merged_weights_one_batch_many_adapters(two_adapters):
    check_batched_adapters(two_adapters, BACKEND)


def test_adapters_on_wgpu(two_adapters, wgpu_device):
    check_batched_adapters(two_adapters, "wgpu", whole_prompt=False)


def test_the_step_gathers_adapters_and_keeps_one_copy_of_the_base(two_adapters):
    """The base projections appear once; the stacks hold index 0 (zeros) and both adapters."""
    model = load(two_adapters, "reference")
    g = model.step_graph(1, 2, "paged", compiled=False)
    labels = [g.meta(v).identity.label for v in g.consts()]
    assert labels.count("model.layers.0.self_attn.q_proj.weight") == 1
    at = model.consts["lora:blk.0.attn_q.weight:a"]
    assert at.shape == (3, 64, 4) and not at[0].any() and at[1].any() and at[2].any()
    assert not model.consts["lora:blk.0.ffn_up.weight:a"][1].any()  # "attn" has no MLP part
    (vid, slot), = [(v, s) for v, s in g.slots() if g.meta(v).identity.label == "adapter"]
    assert g.type_of(vid).shape == (2,) and slot.kind.label == "lora.adapter"
    assert slot.bound == 3


def test_an_adapter_index_outside_the_loaded_ones_is_refused(two_adapters):
    from poot.errors import SlotRangeError

    model = load(two_adapters, "reference")
    session = model.session("paged", batch=1)
    session.open("s", {"adapter": 3})          # 0 none, 1 "attn", 2 "mlp"
    with pytest.raises(SlotRangeError, match="adapter"):
        session.prefill("s", IDS[:3])


def test_an_undeclared_adapter_role_is_refused(two_adapters):
    """With the role's owner unregistered, no graph may take an adapter index."""
    import poot.models.lora as lora
    from poot import plugin
    from poot.errors import IRError

    model = load(two_adapters, "reference")
    plugin.unregister(lora)
    try:
        with pytest.raises(IRError, match="lora.adapter.*not declared"):
            model.step_graph(1, 1, compiled=False)
    finally:
        plugin.register(lora, "poot.lora")
    model.step_graph(1, 1, compiled=False)


HOSTILE = [
    ({"use_dora": True}, "use_dora"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"loftq_config": {"loftq_bits": 4}}, "loftq_config"),
    ({"target_parameters": ["mlp.experts.down_proj"]}, "target_parameters"),
    ({"use_qalora": True}, "use_qalora"),
    ({"init_lora_weights": "pissa"}, "init_lora_weights"),
    ({"some_new_feature": 1}, "some_new_feature"),
    ({"r": 0}, "r"),
    ({"r": 8}, "lora_A.weight"),               # the tensors hold rank 4
    ({"lora_alpha": "big"}, "lora_alpha"),
    ({"target_modules": ["v_proj"]}, "target_modules"),  # tensors of modules not targeted
]


@pytest.mark.parametrize("change,key", HOSTILE, ids=[k for _, k in HOSTILE])
def test_hostile_adapter_configs_are_refused_naming_file_and_key(two_adapters, tmp_path,
                                                                 change, key):
    import poot
    from poot.errors import CheckpointError

    folder, cfg, tensors, _ = two_adapters
    path, _ = write_adapter(tmp_path / "ad", tensors, cfg, ATTN[:2], 4, 8, seed=3)
    conf = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**conf, **change}))
    with pytest.raises(CheckpointError, match=key) as err:
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(path)])
    assert str(path) in str(err.value)


def test_adapter_tensors_that_do_not_fit_the_base_are_refused(two_adapters, tmp_path):
    import poot
    from poot.errors import CheckpointError, ConfigError

    folder, cfg, tensors, _ = two_adapters
    other = {k: v for k, v in tensors.items()}
    other["model.layers.0.self_attn.q_proj.weight"] = np.zeros((64, 32), np.float32)
    path, _ = write_adapter(tmp_path / "narrow", other, cfg, ATTN[:1], 4, 8, seed=4)
    with pytest.raises(ConfigError, match=r"layers\.0\.self_attn\.q_proj\.lora_A.*\[4, 32\]"):
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(path)])
    stray = tmp_path / "stray"
    write_adapter(stray, tensors, cfg, ATTN[:1], 4, 8, seed=5)
    save_file({"base_model.model.lm_head.lora_A.weight": np.zeros((4, 64), np.float32)},
              str(stray / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head"):
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(stray)])
    with pytest.raises(CheckpointError, match="no adapter_config.json"):
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(tmp_path)])


def test_poot_run_with_lora_prints_the_merged_models_greedy_text(tmp_path, capsys):
    """`poot run FOLDER --lora PATH` continues as the merged weights' argmax says."""
    from poot.cli import main
    from poot.models.tokenizer import Tokenizer

    folder, cfg, tensors = tokenizer_sized_folder(tmp_path, "llama")
    path, merged = write_adapter(tmp_path / "ad", tensors, cfg, ATTN + MLP, 4, 16, seed=6)
    tok = Tokenizer.from_hf_folder(folder)
    ids = tok.encode("the cat", add_special=True)
    for _ in range(3):
        nxt = int(np.argmax(forward(merged, cfg, ids)[-1]))
        assert nxt not in tok.stop_ids
        ids.append(nxt)
    assert main(["run", str(folder), "--prompt", "the cat", "--lora", str(path),
                 "--max-tokens", "3", "--max-seq", "32", "--backend", "reference",
                 "--quiet"]) == 0
    assert capsys.readouterr().out == tok.decode(ids) + "\n"


def test_serve_picks_the_adapter_a_request_names_as_its_model(tmp_path):
    """`poot serve FOLDER --lora tuned=PATH`: requests for "tuned" and for the base, sent
    together, answer as the merged and the base weights' argmax do."""
    import concurrent.futures

    import openai
    from poot.models.tokenizer import Tokenizer
    from serve_process import serve

    folder, cfg, tensors = tokenizer_sized_folder(tmp_path, "llama")
    path, merged = write_adapter(tmp_path / "ad", tensors, cfg, ATTN + MLP, 4, 16, seed=8)
    tok = Tokenizer.from_hf_folder(folder)

    def greedy(weights, n=4):
        ids = tok.encode("the cat", add_special=True)
        start = len(ids)
        for _ in range(n):
            ids.append(int(np.argmax(forward(weights, cfg, ids)[-1])))
        assert not set(ids[start:]) & set(tok.stop_ids)
        return tok.decode(ids[start:])

    want = {"tuned": greedy(merged), "smollm2": greedy(tensors)}
    assert want["tuned"] != want["smollm2"]
    with serve(folder, "--lora", f"tuned={path}", "--max-batch", "2", "--max-seq", "32",
               "--prefill-chunk", "6", "--prefill-batch", "1") as server:
        client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0,
                               timeout=300)
        assert [m.id for m in client.models.list().data] == ["smollm2", "tuned"]

        def ask(model):
            return client.completions.create(model=model, prompt="the cat", max_tokens=4,
                                             temperature=0).choices[0].text

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            got = dict(zip(want, pool.map(ask, want)))
        assert got == want
        with pytest.raises(openai.NotFoundError, match="tuned"):
            ask("other")


@pytest.mark.slow
def test_an_adapter_on_the_real_smollm2_gguf(smollm2_gguf, tmp_path):
    """SmolLM2-135M (GGUF, its q/k rows in llama.cpp's adjacent-pair order) with an adapter
    trained in HF's row order on q, k, v and down of every layer: poot's logits match the
    numpy forward of tests/reference_llama.py over the GGUF weights merged with the adapter
    (B's q/k rows permuted to GGUF's order, as the converter would)."""
    from unittest import mock

    import poot
    import reference_llama
    from test_hf_folder import HEADS, KV_HEADS, hf_rows_to_gguf

    cfg, base = reference_llama.load_weights(str(smollm2_gguf))
    rng = np.random.default_rng(9)
    r, alpha = 8, 16
    tensors, merged = {}, dict(base)
    mods = {"self_attn.q_proj": ("attn_q", HEADS), "self_attn.k_proj": ("attn_k", KV_HEADS),
            "self_attn.v_proj": ("attn_v", None), "mlp.down_proj": ("ffn_down", None)}
    for i in range(cfg.layers):
        for mod, (gguf, heads) in mods.items():
            w = base[f"blk.{i}.{gguf}.weight"]
            a = (0.05 * rng.standard_normal((r, w.shape[1]))).astype(np.float32)
            b = (0.05 * rng.standard_normal((w.shape[0], r))).astype(np.float32)
            tensors[f"base_model.model.model.layers.{i}.{mod}.lora_A.weight"] = a
            tensors[f"base_model.model.model.layers.{i}.{mod}.lora_B.weight"] = b
            delta = (alpha / r) * (b.astype(np.float64) @ a)
            merged[f"blk.{i}.{gguf}.weight"] = w + (hf_rows_to_gguf(delta, heads) if heads
                                                    else delta)
    folder = tmp_path / "smol-lora"
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": alpha, "bias": "none",
        "target_modules": ["q_proj", "k_proj", "v_proj", "down_proj"]}))
    ids = [1, 504, 3458, 282, 4649, 314]
    model = poot.load(str(smollm2_gguf), backend="reference", max_seq=32,
                      lora=[("smol", str(folder))])
    got = model.prefill_logits(ids, adapter="smol")
    with mock.patch.object(reference_llama, "load_weights", lambda path: (cfg, merged)):
        want = reference_llama.prefill_logits(smollm2_gguf, ids)
    # Q4_1 weights decoded in f32 against float64: the base model alone is within 1e-3
    assert rel_err(got, want) < 2e-3
    assert np.argmax(got[-1]) == np.argmax(want[-1])


def test_damaged_adapter_files_are_refused_naming_the_file(two_adapters, tmp_path):
    import poot
    from poot.errors import CheckpointError

    folder, cfg, tensors, _ = two_adapters
    path, _ = write_adapter(tmp_path / "ad", tensors, cfg, ATTN[:1], 4, 8, seed=3)
    weights = path / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated") as err:
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(path)])
    assert str(weights) in str(err.value)
    weights.write_bytes(data)
    (path / "adapter_config.json").write_text('{"r": 4, "lora_alpha": ')
    with pytest.raises(CheckpointError) as err:
        poot.load(str(folder), backend="reference", max_seq=32, lora=[str(path)])
    assert "adapter_config.json" in str(err.value)


# -- fused and stacked weights ---------------------------------------------------------------
def test_an_adapter_on_fused_projections_splits_by_rows(tmp_path):
    """Phi-3's fused qkv_proj and gate_up_proj take their adapters exactly: each part (q, k,
    v; gate, up) gets the shared A and its rows of B."""
    import poot
    from reference_phi3 import forward as phi3_forward
    from test_phi3 import make_folder as phi3_folder

    folder, cfg, tensors = phi3_folder(tmp_path, "phi3-longrope")
    path, merged = write_adapter(tmp_path / "fused", tensors, cfg,
                                 ("self_attn.qkv_proj", "mlp.gate_up_proj", "self_attn.o_proj"),
                                 4, 8, seed=3)
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6,
                      lora=[("fused", str(path))])
    for adapter, weights in (("fused", merged), (None, tensors)):
        want = phi3_forward(weights, cfg, IDS[:12], 32)
        assert rel_err(model.prefill_logits(IDS[:12], adapter=adapter), want) < 1e-4, adapter
    assert sorted(n for n in model.adapters.stacks if n.startswith("blk.0.")) == [
        "blk.0.attn_k.weight", "blk.0.attn_output.weight", "blk.0.attn_q.weight",
        "blk.0.attn_v.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]


@pytest.fixture(scope="module")
def deepseek_folder(tmp_path_factory):
    from test_deepseek import make_folder as deepseek_make_folder

    return deepseek_make_folder(tmp_path_factory.mktemp("deepseek-lora"), 5)


def test_an_adapter_on_deepseeks_dense_and_shared_projections(deepseek_folder, tmp_path):
    """DeepSeek: the latent attention's q_a, q_b, kv_a and o projections, the first layer's
    dense MLP and the shared experts adapted (the routed experts untouched)."""
    import poot
    from reference_deepseek import forward as deepseek_forward

    folder, cfg, tensors = deepseek_folder
    modules = (*(f"self_attn.{x}" for x in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                                             "o_proj")),
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
               *(f"mlp.shared_experts.{x}_proj" for x in ("gate", "up", "down")))
    path, merged = write_adapter(tmp_path / "ds", tensors, cfg, modules, 2, 4, seed=4)
    model = poot.load(str(folder), backend=BACKEND, max_seq=32, prefill_tokens=6,
                      lora=[("ds", str(path))])
    want = deepseek_forward(merged, cfg, IDS[:10])
    assert rel_err(model.prefill_logits(IDS[:10], adapter="ds"), want) < 1e-4
    assert rel_err(deepseek_forward(tensors, cfg, IDS[:10]), want) > 1e-3


@pytest.mark.parametrize("module, stack", [
    ("mlp.experts.3.gate_proj", r"expert 3 of blk.1.ffn_gate_exps.weight"),
    ("mlp.experts.gate_up_proj", r"blk.1.ffn_gate_up_exps.weight"),
])
def test_an_adapter_on_routed_experts_is_refused_naming_the_tensor(deepseek_folder, tmp_path,
                                                                   module, stack):
    """Routed experts, per expert (DeepSeek, Mixtral, Qwen-MoE) or stacked (gpt-oss,
    transformers 5), are refused by name, whichever layout the base holds."""
    import poot
    from poot.errors import CheckpointError

    folder, cfg, tensors = deepseek_folder
    adapter = tmp_path / "experts"
    adapter.mkdir()
    key = f"base_model.model.model.layers.1.{module}"
    save_file({f"{key}.lora_A.weight": np.ones((2, 64), np.float32),
               f"{key}.lora_B.weight": np.ones((16, 2), np.float32)},
              str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({
        **PEFT_DEFAULTS, "r": 2, "lora_alpha": 4, "target_modules": [module.split(".")[-1]]}))
    with pytest.raises(CheckpointError, match=rf"tensor '{key}.lora_A.weight' adapts "
                                              rf"model.layers.1.{module}, a routed expert's "
                                              rf"weight \({stack} of the base\)"):
        poot.load(str(folder), backend=BACKEND, max_seq=32, lora=[str(adapter)])


def test_an_adapter_on_deepseeks_absorbed_kv_b_is_refused(deepseek_folder, tmp_path):
    import poot
    from poot.errors import CheckpointError

    folder, cfg, tensors = deepseek_folder
    path, _ = write_adapter(tmp_path / "kv_b", tensors, cfg, ("self_attn.kv_b_proj",), 2, 4,
                            seed=5)
    with pytest.raises(CheckpointError, match=r"adapts model.layers.0.self_attn.kv_b_proj, "
                                              r"which multi-head latent attention absorbs"):
        poot.load(str(folder), backend=BACKEND, max_seq=32, lora=[str(path)])
