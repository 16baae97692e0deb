"""Images in, for Qwen2.5-VL: a random-weight HF folder built here (the vision tower with
window and full-attention blocks and the patch merger, a two-layer Qwen2 text model with
M-RoPE, a processor config with small min/max pixels, a byte-level tokenizer with Qwen's
image tokens and the form of its chat template) against tests/reference_qwen25vl.py.

The images' sizes give grids whose windows are cut short at the edges, and two images of
different grids in one prompt. The tower runs as one poot graph per grid on the oracle and
the cpu backend; the processor's resize and patch order, the 3-D positions of a prompt,
the text model's logits with one and two images (their rows through the hosted embedding
rows, their tokens turned by M-RoPE) and the decode after them (the positions shifted)
are checked; a prompt without images gives the logits of the same weights read as a plain
Qwen2, to the bit.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import reference_qwen25vl as ref
import test_families as families
from test_families import BASE, random_tensors
from test_vision_gemma3 import rel_err

SECTIONS = [2, 3, 3]                       # of HEAD_DIM 16's 8 rotary pairs
TEXT = {**{k: v for k, v in BASE.items() if k not in ("rope_theta", "torch_dtype",
                                                      "tie_word_embeddings")},
        "model_type": "qwen2_5_vl_text", "num_hidden_layers": 2, "hidden_act": "silu",
        "max_position_embeddings": 256, "use_sliding_window": False, "sliding_window": None,
        "layer_types": ["full_attention"] * 2, "max_window_layers": 80,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "mrope_section": SECTIONS}}
VISION = {"model_type": "qwen2_5_vl_vision", "depth": 3, "hidden_size": 32,
          "intermediate_size": 48, "num_heads": 2, "in_channels": 3, "patch_size": 14,
          "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
          "fullatt_block_indexes": [1], "out_hidden_size": BASE["hidden_size"],
          "hidden_act": "silu", "tokens_per_second": 4,
          "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
START, END, IMAGE = (261 + SPECIAL.index(t) for t in SPECIAL[2:])
CONFIG = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
          "text_config": TEXT, "vision_config": VISION, "image_token_id": IMAGE,
          "video_token_id": 299, "vision_start_token_id": START, "vision_end_token_id": END,
          "tie_word_embeddings": False, "dtype": "float32"}
LO, HI = 28 * 28 * 4, 28 * 28 * 24
PROCESSOR = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
             "do_resize": True, "image_mean": list(ref.CLIP_MEAN), "image_std": list(ref.CLIP_STD),
             "image_processor_type": "Qwen2VLImageProcessor", "merge_size": 2, "patch_size": 14,
             "processor_class": "Qwen2_5_VLProcessor", "resample": 3, "rescale_factor": 1 / 255,
             "temporal_patch_size": 2, "min_pixels": LO, "max_pixels": HI}
#: Qwen2.5-VL's template's form: a default system turn, counters in namespaces, each
#: image part (by type or key) as the three tokens with one <|image_pad|>
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: (width, height): grids (4, 6) and (10, 6) patches, 6 and 15 tokens: 2 and 6 windows of
#: 2 x 2 merged blocks, 3 of them cut short
SIZES = [(90, 60), (84, 140)]
GRIDS = [(4, 6), (10, 6)]
#: the text model as transformers' Qwen2 reads it (tests/reference_qwen25vl.forward)
REF_TEXT = {**TEXT, "rope_theta": 10000.0, "mrope_section": SECTIONS}


def vision_tensors(rng) -> dict[str, np.ndarray]:
    d, f, k = VISION["hidden_size"], VISION["intermediate_size"], 4 * VISION["hidden_size"]

    def mat(*shape):
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    def vec(n, base=0.0):
        return (base + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"patch_embed.proj.weight": (rng.standard_normal((d, 3, 2, 14, 14)) * 0.05
                                     ).astype(np.float32),
         "merger.ln_q.weight": vec(d, 1.0), "merger.mlp.0.weight": mat(k, k),
         "merger.mlp.0.bias": vec(k), "merger.mlp.2.weight": mat(BASE["hidden_size"], k),
         "merger.mlp.2.bias": vec(BASE["hidden_size"])}
    for i in range(VISION["depth"]):
        p = f"blocks.{i}."
        w.update({p + "norm1.weight": vec(d, 1.0), p + "norm2.weight": vec(d, 1.0),
                  p + "attn.qkv.weight": mat(3 * d, d), p + "attn.qkv.bias": vec(3 * d),
                  p + "attn.proj.weight": mat(d, d), p + "attn.proj.bias": vec(d)})
        for name, n, m in (("gate_proj", f, d), ("up_proj", f, d), ("down_proj", d, f)):
            w[f"{p}mlp.{name}.weight"], w[f"{p}mlp.{name}.bias"] = mat(n, m), vec(n)
    return w


def write_tokenizer(folder) -> None:
    from tokenizers import Tokenizer

    families.write_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(SPECIAL)
    tok.add_special_tokens([f"<unused{i}>" for i in range(tok.get_vocab_size(),
                                                           TEXT["vocab_size"])])
    assert tok.token_to_id("<|image_pad|>") == IMAGE
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": "<|im_end|>", "add_bos_token": False,
         "chat_template": TEMPLATE}))


def hf5_tensors(text, vis) -> dict:
    """The tensors as transformers 5 saves them."""
    return {**{f"model.language_model.{k[len('model.'):]}": v for k, v in text.items()
               if k.startswith("model.")}, "lm_head.weight": text["lm_head.weight"],
            **{f"model.visual.{k}": v for k, v in vis.items()}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder in transformers 5's names and spelling; its tensors and images."""
    from PIL import Image

    from poot_quant.safetensors_dir import write_folder

    rng = np.random.default_rng(2505)
    vis = vision_tensors(rng)
    text = random_tensors({**TEXT, "model_type": "qwen2", "tie_word_embeddings": False}, 25)
    path = tmp_path_factory.mktemp("qwen25vl") / "model"
    write_folder(path, hf5_tensors(text, vis), CONFIG, 1,
                 {"preprocessor_config.json": PROCESSOR})
    write_tokenizer(path)
    images = path.parent / "images"
    images.mkdir()
    for i, size in enumerate(SIZES):
        data = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(data, "RGB").save(images / f"{i}.png")
    return path, text, vis, sorted(images.glob("*.png"))


