"""Images in, for Idefics3 (SmolVLM): a random-weight HF folder built here (the SigLIP tower,
the pixel-shuffle connector, a two-layer Llama text model, an Idefics3 preprocessor config
with image splitting, a byte-level tokenizer with SmolVLM's image tokens) against
tests/reference_siglip.py and tests/reference_decoder.py.

The tower and connector run as one poot graph per tile on the oracle and the cpu backend;
the preprocessing tiles as Idefics3's processor does (checked here against its arithmetic
written out with Pillow); the text model's logits with one and two images come from a
prefill whose image tokens take the connector's rows through the hosted embedding rows;
`poot run --image` generates what the session path gives.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from reference_decoder import forward
from reference_siglip import idefics3_connector, tower
import test_families as families
from test_families import BASE, random_tensors
from test_vision_gemma3 import VISION as SIGLIP
from test_vision_gemma3 import rel_err, vision_tensors

SCALE = 2
TILE = SIGLIP["image_size"]                                    # 16 pixels, 4 x 4 patches
PER_TILE = (TILE // SIGLIP["patch_size"] // SCALE) ** 2       # 4 rows per tile
VISION = {**{k: v for k, v in SIGLIP.items() if k != "vision_use_head"},
          "model_type": "idefics3_vision"}
TEXT = {**BASE, "model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 2,
        "max_position_embeddings": 256}
SPECIAL = ["<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
           "<global-img>", *(f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2))]
IMAGE = 261 + SPECIAL.index("<image>")          # after test_families' 261 tokens
CONFIG = {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
          "text_config": TEXT, "vision_config": VISION, "scale_factor": SCALE,
          "image_token_id": IMAGE, "tie_word_embeddings": False, "torch_dtype": "float32",
          "pad_token_id": 0, "use_cache": True}
PROCESSOR = {"do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True,
             "do_pad": True, "do_rescale": True, "do_resize": True,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
             "image_processor_type": "Idefics3ImageProcessor",
             "max_image_size": {"longest_edge": TILE}, "processor_class": "Idefics3Processor",
             "resample": 1, "rescale_factor": 1 / 255, "size": {"longest_edge": 2 * TILE}}
#: SmolVLM's turn format, its message content a string
TEMPLATE = ("<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: "
            "{{ message['content'] }}<end_of_utterance>\n{% endfor %}"
            "{% if add_generation_prompt %}Assistant:{% endif %}")
#: (width, height) of the test images: a 2 x 2 grid and a 1 x 2 grid of tiles
SIZES = [(23, 31), (40, 16)]


def write_tokenizer(folder) -> None:
    """tests/test_families.py's byte-level BPE with SmolVLM's turn and image tokens added,
    then unused tokens up to the text model's vocabulary."""
    from tokenizers import Tokenizer

    families.write_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(SPECIAL)
    tok.add_special_tokens([f"<unused{i}>" for i in range(tok.get_vocab_size(),
                                                           TEXT["vocab_size"])])
    assert tok.token_to_id("<image>") == IMAGE
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "<end_of_utterance>", "add_bos_token": False,
         "chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder in transformers' Idefics3 tensor names; its tensors and images."""
    from PIL import Image

    from poot_quant.safetensors_dir import write_folder

    rng = np.random.default_rng(54)
    vis, _ = vision_tensors(rng)
    d = VISION["hidden_size"] * SCALE * SCALE
    proj = {"modality_projection.proj.weight":
            (rng.standard_normal((TEXT["hidden_size"], d)) * d ** -0.5).astype(np.float32)}
    text = random_tensors(TEXT, 7)
    tensors = {**{f"model.text_model.{k[len('model.'):]}": v for k, v in text.items()
                  if k.startswith("model.")},
               "lm_head.weight": text["lm_head.weight"],
               **{f"model.vision_model.{k}": v for k, v in vis.items()},
               **{f"model.connector.{k}": v for k, v in proj.items()}}
    path = tmp_path_factory.mktemp("idefics3") / "model"
    write_folder(path, tensors, CONFIG, 1, {"preprocessor_config.json": PROCESSOR})
    write_tokenizer(path)
    images = path.parent / "images"
    images.mkdir()
    for i, size in enumerate(SIZES):
        data = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(data, "RGB").save(images / f"{i}.png")
    return path, text, vis, proj, sorted(images.glob("*.png"))


