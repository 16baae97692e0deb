"""A GGUF language model's vision tower from a separate projector GGUF (llama.cpp's mmproj):
the tiny random Gemma 3 and Idefics3 folders of tests/test_vision_gemma3.py and
tests/test_vision_idefics3.py written as the converter writes their mmproj (a `clip` GGUF,
its names and layouts, Gemma 3's soft-embedding norm as 1 + w) and their text models as
GGUFs (Gemma 3's norms as 1 + w, Llama's q/k rows permuted, a gpt2 vocabulary). With the
mmproj attached, a text model gives the folder path's image tokens, rows and logits (a
text-only folder of the same text model: equal logits on reference and cpu; the GGUF:
tests/reference_decoder.py's); the f16 layout against tests/reference_siglip.py; `poot run`
and `poot serve` with --mmproj; bad files, flags and pairings are one typed line naming the
file and key.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import test_vision_gemma3 as gemma3
import test_vision_idefics3 as idefics3
from test_gguf_families import close_gguf
from test_vision_gemma3 import rel_err

from poot.errors import CheckpointError

#: HF tower name (tests' vision_tensors) -> the converter's
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out",
          "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
_TOP = {"embeddings.patch_embedding": "v.patch_embd",
        "embeddings.position_embedding": "v.position_embd", "post_layernorm": "v.post_ln"}
V = "clip.vision."
_PROJ = {"mm_soft_emb_norm.weight": "mm.soft_emb_norm.weight",
         "mm_input_projection_weight": "mm.input_projection.weight",
         "modality_projection.proj.weight": "mm.model.fc.weight"}


def mmproj_name(hf: str) -> str:
    if hf in _PROJ:
        return _PROJ[hf]
    base, kind = hf.rsplit(".", 1)
    if base.startswith("encoder.layers."):
        i, rest = base[len("encoder.layers."):].split(".", 1)
        return f"v.blk.{i}.{_LAYER[rest]}.{kind}"
    return f"{_TOP[base]}.{kind}"


def write_mmproj(path, kind: str, vis: dict, proj: dict, *, f16: bool = False,
                 meta: dict | None = None, drop: tuple = (), change: dict | None = None,
                 q8: tuple = ()):
    """The converter's mmproj of a folder's tower (`vis`) and connector (`proj`), HF names:
    with `f16`, matrices f16 but the embeddings (as its --outtype f16); `meta` replaces key
    values (None: leaves the key out), `drop` leaves tensors out, `change` replaces them,
    `q8` names those written Q8_0.
    Returns the tensors as the file holds them, by HF name."""
    import gguf

    v = gemma3.VISION
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    keys = {"clip.has_vision_encoder": (w.add_bool, True),
            "clip.projector_type": (w.add_string, kind),
            "clip.vision.projection_dim": (w.add_uint32, gemma3.DIM if kind == "gemma3"
                                           else idefics3.TEXT["hidden_size"]),
            "clip.vision.image_size": (w.add_uint32, v["image_size"]),
            "clip.vision.patch_size": (w.add_uint32, v["patch_size"]),
            "clip.vision.embedding_length": (w.add_uint32, v["hidden_size"]),
            "clip.vision.feed_forward_length": (w.add_uint32, v["intermediate_size"]),
            "clip.vision.block_count": (w.add_uint32, v["num_hidden_layers"]),
            "clip.vision.attention.head_count": (w.add_uint32, v["num_attention_heads"]),
            "clip.vision.attention.layer_norm_epsilon": (w.add_float32, v["layer_norm_eps"]),
            "clip.vision.image_mean": (w.add_array, [0.5] * 3),
            "clip.vision.image_std": (w.add_array, [0.5] * 3),
            "clip.use_gelu": (w.add_bool, True)}
    if kind == "gemma3":        # 4 x 4 patches pooled to 2 x 2 rows (not the default 4)
        keys["clip.vision.projector.scale_factor"] = (w.add_uint32, 2)
    else:
        keys["clip.vision.projector.scale_factor"] = (w.add_uint32, idefics3.SCALE)
        keys["clip.vision.preproc_image_size"] = (w.add_uint32, 2 * idefics3.TILE)
    for key, value in (meta or {}).items():
        if value is None:
            keys.pop(key, None)
        else:
            keys[key] = (keys[key][0] if key in keys else
                         w.add_bool if isinstance(value, bool) else w.add_string, value)
    for key, (add, value) in keys.items():
        add(key, value)
    held = {}
    for hf, array in {**vis, **proj}.items():
        array = np.asarray((change or {}).get(hf, array), np.float32)
        if hf == "mm_soft_emb_norm.weight":
            array = array + np.float32(1.0)
        if f16 and array.ndim > 1 and "embeddings." not in hf:
            array = array.astype(np.float16)
        if mmproj_name(hf) in q8:
            from gguf.quants import quantize

            w.add_tensor(mmproj_name(hf), quantize(array, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif mmproj_name(hf) not in drop:
            w.add_tensor(mmproj_name(hf), array)
        held[hf] = array.astype(np.float64) - (hf == "mm_soft_emb_norm.weight")
    close_gguf(w)
    return held


def text_folder(path, tensors: dict, config: dict, write_tokenizer):
    """The folder's language model alone (as a GGUF language model would give it)."""
    from poot_quant.safetensors_dir import write_folder

    write_folder(path, tensors, config, 1, None)
    write_tokenizer(path)
    return path