@pytest.fixture(scope="module")
def models(folder):
    import poot

    loaded = {}

    def get(backend):
        if backend not in loaded:
            loaded[backend] = poot.load(str(folder[0]), backend, max_seq=160, prefill_tokens=16)
        return loaded[backend]
    return get


@pytest.fixture(scope="module")
def reference_images(folder):
    """Each image's (reference patch rows, grid, reference merged rows)."""
    _, _, vis, images = folder
    out = []
    for image in images:
        x, grid = ref.patches(image, LO, HI)
        out.append((x, grid, ref.tower(vis, VISION, x, grid)))
    return out


def test_config_and_tensor_names(folder, tmp_path):
    """Sizes, M-RoPE sections and image tokens from config.json; transformers 4.x's
    spelling (text keys at the top level, rope_scaling of type mrope, `visual.` and
    `model.` tensors) reads as the same model; unknown keys, sections that do not fill the
    head and a merger width other than the text model's are refused by name."""
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from poot_quant.safetensors_dir import write_folder

    path, text, vis, _ = folder
    ckpt, config = open_model(str(path))
    c, tokens = ckpt.vision.config, ckpt.vision.tokens
    assert config.arch == "qwen2" and config.qkv_bias and config.mrope == (2, 3, 3)
    assert (c.layers, c.full_blocks, c.window_units, c.patch_values) == (3, (1,), 2, 1176)
    assert (tokens.image, tokens.start, tokens.end) == (IMAGE, START, END)
    assert set(ckpt.vision.tensors) == {f"vision.{k}" for k in vis}
    flat = {k: v for k, v in TEXT.items() if k not in ("rope_parameters", "model_type")}
    v4 = {**CONFIG, **flat, "text_config": None, "torch_dtype": "float32",
          "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": SECTIONS},
          "vision_config": {**{k: v for k, v in VISION.items() if k != "rope_parameters"},
                            "model_type": "qwen2_5_vl", "in_chans": 3}}
    del v4["text_config"], v4["dtype"]
    tensors4 = {**{k: v for k, v in text.items()}, **{f"visual.{k}": v for k, v in vis.items()}}
    write_folder(tmp_path / "v4", tensors4, v4, 1, None)
    assert open_model(str(tmp_path / "v4"))[1] == config
    bad_rope = {**TEXT["rope_parameters"], "mrope_section": [2, 3, 4]}
    for name, cfg, match in (
            ("odd", {**CONFIG, "frobnicate": 1}, "frobnicate"),
            ("sections", {**CONFIG, "text_config": {**TEXT, "rope_parameters": bad_rope}},
             "mrope_section"),
            ("width", {**CONFIG, "vision_config": {**VISION, "out_hidden_size": 32}},
             "out_hidden_size"),
            ("act", {**CONFIG, "vision_config": {**VISION, "hidden_act": "gelu"}},
             "hidden_act")):
        write_folder(tmp_path / name, hf5_tensors(text, vis), cfg, 1, None)
        with pytest.raises(CheckpointError, match=match):
            open_model(str(tmp_path / name))