@pytest.fixture(scope="module")
def parts(folder):
    from poot.models.loader import open_model

    ckpt, config = open_model(str(folder[0]))
    assert config.arch == "llama" and config.dim == TEXT["hidden_size"] and config.layers == 2
    assert not config.tied
    return ckpt.vision


def reference_rows(vis, proj, tiles) -> np.ndarray:
    """The rows of an image's tiles [T, 3, 16, 16], tile after tile."""
    return np.concatenate([idefics3_connector(proj, VISION, SCALE, tower(vis, VISION, x))
                           for x in tiles])


def test_config_and_tensor_names(folder, parts, tmp_path):
    """The sizes, connector and image token read from config.json; unknown keys and
    tensors, and a scale that does not divide the patch grid, are refused by name."""
    from poot.errors import CheckpointError
    from poot.models.loader import open_model
    from poot_quant.safetensors_dir import write_folder

    c = parts.config
    assert (c.connector, c.scale, c.mm_tokens, c.patches_per_side) == ("idefics3", 2, 4, 4)
    assert (parts.tokens.image, parts.tokens.count) == (IMAGE, 4)
    assert set(parts.tensors) == {f"vision.{k}" for k in folder[2]} | {
        "connector.modality_projection.proj.weight"}
    path, text, vis, proj, _ = folder
    tensors = {**{f"model.text_model.{k[len('model.'):]}": v for k, v in text.items()
                  if k.startswith("model.")}, "lm_head.weight": text["lm_head.weight"],
               **{f"model.vision_model.{k}": v for k, v in vis.items()},
               **{f"model.connector.{k}": v for k, v in proj.items()}}
    # transformers 5.25's save_pretrained spelling: RoPE as rope_parameters, _pad_token_id
    text5 = {**{k: v for k, v in TEXT.items() if k != "rope_theta"},
             "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    write_folder(tmp_path / "v5", tensors, {**CONFIG, "text_config": text5, "_pad_token_id": 0},
                 1, None)
    assert open_model(str(tmp_path / "v5"))[1] == open_model(str(path))[1]
    # SmolVLM's own spelling: the text model's sizes copied to the top level, and 4.x's
    # whole PretrainedConfig in each sub-config, its training code's keys beside
    junk = {"add_cross_attention": False, "bad_words_ids": None, "num_beams": 1,
            "id2label": {"0": "LABEL_0"}, "torch_dtype": "bfloat16", "pad_token_id": 2}
    smolvlm = {**CONFIG, "vocab_size": TEXT["vocab_size"], "hidden_size": TEXT["hidden_size"],
               "text_config": {**TEXT, **junk, "perceiver_config": {"model_type": "x"},
                               "qk_layer_norms": False, "is_llama_config": True},
               "vision_config": {**VISION, **junk, "model_type": "siglip_vision_model",
                                 "use_base_siglip": True,
                                 "max_image_size": {"longest_edge": TILE}}}
    write_folder(tmp_path / "smolvlm", tensors, smolvlm, 1, None)
    assert open_model(str(tmp_path / "smolvlm"))[1] == open_model(str(path))[1]
    for name, cfg, extra, match in (
            ("odd", {**CONFIG, "frobnicate": 1}, {}, "frobnicate"),
            ("scale", {**CONFIG, "scale_factor": 3}, {}, "scale_factor"),
            ("copy", {**CONFIG, "hidden_size": 65}, {}, "hidden_size"),
            ("resampler", {**CONFIG, "text_config": {**TEXT, "use_resampler": True}}, {},
             "use_resampler"),
            ("extra", CONFIG, {"model.perceiver.w": proj["modality_projection.proj.weight"]},
             "perceiver")):
        write_folder(tmp_path / name, {**tensors, **extra}, cfg, 1, None)
        with pytest.raises(CheckpointError, match=match):
            open_model(str(tmp_path / name))


