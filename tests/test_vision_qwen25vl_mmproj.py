"""Qwen2.5-VL from llama.cpp's files: the tiny random folder of tests/test_vision_qwen25vl.py
written as the converter writes it, its text model as a `qwen2vl` GGUF (q/k rows as HF's,
the M-RoPE sections padded to four under rope.dimension_sections, a gpt2 vocabulary) and
its tower as a `qwen2.5vl_merger` mmproj (the Conv3d kernel split into one kernel per
frame, each block's qkv split into q, k and v, the merger's norm as v.post_ln, its linears
as mm.0 and mm.2, full-attention blocks as n_wa_pattern). With the mmproj attached, the
GGUF gives the folder's image tokens, rows and logits (reference, cpu and wgpu; cuda where
a device is); `poot run --mmproj` prints what the library gives; bad files are one typed line
naming file and key.
Qwen2-VL (no folder of it: a random tower in HF's names, LayerNorms, QuickGELU, every block
full attention) as a `qwen2vl_merger` mmproj against tests/reference_qwen25vl.py (the same
backends).
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import test_vision_qwen25vl as qwen
from test_families import skip_without
from test_gguf_families import close_gguf
from test_vision_gemma3 import rel_err
from test_vision_mmproj import V, loaded, write_language_gguf

from poot.errors import CheckpointError

PROMPT = "What is this?"
#: the folder's tower name -> the converter's (per block, "{}")
_BLOCK = {**{f"{hf}.{k}": f"{gg}.{k}" for hf, gg in (
    ("norm1", "ln1"), ("norm2", "ln2"), ("attn.proj", "attn_out"), ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"), ("mlp.fc1", "ffn_up"),
    ("mlp.fc2", "ffn_down")) for k in ("weight", "bias")}}
_TOP = {f"{hf}.{k}": f"{gg}.{k}" for hf, gg in (
    ("merger.ln_q", "v.post_ln"), ("merger.mlp.0", "mm.0"), ("merger.mlp.2", "mm.2"))
    for k in ("weight", "bias")}
#: Qwen2-VL's tower: its MLP's width other than the text width the converter writes as
#: feed_forward_length; every block full attention (for the reference)
QWEN2_FFN = 48
QWEN2_VISION = {**qwen.VISION, "intermediate_size": QWEN2_FFN,
                "fullatt_block_indexes": list(range(qwen.VISION["depth"]))}


def converted(vis: dict) -> dict[str, np.ndarray]:
    """The folder's tower under the converter's names and layouts."""
    out = {}
    for hf, array in vis.items():
        if hf == "patch_embed.proj.weight":      # [d, C, 2, p, p]: one kernel per frame
            out["v.patch_embd.weight"] = array[:, :, 0]
            out["v.patch_embd.weight.1"] = array[:, :, 1]
        elif hf in _TOP:
            out[_TOP[hf]] = array
        else:
            i, rest = hf[len("blocks."):].split(".", 1)
            if rest.startswith("attn.qkv."):
                for part, rows in zip("qkv", np.split(array, 3, 0), strict=True):
                    out[f"v.blk.{i}.attn_{part}.{rest.rsplit('.', 1)[1]}"] = rows
            else:
                out[f"v.blk.{i}.{_BLOCK[rest]}"] = array
    return out


def qwen2_vision_tensors(rng) -> dict[str, np.ndarray]:
    """A random Qwen2-VL tower in HF's names: LayerNorms with biases, fc1 and fc2."""
    d, f = qwen.VISION["hidden_size"], QWEN2_FFN
    w = {k: v for k, v in qwen.vision_tensors(rng).items() if ".mlp." not in k or
         k.startswith("merger.")}
    for name, n in [("merger.ln_q", d)] + [(f"blocks.{i}.norm{j}", d) for j in (1, 2)
                                           for i in range(qwen.VISION["depth"])]:
        w[name + ".weight"] = (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)
        w[name + ".bias"] = (0.2 * rng.standard_normal(n)).astype(np.float32)
    for i in range(qwen.VISION["depth"]):
        for name, n, m in (("fc1", f, d), ("fc2", d, f)):
            w[f"blocks.{i}.mlp.{name}.weight"] = (rng.standard_normal((n, m)) * m ** -0.5
                                                  ).astype(np.float32)
            w[f"blocks.{i}.mlp.{name}.bias"] = (0.2 * rng.standard_normal(n)).astype(np.float32)
    return w


