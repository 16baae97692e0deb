"""Gemma 3's pan and scan (poot.models.vision.preprocess.crop_boxes): the crops of a wide, a
tall and a square image against boxes computed by hand from the processor's rule; a folder
whose preprocessor_config.json sets do_pan_and_scan (the random-weight folder of
tests/test_vision_gemma3.py, copied) gets each crop encoded as an image, the prompt text
Gemma3Processor writes for them, and the language model's logits of tests/reference_decoder.py
over crops cut here with numpy slicing; `poot run --image` prints what ImageChat generates;
out-of-range settings are ConfigErrors naming the key; poot serve answers as the library.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from reference_decoder import forward
from test_vision_gemma3 import folder  # noqa: F401 (the module's fixture, reused)
from test_vision_gemma3 import BOI, EOI, MM_TOKENS, PROCESSOR, SOFT, TEXT, reference_rows, rel_err

from poot.errors import ConfigError
from poot.models.vision.preprocess import PanAndScan, crop_boxes

PAN = {**PROCESSOR, "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8,
       "pan_and_scan_max_num_crops": 3, "pan_and_scan_min_ratio_to_activate": 1.2}
#: the model's room: a prompt with crops is a few hundred byte-level tokens
MAX_SEQ = 256
FULL = "\n\n<start_of_image>" + "<image_soft_token>" * MM_TOKENS + "<end_of_image>\n\n"


@pytest.mark.parametrize("size,pas,grid,boxes", [
    # wide 1000 x 300: ratio 3.33 rounds to 3 crops; 1000 // 256 = 3 allows them; each
    # ceil(1000 / 3) = 334 wide, the last cut at the edge
    ((1000, 300), PanAndScan(), (1, 3),
     [(0, 0, 334, 300), (334, 0, 668, 300), (668, 0, 1000, 300)]),
    # tall 300 x 900: 3 rows of 300
    ((300, 900), PanAndScan(), (3, 1),
     [(0, 0, 300, 300), (0, 300, 300, 600), (0, 600, 300, 900)]),
    # square: ratio 1 is under 1.2
    ((500, 500), PanAndScan(), (0, 0), []),
    # ratio 20 asks for 20, max_num_crops keeps 4 of 500 x 100
    ((2000, 100), PanAndScan(50, 4, 1.2), (1, 4),
     [(0, 0, 500, 100), (500, 0, 1000, 100), (1000, 0, 1500, 100), (1500, 0, 2000, 100)]),
    # 500 x 300: ratio 1.67 rounds to 2, 500 // 256 = 1 is raised to 2, but 250 < 256
    ((500, 300), PanAndScan(), (0, 0), []),
    # 23 x 31 (tall, ratio 1.35 rounds to 1, raised to 2): rows of ceil(31 / 2) = 16
    ((23, 31), PanAndScan(8, 3, 1.2), (2, 1), [(0, 0, 23, 16), (0, 16, 23, 31)]),
    # under the ratio of activation
    ((1000, 300), PanAndScan(min_ratio=3.5), (0, 0), []),
    # pan and scan off
    ((1000, 300), None, (0, 0), []),
], ids=["wide", "tall", "square", "max-crops", "too-narrow", "tall-odd", "ratio", "off"])
def test_crop_boxes(size, pas, grid, boxes):
    w, h = size
    assert crop_boxes(h, w, pas) == (grid, boxes)


@pytest.fixture(scope="module")
def pan_folder(folder, tmp_path_factory):  # noqa: F811
    """The Gemma 3 folder with do_pan_and_scan and room for its crops; a wide, a tall and a
    square image."""
    from PIL import Image

    path = tmp_path_factory.mktemp("gemma3-pan") / "model"
    shutil.copytree(folder[0], path)
    (path / "preprocessor_config.json").write_text(json.dumps(PAN))
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = MAX_SEQ
    (path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(7)
    images = []
    for name, (w, h) in {"wide": (40, 16), "tall": (12, 30), "square": (16, 16)}.items():
        images.append(path.parent / f"{name}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images[-1])
    return path, images


def hand_frames(image, boxes) -> list[np.ndarray]:
    """The whole image and its crops (numpy slices of the decoded pixels), each resized to
    16 x 16 bilinear and normalized to [-1, 1], channels first."""
    from PIL import Image

    x = np.asarray(Image.open(image).convert("RGB"))
    out = [x] + [x[t:b, left:r] for left, t, r, b in boxes]
    return [(np.asarray(Image.fromarray(f).resize((16, 16), Image.Resampling.BILINEAR),
                        np.float64) / 255 * 2 - 1).transpose(2, 0, 1) for f in out]


def test_frames_are_the_crops(pan_folder):
    from poot.models.vision.preprocess import frames, read_processing

    path, images = pan_folder
    proc = read_processing(path, 16)
    assert proc.pan_and_scan == PanAndScan(8, 3, 1.2)
    for image, grid, boxes in zip(images, [(1, 3), (3, 1), (0, 0)], [
            [(0, 0, 14, 16), (14, 0, 28, 16), (28, 0, 40, 16)],
            [(0, 0, 12, 10), (0, 10, 12, 20), (0, 20, 12, 30)], []]):
        x, got = frames(image, proc)
        assert got == grid and x.shape == (1 + len(boxes), 3, 16, 16)
        np.testing.assert_allclose(x, np.stack(hand_frames(image, boxes)), atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_prompt_and_logits_with_crops(pan_folder, folder, backend):  # noqa: F811
    """The wide image (3 crops) and the square one (none): the prompt's ids are those of the
    text Gemma3Processor writes, each block's soft tokens take its frame's rows and see
    each other both ways."""
    import poot
    from poot.models.chat import render_chat_for
    from poot.models.vision.chat import ImageChat

    path, images = pan_folder
    _, text, vis, proj, _ = folder
    m = poot.load(str(path), backend, max_seq=MAX_SEQ, prefill_tokens=8)
    chat = ImageChat(m)
    ids, hosted, spans = chat.prompt("What is this?", [images[0], images[2]])
    crops = (f"Here is the original image {FULL} and here are some crops to help you see "
             f"better " + " ".join([FULL] * 3))
    expanded = render_chat_for(m.tokenizer, [{"role": "user", "content": "@"}]).replace(
        "@", crops + FULL + "What is this?")
    assert ids == m.tokenizer.encode(expanded, add_special=False)
    assert ids.count(BOI) == ids.count(EOI) == 5 and ids.count(SOFT) == 5 * MM_TOKENS
    # each block is its own span, in order
    soft = [i for i, t in enumerate(ids) if t == SOFT]
    assert sorted(hosted) == soft
    assert [spans[i] for i in soft] == [k // MM_TOKENS + 1 for k in range(len(soft))]
    frames = hand_frames(images[0], [(0, 0, 14, 16), (14, 0, 28, 16), (28, 0, 40, 16)]) + \
        hand_frames(images[2], [])
    rows = dict(zip(soft, np.concatenate([reference_rows(vis, proj, f) for f in frames])))
    want = forward(text, {**TEXT, "max_position_embeddings": MAX_SEQ}, ids, rows, spans)
    got = m.prefill_logits(ids, hosted=hosted, spans=spans)
    assert rel_err(got, want) < 1e-4
    # the crops' rows matter: the whole image's rows alone at every block differ
    first = {p: rows[soft[k % MM_TOKENS]] for k, p in enumerate(soft[:3 * MM_TOKENS + 4])}
    assert rel_err(forward(text, TEXT, ids, {**rows, **first}, spans), want) > 1e-3


def test_poot_run_with_pan_and_scan(pan_folder, capsys):
    import poot
    from poot.cli import main
    from poot.models.vision.chat import ImageChat

    path, images = pan_folder
    chat = ImageChat(poot.load(str(path), "reference", max_seq=MAX_SEQ))
    text = chat.generate("Describe.", [images[1]], max_tokens=4)
    assert len(chat.image_seconds) == 1
    capsys.readouterr()
    assert main(["run", str(path), "--backend", "reference", "--max-seq", str(MAX_SEQ),
                 "--quiet", "--max-tokens", "4", "--prompt", "Describe.",
                 "--image", str(images[1])]) == 0
    assert capsys.readouterr().out == text + "\n"


@pytest.mark.parametrize("key,value", [
    ("pan_and_scan_min_crop_size", 0), ("pan_and_scan_min_crop_size", 2.5),
    ("pan_and_scan_max_num_crops", 1), ("pan_and_scan_max_num_crops", 1000),
    ("pan_and_scan_min_ratio_to_activate", 0.5), ("do_pan_and_scan", "yes")])
def test_out_of_range_settings_are_refused_naming_the_key(tmp_path, key, value):
    from poot.models.vision.preprocess import read_processing

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**PAN, key: value}))
    with pytest.raises(ConfigError, match=key) as exc:
        read_processing(tmp_path, 16)
    assert exc.value.key == key


def test_poot_serve_with_pan_and_scan(pan_folder):
    """The request's prompt counts each image's crops from its header: the greedy answer
    and prompt length are the library's; a remote image (no header yet) is a 400."""
    import base64

    import openai
    import poot
    from serve_process import openai_client, serve

    from poot.models.vision.chat import ImageChat

    path, images = pan_folder
    chat = ImageChat(poot.load(str(path), "reference", max_seq=MAX_SEQ))
    ids = chat.prompt("Describe.", [images[0]])[0]
    want = chat.generate("Describe.", [images[0]], max_tokens=4, temperature=0.0)
    url = "data:image/png;base64," + base64.b64encode(images[0].read_bytes()).decode()

    def ask(client, u):
        return client.chat.completions.create(
            model="smollm2", max_tokens=4, temperature=0, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": u}},
                {"type": "text", "text": "Describe."}]}])

    with serve(path, "--max-seq", str(MAX_SEQ), "--allow-image-urls") as server:
        client = openai_client(server)
        r = ask(client, url)
        assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == want
        with pytest.raises(openai.BadRequestError, match="tiles or crops"):
            ask(client, "http://127.0.0.1:1/a.png")


def test_settings_nested_in_processor_config(tmp_path):
    """transformers 5 saves the image processor inside processor_config.json."""
    from poot.models.vision.preprocess import read_processing

    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_processor": PAN, "image_seq_length": 4, "processor_class": "Gemma3Processor"}))
    assert read_processing(tmp_path, 16).pan_and_scan == PanAndScan(8, 3, 1.2)
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_processor": {**PAN, "pan_and_scan_max_num_crops": 0}}))
    with pytest.raises(ConfigError, match="processor_config.json image_processor: "
                                          "pan_and_scan_max_num_crops = 0"):
        read_processing(tmp_path, 16)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    assert read_processing(tmp_path, 16).pan_and_scan is None   # the standalone file first