def hf_tiles(path, split=True, longest=2 * TILE):
    """Idefics3's processor on one image, its arithmetic written out with Pillow: the
    longest edge to `longest` (the other edge even), both edges up to multiples of 16,
    tiles row by row, then the whole image at 16 x 16 (where there is more than one)."""
    import math

    from PIL import Image

    img = Image.open(path).convert("RGB")
    w, h = img.size
    if w >= h:
        w, h = longest, int(longest / (w / h))
        h += h % 2
    else:
        h, w = longest, int(longest * (w / h))
        w += w % 2
    img = img.resize((w, h), Image.Resampling.LANCZOS)
    if not split:
        frames, grid = [img.resize((TILE, TILE), Image.Resampling.LANCZOS)], (0, 0)
    else:
        if w >= h:
            w2 = math.ceil(w / TILE) * TILE
            h2 = math.ceil(int(w2 / (w / h)) / TILE) * TILE
        else:
            h2 = math.ceil(h / TILE) * TILE
            w2 = math.ceil(int(h2 * (w / h)) / TILE) * TILE
        img = img.resize((w2, h2), Image.Resampling.LANCZOS)
        grid = (h2 // TILE, w2 // TILE) if (h2, w2) != (TILE, TILE) else (0, 0)
        frames = [img.crop((c * TILE, r * TILE, (c + 1) * TILE, (r + 1) * TILE))
                  for r in range(grid[0]) for c in range(grid[1])]
        frames.append(img.resize((TILE, TILE), Image.Resampling.LANCZOS) if grid[0] else img)
    x = np.stack([np.asarray(f, np.float64).transpose(2, 0, 1) for f in frames])
    return (x / 255 - 0.5) / 0.5, grid


@pytest.mark.parametrize("split,longest,grids", [(True, 2 * TILE, [(2, 2), (1, 2)]),
                                                  (False, 2 * TILE, [(0, 0)] * 2),
                                                  (True, TILE, [(0, 0)] * 2)])
def test_preprocessing_tiles_as_the_processor(folder, split, longest, grids):
    """Split into tiles and the whole image; not split; split, but one tile's size."""
    from dataclasses import replace

    from poot.models.vision.preprocess import read_tiling, tiles

    path, *_, images = folder
    proc = read_tiling(path, TILE)
    assert (proc.longest, proc.tile, proc.split, proc.resample) == (32, 16, True, 1)
    for image, want_grid in zip(images, grids, strict=True):
        got, grid = tiles(image, replace(proc, split=split, longest=longest))
        want, hf_grid = hf_tiles(image, split, longest)
        assert grid == hf_grid == want_grid
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.fixture(scope="module")
def tiles_and_rows(folder):
    """The first image's tiles and the reference's rows for them."""
    from poot.models.vision.preprocess import read_tiling, tiles

    path, _, vis, proj, images = folder
    x, grid = tiles(images[0], read_tiling(path, TILE))
    want = reference_rows(vis, proj, x)
    assert grid == (2, 2) and want.shape == (5 * PER_TILE, TEXT["hidden_size"])
    return x, want


@pytest.mark.parametrize("backend", ["reference", "cpu", "vulkan", "cuda"])
def test_tower_and_connector_match_numpy(backend, parts, tiles_and_rows):
    """Each tile through the encoder's graph, its rows one tile after another."""
    from poot import plugin
    from poot.models.vision.encoder import VisionEncoder

    x, want = tiles_and_rows
    b = plugin.get_backend(backend)
    devices, why = plugin.probe(b)
    if not devices:
        pytest.skip(f"backend {backend} finds no device here: {why}")
    enc = VisionEncoder(parts.config, parts.weights(), b, devices[0])
    assert rel_err(enc.encode(x), want) < (1e-5 if backend == "reference" else 1e-4)
    assert rel_err(enc.encode(x[-1]), want[-PER_TILE:]) < 1e-4     # one tile alone


@pytest.fixture(scope="module")
def models(folder):
    """Loaded on first use, by backend."""
    import poot

    loaded = {}

    def get(backend):
        if backend not in loaded:
            loaded[backend] = poot.load(str(folder[0]), backend, max_seq=128,
                                        prefill_tokens=16)
        return loaded[backend]
    return get


def expanded(grid) -> str:
    """The processor's text for one image of tile grid `grid`."""
    run = "<image>" * PER_TILE
    rows, cols = grid
    text = "".join("".join(f"<fake_token_around_image><row_{r}_col_{c}>{run}"
                           for c in range(1, cols + 1)) + "\n" for r in range(1, rows + 1))
    last = f"<fake_token_around_image><global-img>{run}<fake_token_around_image>"
    return f"{text}\n{last}" if rows else last


@pytest.mark.parametrize("backend,count", [("reference", 1), ("reference", 2), ("cpu", 2)])
def test_text_logits_with_images(folder, models, backend, count):
    """The text model reads each image's rows, tile after tile, at its image tokens'
    positions, as tests/reference_decoder.py does with the reference rows."""
    from poot.models.chat import render_chat_for
    from poot.models.vision.chat import image_chat_ids, placed, prepare, read_image_processing

    path, text, vis, proj, images = folder
    model = models(backend)
    vision = model.checkpoint.vision
    proc = read_image_processing(vision)
    prepared = [prepare(image, proc) for image in images[:count]]
    grids = [grid for _, grid in prepared]
    ids, positions = image_chat_ids(model.tokenizer, vision.tokens, "What is this?", grids)
    # the ids of the text Idefics3Processor makes: the template's rendering with each image
    # expanded before the message's text
    want_text = render_chat_for(model.tokenizer, [{"role": "user", "content": "@"}]).replace(
        "@", "".join(expanded(g) for g in grids) + "What is this?")
    assert ids == model.tokenizer.encode(want_text, add_special=False)
    assert [len(p) for p in positions] == [5 * PER_TILE, 3 * PER_TILE][:count]
    assert [i for i, t in enumerate(ids) if t == IMAGE] == sum(positions, [])
    rows = {}
    for where, (x, _) in zip(positions, prepared):
        rows.update(zip(where, reference_rows(vis, proj, x)))
    want = forward(text, TEXT, ids, rows)
    hosted, spans = placed(vision.tokens, positions, [reference_rows(vis, proj, x)
                                               for x, _ in prepared])
    assert spans == {} and sorted(hosted) == sorted(rows)
    got = model.prefill_logits(ids, hosted=hosted)
    assert rel_err(got, want) < 1e-4
    assert rel_err(forward(text, TEXT, ids), want) > 1e-2     # the rows change the logits


def test_generate_and_poot_run_with_two_images(folder, capsys):
    """The session's chunked prefill of an image prompt (its image tokens across chunks of
    16) and its decode give the tokens a one-step prefill over the prompt and the answer
    predicts (teacher-forced); ImageChat.generate and `poot run --image --image` print
    their text."""
    import poot
    from poot.cli import main
    from poot.models.vision.chat import ImageChat

    path, _, _, _, images = folder
    m = poot.load(str(path), "reference", max_seq=128, prefill_tokens=16)
    chat = ImageChat(m)
    from poot.errors import RequestError

    with pytest.raises(RequestError, match=r"6 image\(s\) and the text take \d+ tokens"):
        chat.prompt("Describe them.", [images[0]] * 6)     # refused before any is encoded
    ids, hosted, spans = chat.prompt("Describe both.", images[:2])
    assert spans == {} and len(hosted) == 8 * PER_TILE and len(chat.image_seconds) == 2
    answer = []
    for _ in range(4):
        logits = m.prefill_logits(ids + answer, hosted=hosted)
        answer.append(int(np.argmax(logits[-1])))
    stop = next((k for k, t in enumerate(answer) if t in m.tokenizer.stop_ids), len(answer))
    text = chat.generate("Describe both.", images[:2], max_tokens=4)
    assert chat.image_seconds == []             # both images' rows came from the cache
    assert m.stats.prompt_tokens == len(ids)
    assert text == m.tokenizer.decode(answer[:stop])
    capsys.readouterr()
    rc = main(["run", str(path), "--backend", "reference", "--max-seq", "128", "--quiet",
               "--max-tokens", "4", "--prompt", "Describe both.",
               "--image", str(images[0]), "--image", str(images[1])])
    assert rc == 0
    assert capsys.readouterr().out == text + "\n"


def test_header_grids_are_the_tiles(parts, folder):
    """The grid a server reads from an image's header before decoding it (its prompt's
    length depends on it) is the one its tiles come in."""
    from poot.models.vision.chat import image_grids, prepare, read_image_processing

    images = folder[4]
    proc = read_image_processing(parts)
    assert proc == parts.tokens.tiling
    assert image_grids(parts.tokens, [(p.read_bytes(), p.name) for p in images]) == \
        [prepare(p, proc)[1] for p in images] == [(2, 2), (1, 2)]


def test_poot_serve_answers_with_images_as_the_library(folder):
    """A chat with two data-URL images through `poot serve` answers what ImageChat.generate
    does (greedy); a remote image is refused for a tiling model, even where the server
    fetches remote images."""
    import base64

    import openai
    from serve_process import openai_client, serve

    import poot
    from poot.models.vision.chat import ImageChat

    path, *_, images = folder
    urls = [f"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"
            for p in images]
    chat = ImageChat(poot.load(str(path), "reference", max_seq=128))
    want = chat.generate("Describe both.", [p.read_bytes() for p in images], max_tokens=5,
                         temperature=0.0)

    def ask(client, urls):
        parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
        return client.chat.completions.create(model="smollm2", max_tokens=5, temperature=0,
                                              messages=[{"role": "user", "content": [
                                                  *parts, {"type": "text",
                                                           "text": "Describe both."}]}])

    with serve(path, "--max-seq", "128", "--allow-image-urls") as server:
        client = openai_client(server)
        assert want and ask(client, urls).choices[0].message.content == want
        with pytest.raises(openai.BadRequestError, match="data URLs"):
            ask(client, [urls[0], "http://127.0.0.1:1/a.png"])
        assert server.stats()["images_encoded"] == 2


#: SmolVLM's own chat template (its tokenizer_config.json and chat_template.json), written
#: for content lists
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}"
    "{% endif %}")