def write_mmproj(path, vis: dict, *, meta: dict | None = None, drop: tuple = (),
                 f16: bool = False, qwen2: bool = False) -> None:
    """The converter's mmproj of the folder's tower (with `qwen2`, a Qwen2-VL tower):
    `meta` replaces key values (None: leaves the key out), `drop` leaves tensors out; with
    `f16`, matrices f16."""
    import gguf

    v = qwen.VISION
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    keys = {"clip.has_vision_encoder": (w.add_bool, True),
            "clip.projector_type": (w.add_string, "qwen2vl_merger" if qwen2 else
                                    "qwen2.5vl_merger"),
            "clip.use_silu": (w.add_bool, True),
            V + "projection_dim": (w.add_uint32, v["out_hidden_size"]),
            V + "image_size": (w.add_uint32, 560),          # the converter's default
            V + "patch_size": (w.add_uint32, v["patch_size"]),
            V + "embedding_length": (w.add_uint32, v["hidden_size"]),
            V + "feed_forward_length": (w.add_uint32, v["intermediate_size"]),
            V + "block_count": (w.add_uint32, v["depth"]),
            V + "attention.head_count": (w.add_uint32, v["num_heads"]),
            # the converter writes the text model's rms_norm_eps here
            V + "attention.layer_norm_epsilon": (w.add_float32, qwen.TEXT["rms_norm_eps"]),
            V + "n_wa_pattern": (w.add_uint32, v["fullatt_block_indexes"][0] + 1),
            V + "window_size": (w.add_uint32, v["window_size"]),
            V + "image_mean": (w.add_array, list(qwen.PROCESSOR["image_mean"])),
            V + "image_std": (w.add_array, list(qwen.PROCESSOR["image_std"])),
            V + "image_min_pixels": (w.add_uint32, qwen.LO),
            V + "image_max_pixels": (w.add_uint32, qwen.HI)}
    if qwen2:   # QuickGELU (llama.cpp's default), no windows; the text width as the ffn's
        for key in ("clip.use_silu", V + "n_wa_pattern", V + "window_size"):
            del keys[key]
        keys[V + "feed_forward_length"] = (w.add_uint32, v["out_hidden_size"])
    for key, value in (meta or {}).items():
        if value is None:
            keys.pop(key, None)
        else:
            keys[key] = (keys[key][0] if key in keys else w.add_bool if isinstance(
                value, bool) else w.add_uint32 if isinstance(value, int) else w.add_string,
                value)
    for key, (add, value) in keys.items():
        add(key, value)
    for name, array in converted(vis).items():
        if name not in drop:
            array = np.ascontiguousarray(array, np.float32)
            w.add_tensor(name, array.astype(np.float16) if f16 and array.ndim > 1 else array)
    close_gguf(w)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The folder, its tensors and images, its text model's GGUF and its mmproj."""
    path, text, vis, images = qwen.folder.__wrapped__(tmp_path_factory)
    root = path.parent
    write_language_gguf(root / "lm.gguf", "qwen2vl", qwen.REF_TEXT, text, path)
    write_mmproj(root / "mmproj.gguf", vis)
    return SimpleNamespace(folder=path, text=text, vis=vis, images=images,
                           gguf=root / "lm.gguf", mmproj=root / "mmproj.gguf")


def opened(path, f):
    """The VisionParts of mmproj `path` for the GGUF language model of `f`."""
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.vision.mmproj import open_mmproj

    ckpt, config = open_model(str(f.gguf))
    return open_mmproj(path, config, Tokenizer.from_gguf_metadata(ckpt.metadata, str(f.gguf)))


def test_the_files_read_as_the_folder(files):
    """The GGUF's text config is the folder's (M-RoPE sections included); the mmproj's
    tower config, image tokens, pixel preparation (the file's numbers float32s) and tensors
    (joined back: the patch kernel's frames, each block's q|k|v) are the folder's."""
    from poot.models.loader import open_model

    ckpt, want = open_model(str(files.folder))
    config = open_model(str(files.gguf))[1]
    assert config.arch == "qwen2vl" and config.mrope == (2, 3, 3) == want.mrope
    assert (config.dim, config.heads, config.kv_heads, config.qkv_bias) == \
        (want.dim, want.heads, want.kv_heads, want.qkv_bias)
    got = opened(files.mmproj, files)
    want_tower = ckpt.vision.config
    assert got.config.eps == pytest.approx(want_tower.eps, rel=1e-7)     # a float32 here
    assert got.config == replace(want_tower, eps=got.config.eps)
    p, want_p = got.processing, ckpt.vision.processing
    for x, y in ((p.mean, want_p.mean), (p.std, want_p.std)):    # float32s here
        assert x == pytest.approx(y, rel=1e-7)
    assert p == replace(want_p, mean=p.mean, std=p.std)
    assert got.tokens == replace(ckpt.vision.tokens, tiling=p)
    assert set(got.tensors) == set(ckpt.vision.tensors)
    for name, info in got.tensors.items():
        assert np.array_equal(info.sources[0], ckpt.vision.tensors[name].sources[0]), name