#: HF text name -> the converter's, per layer ("{}"); Gemma 3's post_attention_layernorm
#: follows the attention and its pre_feedforward_layernorm is the FFN's
_TEXT = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight":
         "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
         "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight", "self_attn.q_proj.bias":
         "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias"}
_LLAMA_TEXT = {**_TEXT, "post_attention_layernorm.weight": "ffn_norm.weight"}
_GEMMA3_TEXT = {**_TEXT, "post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_TOP_TEXT = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def write_language_gguf(path, arch: str, cfg: dict, tensors: dict, folder) -> None:
    """The text model as llama.cpp's converter writes it: Gemma 3's norms as 1 + w, Llama's
    q/k rows permuted to RoPE pairs, Qwen2-VL's M-RoPE sections padded to four; the folder's
    byte-level BPE as a gpt2 vocabulary (padded to the embedding's rows, its added tokens
    control tokens) with its template."""
    import json

    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    hd = cfg.get("head_dim", dim // heads)
    for key, value in (("context_length", cfg["max_position_embeddings"]),
                       ("embedding_length", dim), ("block_count", cfg["num_hidden_layers"]),
                       ("feed_forward_length", cfg["intermediate_size"]),
                       ("attention.head_count", heads), ("attention.head_count_kv", kv),
                       ("attention.key_length", hd), ("attention.value_length", hd)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", cfg.get("rope_theta", 10000.0))
    if arch == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window", cfg["sliding_window"])
        w.add_uint32("gemma3.attention.sliding_window_pattern",
                     cfg["layer_types"].index("full_attention") + 1)
        w.add_float32("gemma3.rope.freq_base_swa", cfg["rope_local_base_freq"])
    if cfg.get("mrope_section") is not None:
        w.add_rope_dimension_sections([*cfg["mrope_section"], 0])
    spec = json.loads((folder / "tokenizer.json").read_text())
    extra = json.loads((folder / "tokenizer_config.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    added = {t["content"]: t["id"] for t in spec["added_tokens"]}
    vocab.update(added)
    rows = tensors["model.embed_tokens.weight"].shape[0]
    by_id = {i: t for t, i in vocab.items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(rows)]
    types = [gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL if i in by_id
             else gguf.TokenType.UNUSED for i, t in enumerate(tokens)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m
                        for m in spec["model"]["merges"]])
    if extra["bos_token"] is not None:
        w.add_bos_token_id(vocab[extra["bos_token"]])
    w.add_eos_token_id(vocab[extra["eos_token"]])
    w.add_add_bos_token(extra.get("add_bos_token", False))
    w.add_chat_template(extra["chat_template"])
    table = _GEMMA3_TEXT if arch == "gemma3" else _LLAMA_TEXT
    for hf, array in tensors.items():
        rest = ""
        if hf in _TOP_TEXT:
            name = _TOP_TEXT[hf]
        else:
            i, rest = hf[len("model.layers."):].split(".", 1)
            name = f"blk.{i}.{table[rest]}"
        array = np.asarray(array, np.float32)
        if arch == "gemma3" and hf.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            n = heads if "q_proj" in rest else kv
            array = array.reshape(n, 2, array.shape[0] // n // 2, -1).swapaxes(1, 2) \
                .reshape(array.shape)
        w.add_tensor(name, array)
    close_gguf(w)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Per family: (the vision-language folder, its text-only folder, its mmproj, images,
    the folder's tower and connector tensors)."""
    out = {}
    for kind, mod in (("gemma3", gemma3), ("idefics3", idefics3)):
        path, text, vis, proj, images = mod.folder.__wrapped__(tmp_path_factory)
        config = {**mod.TEXT, "tie_word_embeddings": kind == "gemma3"}
        root = path.parent
        text_only = text_folder(root / "text", text, config, mod.write_tokenizer)
        write_mmproj(root / "mmproj.gguf", kind, vis, proj)
        # Gemma 3's GGUF scales attention by head_dim (query_pre_attn_scalar is not kept)
        gguf_config = {**mod.TEXT, "query_pre_attn_scalar": mod.TEXT["head_dim"]} \
            if kind == "gemma3" else mod.TEXT
        write_language_gguf(root / "lm.gguf", "gemma3" if kind == "gemma3" else "llama",
                            gguf_config, text, text_only)
        out[kind] = SimpleNamespace(folder=path, text=text_only, mmproj=root / "mmproj.gguf",
                                    images=images, vis=vis, proj=proj, root=root,
                                    text_tensors=text, gguf=root / "lm.gguf",
                                    gguf_config=gguf_config)
    return out


def loaded(path, backend: str, mmproj=None):
    import poot

    model = poot.load(str(path), backend, max_seq=128, prefill_tokens=16)
    if mmproj is not None:
        from poot.models.vision.mmproj import attach

        attach(model, mmproj)
    return model


def opened(path, f):
    """The VisionParts of mmproj `path` for family `f`'s text model."""
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.vision.mmproj import open_mmproj

    return open_mmproj(path, open_model(str(f.text))[1], Tokenizer.from_hf_folder(f.text))


@pytest.mark.parametrize("kind", ["gemma3", "idefics3"])
def test_the_mmproj_reads_as_the_folder(families, kind):
    """The same VisionConfig (the file's epsilon is a float32), image tokens, pixel
    preparation and tensor names as the folder's."""
    from poot.models.loader import open_model
    from poot.models.vision.chat import read_image_processing

    f = families[kind]
    want = open_model(str(f.folder))[0].vision
    got = opened(f.mmproj, f)
    assert got.config.eps == pytest.approx(want.config.eps, rel=1e-7)
    assert got.config == type(want.config)(**{**want.config.__dict__, "eps": got.config.eps})
    assert got.tokens == want.tokens
    assert read_image_processing(got) == read_image_processing(want)
    assert set(got.tensors) == set(want.tensors)


def test_scale_factors_the_converter_leaves_out(families, tmp_path):
    """Without clip.vision.projector.scale_factor, Gemma 3 pools 4 x 4 patches (the
    converter writes only other kernels) and Idefics3 shuffles 2 x 2; Idefics3 without
    preproc_image_size resizes the longest edge to 4 tiles."""
    for kind, rows in (("gemma3", 1), ("idefics3", 4)):
        f = families[kind]
        path = tmp_path / f"{kind}.gguf"
        write_mmproj(path, kind, f.vis, f.proj, meta={V + "projector.scale_factor": None,
                                                      V + "preproc_image_size": None})
        parts = opened(path, f)
        assert parts.config.mm_tokens == rows and parts.tokens.count == rows
        if kind == "idefics3":
            assert parts.processing.longest == 4 * idefics3.TILE


@pytest.mark.parametrize("kind,backend", [("gemma3", "reference"), ("gemma3", "cpu"),
                                          ("idefics3", "reference"), ("idefics3", "cpu")])
def test_image_rows_and_logits_equal_the_folder(families, kind, backend):
    """The text model with the mmproj attached places the images' tokens and rows as the
    vision-language folder does, and its logits over them are the folder's."""
    from poot.models.vision.chat import ImageChat

    f = families[kind]
    want_model, got_model = loaded(f.folder, backend), loaded(f.text, backend, f.mmproj)
    want_ids, want_rows, want_spans = ImageChat(want_model).prompt("What is this?", f.images)
    ids, rows, spans = ImageChat(got_model).prompt("What is this?", f.images)
    assert ids == want_ids and spans == want_spans and sorted(rows) == sorted(want_rows)
    got = np.stack([rows[p] for p in sorted(rows)])
    want = np.stack([want_rows[p] for p in sorted(want_rows)])
    assert rel_err(got, want) < 1e-6
    logits = got_model.prefill_logits(ids, hosted=rows, spans=spans)
    assert rel_err(logits, want_model.prefill_logits(ids, hosted=want_rows, spans=spans)) < 1e-5


@pytest.mark.parametrize("kind", ["gemma3", "idefics3"])
def test_a_gguf_language_model_with_its_mmproj(families, kind):
    """A GGUF text model as the converter writes it, its mmproj beside it: the image prompt's
    ids and rows are the vision-language folder's, its logits tests/reference_decoder.py's
    over those rows."""
    from reference_decoder import forward

    from poot.models.vision.chat import ImageChat

    f = families[kind]
    model = loaded(f.gguf, "reference", f.mmproj)
    assert model.checkpoint.kind == "gguf"
    want_ids, want_rows, want_spans = ImageChat(loaded(f.folder, "reference")).prompt(
        "What is this?", f.images)
    ids, rows, spans = ImageChat(model).prompt("What is this?", f.images)
    assert ids == want_ids and spans == want_spans and sorted(rows) == sorted(want_rows)
    assert all(np.array_equal(rows[p], want_rows[p]) for p in rows)
    want = forward(f.text_tensors, f.gguf_config, ids,
                   {p: np.float64(r) for p, r in rows.items()}, spans)
    assert rel_err(model.prefill_logits(ids, hosted=rows, spans=spans), want) < 1e-4


def test_poot_serve_with_mmproj_answers_as_the_library(families):
    """`poot serve MODEL.gguf --mmproj FILE`: a chat with a data-URL image answers what
    ImageChat.generate does (greedy)."""
    import base64

    from serve_process import openai_client, serve

    from poot.models.vision.chat import ImageChat

    f = families["gemma3"]
    image = f.images[0].read_bytes()
    want = ImageChat(loaded(f.gguf, "reference", f.mmproj)).generate(
        "Describe it.", [image], max_tokens=4, temperature=0.0)
    url = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    with serve(f.gguf, "--max-seq", "128", "--mmproj", str(f.mmproj)) as server:
        answer = openai_client(server).chat.completions.create(
            model="smollm2", max_tokens=4, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Describe it."}]}])
        assert want and answer.choices[0].message.content == want
        assert server.stats()["images_encoded"] == 1


@pytest.mark.parametrize("kind", ["gemma3", "idefics3"])
def test_the_converters_f16_layout_against_numpy(families, kind, tmp_path):
    """Matrices f16, embeddings and vectors f32 (the converter's --outtype f16): the rows
    of one tile against tests/reference_siglip.py on the same f16 values."""
    from poot import plugin
    from poot.models.vision.encoder import VisionEncoder
    from poot.models.vision.preprocess import ImageProcessing, pixels

    f = families[kind]
    held = write_mmproj(tmp_path / "f16.gguf", kind, f.vis, f.proj, f16=True)
    parts = opened(tmp_path / "f16.gguf", f)
    assert parts.tensors["vision.encoder.layers.0.mlp.fc1.weight"].dtype.value == "f16"
    x = pixels(f.images[0], ImageProcessing(16, 16))
    mod = gemma3 if kind == "gemma3" else idefics3
    vis = {k: v for k, v in held.items() if k in f.vis}
    proj = {k: v for k, v in held.items() if k in f.proj}
    want = mod.reference_rows(vis, proj, x if kind == "gemma3" else x[None])
    b = plugin.get_backend("reference")
    got = VisionEncoder(parts.config, parts.weights(), b, plugin.probe(b)[0][0]).encode(x)
    assert rel_err(got, want) < 1e-4


def test_poot_run_with_mmproj_prints_what_the_library_gives(families, capsys):
    """`poot run MODEL.gguf --mmproj FILE --image PATH` prints ImageChat.generate's text."""
    from poot.cli import main
    from poot.models.vision.chat import ImageChat

    f = families["idefics3"]
    want = ImageChat(loaded(f.gguf, "reference", f.mmproj)).generate(
        "Describe it.", f.images[:1], max_tokens=3, temperature=0.0)
    capsys.readouterr()
    assert main(["run", str(f.gguf), "--mmproj", str(f.mmproj), "--backend", "reference",
                 "--max-seq", "128", "--quiet", "--max-tokens", "3", "--prompt", "Describe it.",
                 "--image", str(f.images[0])]) == 0
    assert want and capsys.readouterr().out == want + "\n"



@pytest.mark.parametrize("kind,meta,drop,change,message", [
    ("gemma3", {"clip.projector_type": "pixtral"}, (), None,
     "clip.projector_type = 'pixtral' is a projector poot does not run"),
    ("gemma3", {"clip.projector_type": "idefics3"}, (), None,
     "clip.projector_type = 'idefics3' feeds a llama language model; this one is gemma3"),
    ("gemma3", {V + "projection_dim": 96}, (), None,
     V + "projection_dim = 96 differs from the language model's embedding length 64"),
    ("gemma3", {V + "projection_dim": None}, (), {"mm_input_projection_weight":
                                                  np.zeros((32, 96), np.float32)},
     r"tensor 'mm.input_projection.weight' is \[32, 96\], not \[32, 64\]"),
    ("idefics3", {}, ("v.blk.1.ffn_down.bias",), None, "lacks tensor 'v.blk.1.ffn_down.bias'"),
    ("idefics3", {V + "block_count": 1}, (), None, r"tensor 'v\.blk\.1\.\w+\.\w+' is not one "
                                                   r"of the tower's or the connector's"),
    ("idefics3", {V + "embedding_length": None}, (), None,
     "lacks 'clip.vision.embedding_length'"),
    ("idefics3", {V + "projector.scale_factor": 3}, (), None,
     "projector.scale_factor = 3 must divide the 4 patches per side"),
    ("idefics3", {"clip.use_silu": True}, (), None, "clip.use_silu = True .another activation"),
    ("gemma3", {V + "image_mean": [0.5, 0.5]}, (), None, "image_std = .* and image_mean must "
                                                          "give 3 values"),
])
def test_bad_mmproj_files_are_one_line_naming_file_and_key(families, tmp_path, kind, meta,
                                                           drop, change, message):
    f = families[kind]
    bad = tmp_path / "bad.gguf"
    write_mmproj(bad, kind, f.vis, f.proj, meta=meta, drop=drop, change=change)
    with pytest.raises(CheckpointError, match=message) as exc:
        opened(bad, f)
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)


def test_a_quantized_tower_is_refused_naming_the_tensor(families, tmp_path):
    """poot reads dense towers: a Q8_0 matrix (an mmproj quantized by llama-quantize) is
    refused by name before anything is built."""
    f = families["idefics3"]
    bad = tmp_path / "q8.gguf"
    write_mmproj(bad, "idefics3", f.vis, f.proj, q8=("mm.model.fc.weight",))
    with pytest.raises(CheckpointError, match=r"tensor 'mm.model.fc.weight' is gguf:Q8_0\[64x"
                                              r"128\]; poot reads f32, f16 and bf16"):
        opened(bad, f)


def test_refused_pairings_and_flags(families, tmp_path, capsys):
    """A language model file as the mmproj, a family without images, a folder with its
    own tower; --mmproj without --image, or naming no file (before any model loads); an
    image for a GGUF without --mmproj: one line each."""
    from poot.cli import main
    from poot.errors import RequestError
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.vision.mmproj import attach, open_mmproj

    g = families["gemma3"]
    lm = tmp_path / "lm.gguf"
    import gguf

    w = gguf.GGUFWriter(str(lm), "llama")
    w.add_block_count(1)
    close_gguf(w)
    config = open_model(str(g.text))[1]
    with pytest.raises(CheckpointError, match="general.architecture = 'llama' is not clip"):
        open_mmproj(lm, config, None)
    i = families["idefics3"]
    llama = open_model(str(i.text))[1]
    with pytest.raises(CheckpointError, match="mmproj.gguf: the language model's tokenizer has "
                                              "no <image> token"):
        open_mmproj(i.mmproj, llama, Tokenizer.from_hf_folder(g.text))   # Gemma's vocabulary
    other = SimpleNamespace(checkpoint=SimpleNamespace(path=tmp_path / "q.gguf"),
                            config=SimpleNamespace(arch="qwen3"))
    with pytest.raises(RequestError, match="is a qwen3 model; poot runs images with gemma3"):
        attach(other, g.mmproj)
    with pytest.raises(RequestError, match="has its own vision tower"):
        attach(loaded(g.folder, "reference"), g.mmproj)
    image = ["--image", str(g.images[0])]
    for argv, message in ((["--mmproj", str(g.mmproj)], "--mmproj needs --image"),
                          (["--mmproj", str(tmp_path / "missing.gguf"), *image], "no such file"),
                          (image, "has no vision tower (")):
        rc = main(["run", str(g.gguf), "--backend", "reference", "--quiet", "--prompt", "Hi",
                   *argv])
        err = capsys.readouterr().err.strip()
        assert rc != 0 and message in err and len(err.splitlines()) == 1, err
    assert "--mmproj" in err
    rc = main(["serve", str(g.text), "--mmproj", str(tmp_path / "missing.gguf")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "--mmproj" in err and len(err.splitlines()) == 1, err


def test_gemma3_270m_gguf_gives_the_image_tokens(families, tmp_path):
    """The real Gemma 3 270M GGUF (a text-only vocabulary): its <start_of_image> and
    <end_of_image> ids; the rows stand in at the start token's id, the vocabulary having no
    soft token; a projector to its 640-wide embedding attaches, a 64-wide one does not."""
    from pathlib import Path

    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.vision.mmproj import open_mmproj

    real = Path.home() / ".cache/poot/models/gemma-3-270m-q4_k_m.gguf"
    if not real.is_file():
        pytest.skip(f"{real} is not downloaded (scripts/setup.sh fetches it)")
    ckpt, config = open_model(str(real))
    tokenizer = Tokenizer.from_gguf_metadata(ckpt.metadata, str(real))
    f = families["gemma3"]
    with pytest.raises(CheckpointError, match="differs from the language model's embedding "
                                              "length 640"):
        open_mmproj(f.mmproj, config, tokenizer)
    rng = np.random.default_rng(0)
    proj = {**f.proj, "mm_input_projection_weight": rng.standard_normal(
        (gemma3.VISION["hidden_size"], config.dim)).astype(np.float32)}
    write_mmproj(tmp_path / "640.gguf", "gemma3", f.vis, proj,
                 meta={V + "projection_dim": config.dim})
    parts = open_mmproj(tmp_path / "640.gguf", config, tokenizer)
    t = parts.tokens
    assert (t.boi, t.eoi, t.soft, t.count) == (255999, 256000, 255999, 4)