def test_a_content_list_template_places_the_images(folder, tmp_path):
    """SmolVLM's template takes the user's content as image parts and text: each <image> it
    writes is expanded as the processor expands it, the system's and user's texts stay
    plain text (a spelled <image> in them is no image token)."""
    import shutil

    from poot.models.tokenizer import Tokenizer
    from poot.models.vision.chat import image_chat_ids

    path = folder[0]
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(path / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>",
         "add_bos_token": False, "chat_template": SMOLVLM_TEMPLATE}))
    tok = Tokenizer.from_hf_folder(tmp_path)
    from poot.models.vision.config import TileTokens

    tokens = TileTokens(IMAGE, PER_TILE)
    grids = [(2, 2), (0, 0)]
    prompt = "Is <image> here?"
    ids, positions = image_chat_ids(tok, tokens, prompt, grids, system="Be brief.")
    blocks = "".join(expanded(g) for g in grids)
    want = (tok.encode("<|im_start|>System: ", add_special=False) + tok.encode_text(
        "Be brief.") + tok.encode(f"<end_of_utterance>\nUser:{blocks}", add_special=False)
        + tok.encode_text(prompt) + tok.encode("<end_of_utterance>\nAssistant:",
                                               add_special=False))
    assert ids == want
    assert [len(p) for p in positions] == [5 * PER_TILE, PER_TILE]
    assert [i for i, t in enumerate(ids) if t == IMAGE] == sum(positions, [])
    # a chat without images through that template: its message as a content list too
    text_only = image_chat_ids(tok, tokens, "Hi", [])[0]
    assert text_only == tok.encode("<|im_start|>User: ", add_special=False) + \
        tok.encode_text("Hi") + tok.encode("<end_of_utterance>\nAssistant:", add_special=False)
    import poot
    from poot.models.vision.chat import ImageChat

    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    (tmp_path / "preprocessor_config.json").symlink_to(path / "preprocessor_config.json")
    chat = ImageChat(poot.load(str(tmp_path), "reference", max_seq=128))
    chat.generate("Hi", max_tokens=1)
    assert chat.model.stats.prompt_tokens == len(text_only)
    from poot.errors import CheckpointError

    with pytest.raises(CheckpointError, match="image_token_id 7"):
        image_chat_ids(tok, TileTokens(7, PER_TILE), prompt, grids)
    with pytest.raises(CheckpointError, match="no <row_3_col_1> token"):
        image_chat_ids(tok, tokens, prompt, [(3, 1)])