def test_preprocessing_as_the_processor(folder, reference_images):
    """smart_resize's sides (rounded, or scaled into [min, max] pixels), and the patch rows
    of each image as the processor lists them (bicubic, CLIP's normalization, both frames
    the image, each 2 x 2 block's patches together)."""
    from poot.errors import ImageError
    from poot.models.loader import open_model
    from poot.models.vision.qwen25vl_preprocess import qwen25_patches, smart_resize

    path, _, _, images = folder
    p = open_model(str(path))[0].vision.processing
    assert (p.min_pixels, p.max_pixels, p.resample) == (LO, HI, 3)
    for h, w in [(60, 90), (150, 100), (20, 20), (1000, 700), (14, 1000), (300, 2)]:
        if max(h, w) / min(h, w) > 200:
            with pytest.raises(ImageError, match="aspect ratio"):
                smart_resize(h, w, p)
            continue
        got = smart_resize(h, w, p)
        assert got == ref.resized_size(h, w, LO, HI)
        assert got[0] % 28 == got[1] % 28 == 0
        # within the bounds, except where a side cannot go below one block
        assert LO <= got[0] * got[1] <= HI or min(got) == 28
    for image, (x, grid, _) in zip(images, reference_images):
        got, got_grid = qwen25_patches(image, p)
        assert got_grid == grid and got.dtype == np.float32
        assert np.abs(got - x).max() < 1e-5
    assert [g for _, g, _ in reference_images] == GRIDS


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_tower_matches_numpy(folder, reference_images, backend):
    """The tower's merged rows, windows cut short at the grids' edges, on the oracle and
    cpu, one compiled graph per padded window count: windows cut short padded to their 16
    patches, and the count of windows to a quarter octave (a window all padding); a grid
    of the same count (6 x 12 after 10 x 6) runs in the same graph."""
    from poot import plugin
    from poot.models.loader import open_model
    from poot.models.vision.qwen25vl import PADDING, Qwen25Encoder, layout, padded

    parts = open_model(str(folder[0]))[0].vision
    b = plugin.get_backend(backend)
    enc = Qwen25Encoder(parts.config, parts.weights(), b, plugin.probe(b)[0][0])
    first = None
    for x, grid, want in reference_images:
        got = enc.encode(x, grid)
        first = enc.cache.uploads if first is None else first
        assert got.shape == (grid[0] * grid[1] // 4, BASE["hidden_size"])
        assert rel_err(got, want) < 1e-4
    assert sorted(enc.executors) == [2, 6]                  # one graph per window count
    assert [len(layout(parts.config, *g)[PADDING]) for g in GRIDS] == [32, 96]
    assert [padded(n) for n in (1, 2, 3, 5, 6, 9, 11, 15)] == [1, 2, 3, 5, 6, 10, 12, 16]
    if backend != "reference":    # the graphs below build more kernels, a cold cache's cost
        return
    # 9 windows (6 x 6 blocks) run in a graph of 10, the last all padding
    x = np.random.default_rng(1).standard_normal((12 * 12, 1176)).astype(np.float32)
    assert len(layout(parts.config, 12, 12)[PADDING]) == 10 * 16
    assert rel_err(enc.encode(x, (12, 12)), ref.tower(folder[2], VISION, x, (12, 12))) < 1e-4
    x = x[:72]
    assert rel_err(enc.encode(x, (6, 12)), ref.tower(folder[2], VISION, x, (6, 12))) < 1e-4
    # the later graphs bound the weights the first uploaded
    assert sorted(enc.executors) == [2, 6, 10] and enc.cache.uploads < first + len(folder[2])


def test_prompt_positions():
    """Each image's tokens at (start, start + row, start + column) of its merged grid, the
    text after it from the largest before plus one; the shift of what follows."""
    from poot.models.mrope import positions

    ids = [1, 2, START] + [IMAGE] * 6 + [END, 3, START] + [IMAGE] * 15 + [END, 4, 5]
    starts = [3, 3 + 6 + 3]
    got, shift = positions(len(ids), list(zip(starts, GRIDS)), 2)
    want = ref.rope_index(ids, IMAGE, GRIDS)
    assert np.array_equal(got, want)
    assert shift == want.max() + 1 - len(ids) and shift < 0
    same, none = positions(5, [], 2)
    assert np.array_equal(same, np.tile(np.arange(5), (3, 1))) and none == 0


@pytest.mark.parametrize("backend,count", [("reference", 1), ("reference", 2), ("cpu", 2)])
def test_text_logits_with_images(folder, models, reference_images, backend, count):
    """The chat's ids (each image's <|image_pad|> run as long as its merged grid), the rows
    at their positions and the tokens turned by M-RoPE give the reference's logits."""
    from poot.models.vision.chat import image_chat_ids, placed
    from poot.models.vision.qwen25vl_chat import prompt_positions

    _, text, _, _ = folder
    model = models(backend)
    vision = model.checkpoint.vision
    grids = GRIDS[:count]
    ids, positions = image_chat_ids(model.tokenizer, vision.tokens, "What is this?", grids)
    # the processor's text: the template's, each image's <|image_pad|> repeated
    blocks = "".join(f"<|vision_start|>{'<|image_pad|>' * (h * w // 4)}<|vision_end|>"
                     for h, w in grids)
    want_text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 f"<|im_start|>user\n{blocks}What is this?<|im_end|>\n<|im_start|>assistant\n")
    assert ids == model.tokenizer.encode(want_text, add_special=False)
    assert [len(p) for p in positions] == [6, 15][:count]
    assert [i for i, t in enumerate(ids) if t == IMAGE] == sum(positions, [])
    rows = [r for _, _, r in reference_images[:count]]
    pos3, _ = prompt_positions(len(ids), positions, grids, 2)
    assert np.array_equal(pos3, ref.rope_index(ids, IMAGE, grids))
    hosted, spans = placed(vision.tokens, positions, rows)
    assert spans == {}
    want = ref.forward(text, REF_TEXT, ids, hosted, pos3)
    got = model.prefill_logits(ids, hosted=hosted, positions=pos3)
    assert rel_err(got, want) < 1e-4
    plain = ref.forward(text, REF_TEXT, ids, hosted)          # 1-D positions: not the same
    assert rel_err(plain, want) > 1e-3


