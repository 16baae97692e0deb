"""Images in, for Gemma 3: a random-weight vision-language HF folder built here (SigLIP tower,
projector, a three-layer Gemma 3 text model, preprocessor_config.json, a byte-level tokenizer
with Gemma's image tokens) against tests/reference_siglip.py and tests/reference_decoder.py.

The tower and projector run as one poot graph on the oracle and the cpu backend; the text
model's logits with one and two images come from a prefill whose image positions take the
projector's rows through the hosted embedding rows; `poot run --image` generates what the
session path gives; bad images are one ImageError line naming the file.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from reference_decoder import forward
from reference_siglip import projector, tower

from poot.errors import ImageError

VOCAB, DIM = 300, 64
BOI, EOI, SOFT = 261, 262, 263
MM_TOKENS = 4
VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
          "layer_norm_eps": 1e-6, "model_type": "siglip_vision_model", "vision_use_head": False}
TEXT = {"model_type": "gemma3_text", "hidden_size": DIM, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "max_position_embeddings": 128, "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 8, "rope_local_base_freq": 10000.0, "rope_theta": 1e6,
        "query_pre_attn_scalar": 24,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}
CONFIG = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "text_config": TEXT, "vision_config": VISION, "mm_tokens_per_image": MM_TOKENS,
          "boi_token_index": BOI, "eoi_token_index": EOI, "image_token_index": SOFT,
          "eos_token_id": [1, 260], "initializer_range": 0.02, "torch_dtype": "float32"}
PROCESSOR = {"do_convert_rgb": True, "do_normalize": True, "do_pan_and_scan": False,
             "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
             "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
             "processor_class": "Gemma3Processor", "resample": 2,
             "rescale_factor": 1 / 255, "size": {"height": 16, "width": 16},
             "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_crop_size": 256,
             "pan_and_scan_min_ratio_to_activate": 1.2}
SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
           "<image_soft_token>"]


def vision_tensors(rng) -> dict[str, np.ndarray]:
    """Vision tower and projector tensors by their names under the model's prefixes."""
    d, f, p = VISION["hidden_size"], VISION["intermediate_size"], VISION["patch_size"]
    n = (VISION["image_size"] // p) ** 2

    def mat(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    def vec(k, base=0.0):
        return (base + 0.2 * rng.standard_normal(k)).astype(np.float32)

    w = {"embeddings.patch_embedding.weight": (rng.standard_normal((d, 3, p, p)) * 0.2
                                               ).astype(np.float32),
         "embeddings.patch_embedding.bias": vec(d),
         "embeddings.position_embedding.weight": mat(n, d),
         "post_layernorm.weight": vec(d, 1.0), "post_layernorm.bias": vec(d)}
    for i in range(VISION["num_hidden_layers"]):
        pre = f"encoder.layers.{i}."
        for s in ("q", "k", "v", "out"):
            w[f"{pre}self_attn.{s}_proj.weight"], w[f"{pre}self_attn.{s}_proj.bias"] = \
                mat(d, d), vec(d)
        w[pre + "mlp.fc1.weight"], w[pre + "mlp.fc1.bias"] = mat(f, d), vec(f)
        w[pre + "mlp.fc2.weight"], w[pre + "mlp.fc2.bias"] = mat(d, f), vec(d)
        for k in ("layer_norm1", "layer_norm2"):
            w[f"{pre}{k}.weight"], w[f"{pre}{k}.bias"] = vec(d, 1.0), vec(d)
    proj = {"mm_soft_emb_norm.weight": vec(d),
            "mm_input_projection_weight": (rng.standard_normal((d, DIM)) * 0.5
                                           ).astype(np.float32)}
    return w, proj


def text_tensors(rng) -> dict[str, np.ndarray]:
    """The Gemma 3 text model's tensors by HF text names (norms stored as w of 1 + w)."""
    t = TEXT
    hd, q, kv = t["head_dim"], t["num_attention_heads"] * t["head_dim"], \
        t["num_key_value_heads"] * t["head_dim"]

    def mat(n, k, scale=None):
        return (rng.standard_normal((n, k)) * (scale or k ** -0.5)).astype(np.float32)

    def norm(k):
        return (0.2 * rng.standard_normal(k)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(VOCAB, DIM, 1.0), "model.norm.weight": norm(DIM)}
    for i in range(t["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, n, k in (("q_proj", q, DIM), ("k_proj", kv, DIM), ("v_proj", kv, DIM),
                           ("o_proj", DIM, q)):
            w[f"{p}self_attn.{name}.weight"] = mat(n, k)
        for name, n, k in (("gate_proj", 96, DIM), ("up_proj", 96, DIM), ("down_proj", DIM, 96)):
            w[f"{p}mlp.{name}.weight"] = mat(n, k)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            w[f"{p}{name}.weight"] = norm(DIM)
        w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(hd), norm(hd)
    return w


def write_tokenizer(folder) -> None:
    """A byte-level BPE over the 256 byte symbols and two newline merges (Gemma's vocabulary
    has "\n\n" and "\n\n\n" tokens), with Gemma's turn and image tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from poot.models.chat import GEMMA_TEMPLATE
    from poot.models.tokenizer import gpt2_unicode_to_byte

    table = gpt2_unicode_to_byte()
    vocab = {c: i + 3 for i, c in enumerate(sorted(table, key=table.get))}
    vocab.update({"<pad>": 0, "<eos>": 1, "<bos>": 2})
    vocab.update({s: 259 + i for i, s in enumerate(SPECIAL)})
    vocab.update({"ĊĊ": 264, "ĊĊĊ": 265})
    tok = Tokenizer(models.BPE(vocab, [("Ċ", "Ċ"), ("ĊĊ", "Ċ")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ["<pad>", "<eos>", "<bos>", *SPECIAL]])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": False,
         "chat_template": GEMMA_TEMPLATE}))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder in transformers 4.x's tensor names; its tensors and sub-configs."""
    from poot_quant.safetensors_dir import write_folder

    rng = np.random.default_rng(54)
    vis, proj = vision_tensors(rng)
    text = text_tensors(rng)
    tensors = {**{f"language_model.{k}": v for k, v in text.items()},
               **{f"vision_tower.vision_model.{k}": v for k, v in vis.items()},
               **{f"multi_modal_projector.{k}": v for k, v in proj.items()}}
    path = tmp_path_factory.mktemp("gemma3-vision") / "model"
    write_folder(path, tensors, CONFIG, 1, {"preprocessor_config.json": PROCESSOR})
    write_tokenizer(path)
    images = path.parent / "images"
    images.mkdir()
    for i, (size, mode) in enumerate([((23, 31), "RGB"), ((16, 16), "RGBA")]):
        from PIL import Image

        data = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
        Image.fromarray(data, mode).save(images / f"{i}.png")
    return path, text, vis, proj, sorted(images.glob("*.png"))


def reference_rows(vis, proj, pixels) -> np.ndarray:
    return projector(proj, VISION, MM_TOKENS, tower(vis, VISION, pixels))


def rel_err(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def parts(folder):
    from poot.models.loader import open_model

    ckpt, config = open_model(str(folder[0]))
    assert config.arch == "gemma3" and config.dim == DIM and config.layers == 3
    return ckpt.vision


#: text_config as transformers 5.25 saves it: RoPE per layer type, the 4.x layer pattern
#: kept as a private key beside layer_types
TEXT5 = {**{k: v for k, v in TEXT.items() if k not in ("rope_theta", "rope_local_base_freq")},
         "_sliding_window_pattern": 6, "use_bidirectional_attention": False,
         "rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                             "sliding_attention": {"rope_theta": 10000.0,
                                                   "rope_type": "default"}}}


def test_config_and_tensor_names(folder, parts, tmp_path):
    """Every transformers spelling of the tensors and the config reads as the same model
    (5.25 saves the tower as vision_tower.*, the module paths are model.*); unknown keys
    and tensors are refused by name."""
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from poot_quant.safetensors_dir import write_folder

    c = parts.config
    assert (c.patches_per_side, c.tokens_per_side, c.pool, c.text_dim) == (4, 2, 2, DIM)
    assert (parts.tokens.boi, parts.tokens.eoi, parts.tokens.soft) == (BOI, EOI, SOFT)
    path, text, vis, proj, _ = folder
    v5 = {**{f"model.language_model.{k[len('model.'):]}": v for k, v in text.items()},
          **{f"model.vision_tower.vision_model.{k}": v for k, v in vis.items()},
          **{f"model.multi_modal_projector.{k}": v for k, v in proj.items()},
          "lm_head.weight": text["model.embed_tokens.weight"]}
    saved5 = {**{f"language_model.{k}": v for k, v in text.items()},
              **{f"vision_tower.{k}": v for k, v in vis.items()},
              **{f"multi_modal_projector.{k}": v for k, v in proj.items()}}
    for name, tensors, cfg in (("v5", v5, CONFIG), ("saved5", saved5, {
            **CONFIG, "text_config": TEXT5, "dtype": "float32", "tie_word_embeddings": True})):
        write_folder(tmp_path / name, tensors, cfg, 1, None)
        ckpt5, config5 = open_model(str(tmp_path / name))
        assert config5 == open_model(str(path))[1], name
        assert set(ckpt5.vision.tensors) == set(parts.tensors), name
    write_folder(tmp_path / "odd", v5, {**CONFIG, "frobnicate": 1}, 1, None)
    with pytest.raises(CheckpointError, match="frobnicate"):
        open_model(str(tmp_path / "odd"))
    write_folder(tmp_path / "extra", {**v5, "model.audio_tower.w": proj[
        "mm_soft_emb_norm.weight"]}, CONFIG, 1, None)
    with pytest.raises(CheckpointError, match="audio_tower"):
        open_model(str(tmp_path / "extra"))


@pytest.fixture(scope="module")
def pixels_and_rows(folder):
    """The first image's pixels and the reference's rows for them."""
    from poot.models.vision.preprocess import pixels, read_processing

    path, _, vis, proj, images = folder
    x = pixels(images[0], read_processing(path, 16))
    want = reference_rows(vis, proj, x)
    assert want.shape == (MM_TOKENS, DIM)
    return x, want


def test_tower_and_projector_match_numpy_on_the_oracle(parts, pixels_and_rows):
    from poot.models.vision.encoder import build_encoder
    from poot.models.vision.siglip import PIXELS
    from poot.oracle import evaluate

    x, want = pixels_and_rows
    weights = parts.weights()
    graph = build_encoder(parts.config, weights)
    consts = {graph.meta(v).identity.label: weights.arrays[graph.meta(v).identity.label]
              for v in graph.consts()}
    got = evaluate(graph, {**consts, PIXELS: x}, outputs="result")[0]
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "wgpu", "vulkan", "cuda"])
def test_tower_and_projector_match_numpy_on(backend, parts, pixels_and_rows):
    from poot import plugin
    from poot.models.vision.encoder import VisionEncoder

    x, want = pixels_and_rows
    b = plugin.get_backend(backend)
    devs, why = plugin.probe(b)
    if not devs:
        pytest.skip(f"backend {backend} finds no device here: {why}")
    enc = VisionEncoder(parts.config, parts.weights(), b, devs[0])
    assert rel_err(enc.encode(x), want) < 1e-4