@pytest.mark.parametrize("backend", ["reference", "cpu", "wgpu", "cuda"])
def test_image_rows_and_logits_equal_the_folder(files, backend):
    """The GGUF with the mmproj attached places the image's tokens, rows and M-RoPE
    positions as the folder does, and its logits over them are the folder's."""
    from poot.models.vision.chat import ImageChat

    skip_without(backend)
    want_model = loaded(files.folder, backend)
    model = loaded(files.gguf, backend, files.mmproj)
    assert model.checkpoint.kind == "gguf"
    # the wider image: windows cut at its edges, and its tower's rows past the rows GEMV's,
    # whose unrolled shaders lavapipe compiles slowly
    images = files.images[1:]
    want_ids, want_rows, _, want_pos, want_shift = ImageChat(want_model)._prompt(
        PROMPT, images, None)
    ids, rows, spans, pos, shift = ImageChat(model)._prompt(PROMPT, images, None)
    assert ids == want_ids and spans == {} and sorted(rows) == sorted(want_rows)
    assert np.array_equal(pos, want_pos) and shift == want_shift < 0
    got = np.stack([rows[p] for p in sorted(rows)])
    assert rel_err(got, np.stack([want_rows[p] for p in sorted(rows)])) < 1e-6
    logits = model.prefill_logits(ids, hosted=rows, positions=pos)
    want = want_model.prefill_logits(ids, hosted=want_rows, positions=want_pos)
    assert rel_err(logits, want) < 1e-5


def test_the_converters_f16_layout_against_numpy(files, tmp_path):
    """Matrices f16 (the converter's --outtype f16): the merged rows of one image against
    tests/reference_qwen25vl.py's tower over the same f16 values."""
    import reference_qwen25vl as ref

    from poot import plugin
    from poot.models.vision.qwen25vl import Qwen25Encoder

    write_mmproj(tmp_path / "f16.gguf", files.vis, f16=True)
    parts = opened(tmp_path / "f16.gguf", files)
    assert parts.tensors["vision.blocks.0.attn.qkv.weight"].dtype.value == "f16"
    held = {k: (v.astype(np.float16) if v.ndim > 1 else v).astype(np.float64)
            for k, v in files.vis.items()}
    x, grid = ref.patches(files.images[0], qwen.LO, qwen.HI)
    b = plugin.get_backend("reference")
    got = Qwen25Encoder(parts.config, parts.weights(), b, plugin.probe(b)[0][0]).encode(x, grid)
    assert rel_err(got, ref.tower(held, qwen.VISION, x, grid)) < 1e-4


def test_poot_run_with_mmproj_prints_what_the_library_gives(files, capsys):
    """`poot run MODEL.gguf --mmproj FILE --image PATH` prints ImageChat.generate's text."""
    from poot.cli import main
    from poot.models.vision.chat import ImageChat

    want = ImageChat(loaded(files.gguf, "reference", files.mmproj)).generate(
        "Describe it.", files.images[:1], max_tokens=3, temperature=0.0)
    capsys.readouterr()
    assert main(["run", str(files.gguf), "--mmproj", str(files.mmproj), "--backend",
                 "reference", "--max-seq", "128", "--quiet", "--max-tokens", "3",
                 "--prompt", "Describe it.", "--image", str(files.images[0])]) == 0
    assert want and capsys.readouterr().out == want + "\n"