def test_text_only_is_plain_qwen2(folder, models, tmp_path):
    """Without images M-RoPE's three positions agree: the logits are those of the same
    weights read as a Qwen2 folder, to the bit, and the reference's; so are greedy texts,
    on a dense cache and in a paged batch."""
    import poot
    from poot_quant.safetensors_dir import write_folder

    _, text, _, _ = folder
    qwen2 = {**{k: v for k, v in TEXT.items() if k not in ("rope_parameters", "layer_types",
                                                          "max_window_layers")},
             "model_type": "qwen2", "rope_theta": 10000.0, "tie_word_embeddings": False}
    write_folder(tmp_path / "qwen2", text, qwen2, 1, None)
    write_tokenizer(tmp_path / "qwen2")
    plain = poot.load(str(tmp_path / "qwen2"), "reference", max_seq=160)
    ids = list(range(3, 40))
    got = models("reference").prefill_logits(ids)
    assert np.array_equal(got, plain.prefill_logits(ids))
    assert rel_err(got, ref.forward(text, REF_TEXT, ids)) < 1e-4
    assert models("reference").generate(ids, max_tokens=5) == plain.generate(ids, max_tokens=5)
    # a paged batch: each sequence's shift is its row slot's 0
    paged = [poot.load(str(p), "reference", max_seq=160, kv="paged")
             for p in (folder[0], tmp_path / "qwen2")]
    texts = [m.generate_many(["hello there", "the cat"], max_tokens=5) for m in paged]
    assert texts[0] == texts[1]


def test_generate_and_poot_run_with_two_images(folder, capsys):
    """The session's chunked prefill of an image prompt (chunks of 16 across the images'
    tokens) and its decode with the positions shifted give the tokens a one-step prefill
    over the prompt and the answer predicts (teacher-forced, the answer's positions
    shifted); ImageChat.generate and `poot run --image --image` print their text."""
    import poot
    from poot.cli import main
    from poot.models.vision.chat import ImageChat

    path, _, _, images = folder
    m = poot.load(str(path), "reference", max_seq=160, prefill_tokens=16)
    chat = ImageChat(m)
    ids, hosted, spans, pos3, shift = chat._prompt("Describe both.", images, None)
    assert spans == {} and len(hosted) == 21 and shift < 0
    answer: list[int] = []
    for k in range(4):
        after = np.tile(np.arange(len(ids), len(ids) + k) + shift, (3, 1))
        logits = m.prefill_logits(ids + answer, hosted=hosted,
                                  positions=np.concatenate([pos3, after], 1))
        answer.append(int(np.argmax(logits[-1])))
    stop = next((k for k, t in enumerate(answer) if t in m.tokenizer.stop_ids), len(answer))
    text = chat.generate("Describe both.", images, max_tokens=4)
    assert chat.image_seconds == []             # both images' rows came from the cache
    assert m.stats.prompt_tokens == len(ids)
    assert text == m.tokenizer.decode(answer[:stop])
    capsys.readouterr()
    rc = main(["run", str(path), "--backend", "reference", "--max-seq", "160", "--quiet",
               "--max-tokens", "4", "--prompt", "Describe both.",
               "--image", str(images[0]), "--image", str(images[1])])
    assert rc == 0
    assert capsys.readouterr().out == text + "\n"