def test_preprocessing(folder):
    """Resize with the processor's filter, rescale, normalize, RGB on white, channels first."""
    from PIL import Image

    from poot.models.vision.preprocess import pixels, read_processing

    path, _, _, _, images = folder
    proc = read_processing(path, 16)
    x = pixels(images[0], proc)
    want = np.asarray(Image.open(images[0]).resize((16, 16), Image.Resampling.BILINEAR),
                      np.float64) / 255 * 2 - 1
    assert x.shape == (3, 16, 16) and x.dtype == np.float32
    np.testing.assert_allclose(x, want.transpose(2, 0, 1), atol=1e-6)
    rgba = np.asarray(Image.open(images[1]), np.float64)           # already 16 x 16
    alpha = rgba[..., 3:] / 255
    on_white = rgba[..., :3] * alpha + 255 * (1 - alpha)
    np.testing.assert_allclose(pixels(images[1], proc), (on_white / 255 * 2 - 1).transpose(
        2, 0, 1), atol=1 / 255 + 1e-6)


def test_bad_images_are_one_line_naming_the_file(tmp_path):
    from PIL import Image

    from poot.models.vision.preprocess import MAX_PIXELS, ImageProcessing, pixels

    proc = ImageProcessing(16, 16)
    good = tmp_path / "good.png"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(good)
    data = good.read_bytes()
    cases = {"corrupt.png": data[:8] + b"\x00" * 40 + data[48:],
             "truncated.png": data[: len(data) // 2], "text.png": b"not an image at all\n"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    bomb = tmp_path / "bomb.png"
    Image.new("1", (9000, 8000)).save(bomb)          # 72 M pixels, a few kB of PNG
    assert 9000 * 8000 > MAX_PIXELS
    cmyk = tmp_path / "float.tiff"
    Image.new("F", (8, 8)).save(cmyk)
    for name in [*cases, "bomb.png", "missing.png", "float.tiff"]:
        with pytest.raises(ImageError) as exc:
            pixels(tmp_path / name, proc)
        msg = str(exc.value)
        assert str(tmp_path / name) in msg and "\n" not in msg, msg
    assert pixels(good, proc).shape == (3, 16, 16)


@pytest.fixture(scope="module")
def models(folder):
    """Loaded on first use, by backend."""
    import poot

    loaded = {}

    def get(backend):
        if backend not in loaded:
            loaded[backend] = poot.load(str(folder[0]), backend, max_seq=64, prefill_tokens=8)
        return loaded[backend]
    return get


@pytest.mark.parametrize("backend,count", [("reference", 1), ("reference", 2), ("cpu", 2)])
def test_text_logits_with_images(folder, models, backend, count):
    """The text model reads each image's rows at its soft tokens' positions (after the
    embedding scale), as tests/reference_decoder.py does with the reference rows."""
    from poot.models.vision.chat import chat_ids
    from poot.models.vision.preprocess import pixels, read_processing

    path, text, vis, proj, images = folder
    model = models(backend)
    tokens = model.checkpoint.vision.tokens
    ids, starts = chat_ids(model.tokenizer, tokens, "What is this?", count)
    assert [ids[s - 1] for s in starts] == [BOI] * count
    assert all(ids[s: s + MM_TOKENS] == [SOFT] * MM_TOKENS for s in starts)
    assert [ids[s + MM_TOKENS] for s in starts] == [EOI] * count
    # the ids of the text Gemma3Processor makes: the template's rendering of a message whose
    # content list holds the images, then text, each <start_of_image> expanded
    from poot.models.chat import render_chat_for

    expanded = render_chat_for(model.tokenizer, [{"role": "user", "content": "@"}]).replace(
        "@", ("\n\n<start_of_image>" + "<image_soft_token>" * MM_TOKENS +
              "<end_of_image>\n\n") * count + "What is this?")
    assert ids == model.tokenizer.encode(expanded, add_special=False)
    assert model.tokenizer.encode("\n\n\n", add_special=False) == [265]
    proc = read_processing(path, 16)
    rows, spans = {}, {}
    for k, (s, image) in enumerate(zip(starts, images[:count])):
        rows.update(enumerate(reference_rows(vis, proj, pixels(image, proc)), s))
        spans.update(dict.fromkeys(range(s, s + MM_TOKENS), k + 1))
    want = forward(text, TEXT, ids, rows, spans)
    got = model.prefill_logits(ids, hosted=rows, spans=spans)
    assert rel_err(got, want) < 1e-4
    # the rows and the image's both-ways attention each change the logits
    assert rel_err(forward(text, TEXT, ids), want) > 1e-2
    assert rel_err(forward(text, TEXT, ids, rows), want) > 1e-3


def test_generate_and_poot_run_with_two_images(folder, capsys):
    """The session's prefill of an image prompt (one step, though chunks are 8) and its
    decode give the tokens a one-step prefill over the prompt and the answer predicts
    (teacher-forced); ImageChat.generate and `poot run --image --image` print their text."""
    import poot
    from poot.cli import main
    from poot.models.vision.chat import HostedPrompt, ImageChat

    path, _, _, _, images = folder
    m = poot.load(str(path), "reference", max_seq=64, prefill_tokens=8)
    chat = ImageChat(m)
    ids, hosted, spans = chat.prompt("Describe both.", images)
    assert sorted(set(spans.values())) == [1, 2] and set(spans) == set(hosted)
    assert len(chat.image_seconds) == 2
    # an image's file bytes (a server's upload) give its rows, from the cache by hash
    same = chat.rows([images[1].read_bytes()])[0]
    assert chat.image_seconds == []
    np.testing.assert_array_equal(same[-1], hosted[max(hosted)])   # image 2's last row
    with pytest.raises(ImageError, match="^upload 1: not an image"):
        from poot.models.vision.preprocess import pixels

        pixels(b"GIF89a garbage", chat.processing, "upload 1")
    session, seq = m.session(), "seq"
    session.open(seq)
    HostedPrompt(session, hosted, DIM, len(ids), spans, chunk=64)
    answer = [int(np.argmax(session.prefill(seq, ids)))]
    assert session.stepper is None and session.prefill_tokens == 8
    assert (64, 1) in session.executors and (8, 1) not in session.executors   # one step
    for _ in range(3):
        answer.append(int(np.argmax(session.decode({seq: answer[-1]})[seq])))
    session.close(seq)
    logits = m.prefill_logits(ids + answer[:-1], hosted=hosted, spans=spans)
    assert list(np.argmax(logits[len(ids) - 1:], -1)) == answer
    stop = next((k for k, t in enumerate(answer) if t in m.tokenizer.stop_ids), len(answer))
    text = chat.generate("Describe both.", images, max_tokens=4)
    assert chat.image_seconds == []             # both images' rows came from the cache
    assert m.stats.prompt_tokens == len(ids) and session.stepper is None
    assert text == m.tokenizer.decode(answer[:stop])
    capsys.readouterr()
    rc = main(["run", str(path), "--backend", "reference", "--max-seq", "64", "--quiet",
               "--max-tokens", "4", "--prompt", "Describe both.",
               "--image", str(images[0]), "--image", str(images[1])])
    assert rc == 0
    assert capsys.readouterr().out == text + "\n"


def test_poot_run_refuses_a_bad_image_in_one_line(folder, tmp_path, capsys):
    from poot.cli import main

    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    rc = main(["run", str(folder[0]), "--backend", "reference", "--quiet", "--prompt", "Hi",
               "--image", str(bad)])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and str(bad) in err and len(err.splitlines()) == 1, err


def test_hosted_prompt_refuses_a_cut_image_and_the_decode_plan():
    """An image's rows never go through a step that would cut its span, nor through a step
    without hosted slots; once the prompt is in, the session gets its stepper back."""
    from types import SimpleNamespace

    from poot.errors import BindError
    from poot.models.vision.chat import HostedPrompt

    session = SimpleNamespace(stepper=None, prefill_tokens=8)
    rows = {p: np.full(4, p, np.float32) for p in range(5, 9)}
    hp = HostedPrompt(session, rows, 4, 12, dict.fromkeys(rows, 1), chunk=16)
    assert session.stepper is hp and session.prefill_tokens == 16
    prefill = SimpleNamespace(slots={"tokens", "pos", "hosted.rows", "hosted.use",
                                     "hosted.span"}, step=lambda slots: slots)
    decode = SimpleNamespace(slots={"tokens", "pos"}, step=lambda slots: slots)
    with pytest.raises(BindError, match="cross"):
        hp(prefill, {"tokens": np.zeros(8, np.int32), "pos": [0]}, np.ones(8, bool))
    with pytest.raises(BindError, match="without hosted rows"):
        hp(decode, {"tokens": [0], "pos": [6]}, [True])
    slots = hp(prefill, {"tokens": np.zeros(16, np.int32), "pos": [0]}, np.arange(16) < 12)
    assert list(slots["hosted.use"]) == [0] * 5 + [1] * 4 + [0] * 7
    assert list(slots["hosted.span"]) == [0] * 5 + [1] * 4 + [0] * 7
    assert slots["hosted.rows"][7, 0] == 7
    assert session.stepper is None and session.prefill_tokens == 8


def test_bf16_tower(folder, tmp_path, pixels_and_rows):
    """A bf16 tower, as checkpoints hold it: the kernel, position table and projection are
    widened in the graph, the vectors once on load; against the reference on the same
    bf16 values (on the reference backend: a cold cpu build of the bf16 kernels costs CI
    more than it tells)."""
    import ml_dtypes
    from poot import plugin
    from poot.models.loader import open_model
    from poot.models.vision.encoder import VisionEncoder
    from poot_quant.safetensors_dir import write_folder

    _, text, vis, proj, _ = folder
    x, _ = pixels_and_rows
    vis16, proj16 = ({k: v.astype(ml_dtypes.bfloat16) for k, v in d.items()}
                     for d in (vis, proj))
    write_folder(tmp_path / "bf16", {
        **{f"language_model.{k}": v for k, v in text.items()},
        **{f"vision_tower.vision_model.{k}": v for k, v in vis16.items()},
        **{f"multi_modal_projector.{k}": v for k, v in proj16.items()}}, CONFIG, 1, None)
    parts = open_model(str(tmp_path / "bf16"))[0].vision
    b = plugin.get_backend("reference")
    got = VisionEncoder(parts.config, parts.weights(), b, plugin.probe(b)[0][0]).encode(x)
    want = reference_rows({k: v.astype(np.float64) for k, v in vis16.items()},
                          {k: v.astype(np.float64) for k, v in proj16.items()}, x)
    assert rel_err(got, want) < 1e-4