@pytest.mark.parametrize("meta,drop,message", [
    ({V + "n_wa_pattern": None}, (), "lacks 'clip.vision.n_wa_pattern'"),
    ({"clip.use_silu": None}, (), "clip.use_silu = None must be true"),
    ({V + "window_size": 60}, (), "window_size = 60 must be a multiple of patch_size x "
                                  "spatial_merge_size 28"),
    ({V + "projection_dim": 96}, (), "projection_dim = 96 differs from the language model's "
                                     "embedding length 64"),
    ({}, ("v.patch_embd.weight.1",), "lacks tensor 'v.patch_embd.weight.1'"),
    ({}, ("v.blk.2.attn_k.bias",), "lacks tensor 'v.blk.2.attn_k.bias'"),
    ({V + "block_count": 2}, (), r"tensor 'v\.blk\.2\.\w+\.\w+' is not one of the tower's"),
    ({"clip.projector_type": "pixtral"}, (),
     "clip.projector_type = 'pixtral' is a projector poot does not run"),
])
def test_bad_mmproj_files_are_one_line_naming_file_and_key(files, tmp_path, meta, drop,
                                                           message):
    bad = tmp_path / "bad.gguf"
    write_mmproj(bad, files.vis, meta=meta, drop=drop)
    with pytest.raises(CheckpointError, match=message) as exc:
        opened(bad, files)
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)


def test_bad_language_files_and_pairings(files, tmp_path):
    """A qwen2vl GGUF without its M-RoPE sections, or with sections that do not fill the
    rotary dim, is refused naming the key; the mmproj feeds qwen2vl language models only."""
    from poot.models.loader import open_model
    from poot.models.vision.mmproj import open_mmproj

    for name, sections, message in (
            ("none", None, "lacks 'qwen2vl.rope.dimension_sections'"),
            ("short", [2, 3, 2], r"rope.dimension_sections = \[2, 3, 2, 0\] must give")):
        path = tmp_path / f"{name}.gguf"
        write_language_gguf(path, "qwen2vl", {**qwen.REF_TEXT, "mrope_section": sections},
                            files.text, files.folder)
        with pytest.raises(CheckpointError, match=message) as exc:
            open_model(str(path))
        assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    llama = SimpleNamespace(arch="llama", dim=64)
    with pytest.raises(CheckpointError, match="'qwen2.5vl_merger' feeds a qwen2vl language "
                                              "model; this one is llama"):
        open_mmproj(files.mmproj, llama, None)


@pytest.fixture(scope="module")
def qwen2_vl(files, tmp_path_factory):
    """A random Qwen2-VL tower in HF's names, its mmproj, and the numpy tower's merged rows
    of the first image."""
    import reference_qwen25vl as ref

    vis = qwen2_vision_tensors(np.random.default_rng(2))
    path = tmp_path_factory.mktemp("qwen2-vl") / "qwen2.gguf"
    write_mmproj(path, vis, qwen2=True)
    x, grid = ref.patches(files.images[0], qwen.LO, qwen.HI)
    return path, vis, ref.tower(vis, QWEN2_VISION, x, grid)


@pytest.mark.parametrize("backend", ["reference", "cpu", "wgpu", "cuda"])
def test_qwen2_vl_mmproj_against_numpy(files, qwen2_vl, backend):
    """A Qwen2-VL mmproj (`qwen2vl_merger`): its MLP's width read from ffn_up (the file's
    feed_forward_length is the text width), every block full attention; the merged rows of
    one image against tests/reference_qwen25vl.py's tower, and the GGUF's logits over them
    against its text model."""
    import reference_qwen25vl as ref

    from poot.models.vision.chat import ImageChat

    skip_without(backend)
    path, _, want = qwen2_vl
    c = opened(path, files).config
    assert c.qwen2_vl and c.ffn == QWEN2_FFN and c.full_blocks == (0, 1, 2)
    model = loaded(files.gguf, backend, path)
    ids, rows, _, pos, _ = ImageChat(model)._prompt(PROMPT, files.images[:1], None)
    got = np.stack([rows[p] for p in sorted(rows)])
    assert rel_err(got, want) < 1e-4
    want_logits = ref.forward(files.text, qwen.REF_TEXT, ids, rows, pos)
    assert rel_err(model.prefill_logits(ids, hosted=rows, positions=pos), want_logits) < 1e-4


def test_qwen2_vl_mmproj_refuses_qwen25_keys(files, qwen2_vl, tmp_path):
    """Qwen2.5-VL's keys in a Qwen2-VL mmproj are refused naming the file."""
    vis = qwen2_vl[1]
    for meta, message in (({"clip.use_silu": True}, "clip.use_silu = True must be unset"),
                          ({V + "n_wa_pattern": 2}, "n_wa_pattern = 2 is set, but")):
        bad = tmp_path / "bad.gguf"
        write_mmproj(bad, vis, qwen2=True, meta=meta)
        with pytest.raises(CheckpointError, match=message) as exc:
            opened(bad, files)
        assert str(bad) in str(exc.value)
