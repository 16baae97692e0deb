"""An independent Qwen2.5-VL in float64 numpy over HF-named tensors (the "model.visual." /
"visual." prefixes dropped for the tower) and the config.json dicts: the image processor,
the vision tower, the 3-D rotary positions of a prompt, and the text model (a Qwen2 with
M-RoPE).

Shares no code with poot. Written from the architecture as transformers runs it: the
processor rounds each side to a multiple of 28 (scaling to stay within min/max pixels),
resizes with bicubic filtering, normalizes, and lists the patches of each 2 x 2 block
together, each patch's values over (channel, frame, y, x) with the image as both frames;
the tower embeds each patch with the Conv3d kernel, reorders the blocks window by window
(windows of window_size/28 blocks a side, padded with holes at the edges and the holes
skipped), attends within each window (over the whole image in the full-attention blocks)
with 2-D rotary positions (row over the first half of the frequencies, column over the
second), RMSNorm and SwiGLU, then merges each block (RMSNorm, Linear, GELU, Linear) and
undoes the window order. Qwen2-VL's tower (its norms with biases, fc1 and fc2 in its MLP)
takes LayerNorms and QuickGELU instead, every block listed as full attention. The text
model turns rotary pair i by the temporal, height or width position as mrope_section
assigns pair i.
"""
from __future__ import annotations

import math

import numpy as np

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711])


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def norm(x, w: dict, name: str, eps: float = 1e-6):
    """Qwen2.5-VL's RMSNorm, or Qwen2-VL's LayerNorm where `name` has a bias."""
    if name + ".bias" not in w:
        return rms_norm(x, w[name + ".weight"], eps)
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt(np.mean(xc * xc, -1, keepdims=True) + eps) * w[name + ".weight"] \
        + w[name + ".bias"]


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def softmax(s):
    s = np.exp(s - s.max(-1, keepdims=True))
    return s / s.sum(-1, keepdims=True)


def resized_size(h: int, w: int, lo: int, hi: int, f: int = 28) -> tuple[int, int]:
    hb, wb = round(h / f) * f, round(w / f) * f
    if hb * wb > hi:
        b = math.sqrt(h * w / hi)
        hb, wb = max(f, math.floor(h / b / f) * f), max(f, math.floor(w / b / f) * f)
    elif hb * wb < lo:
        b = math.sqrt(lo / (h * w))
        hb, wb = math.ceil(h * b / f) * f, math.ceil(w * b / f) * f
    return hb, wb


def patches(path, lo: int, hi: int, patch: int = 14, frames: int = 2, merge: int = 2):
    """(patch rows [N, 3*frames*patch*patch] float64, (grid_h, grid_w)) of an image file."""
    from PIL import Image

    img = Image.open(path).convert("RGB")
    h, w = resized_size(img.height, img.width, lo, hi, patch * merge)
    img = img.resize((w, h), Image.Resampling.BICUBIC)
    x = (np.asarray(img, np.float64) / 255 - CLIP_MEAN) / CLIP_STD        # [H, W, 3]
    gh, gw = h // patch, w // patch
    rows = []
    for bi in range(gh // merge):
        for bj in range(gw // merge):
            for r in range(merge):
                for c in range(merge):
                    y0, x0 = (bi * merge + r) * patch, (bj * merge + c) * patch
                    p = x[y0:y0 + patch, x0:x0 + patch].transpose(2, 0, 1)   # [3, p, p]
                    rows.append(np.stack([p] * frames, 1).reshape(-1))
    return np.stack(rows), (gh, gw)


def _windows(gh: int, gw: int, merge: int, units: int):
    """(block order, the blocks of each window in turn) as transformers pads and cuts."""
    mh, mw = gh // merge, gw // merge
    ph, pw = units - mh % units, units - mw % units
    idx = np.full((mh + ph, mw + pw), -1)
    idx[:mh, :mw] = np.arange(mh * mw).reshape(mh, mw)
    idx = idx.reshape((mh + ph) // units, units, (mw + pw) // units, units).transpose(0, 2, 1, 3)
    idx = idx.reshape(-1, units * units)
    groups = [g[g >= 0] for g in idx]
    return np.concatenate(groups), [len(g) for g in groups if len(g)]


def tower(w: dict, cfg: dict, x: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """The merged rows [N/4, out_hidden_size] of one image's patch rows."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    gh, gw = grid
    d, heads, m = cfg["hidden_size"], cfg["num_heads"], cfg.get("spatial_merge_size", 2)
    hd, k = d // heads, m * m
    units = cfg["window_size"] // m // cfg["patch_size"]
    h = np.asarray(x, np.float64) @ w["patch_embed.proj.weight"].reshape(d, -1).T
    # each patch's (row, column) in the processor's order
    r = np.arange(gh).reshape(gh // m, m, 1, 1) + np.zeros((1, 1, gw // m, m), int)
    c = np.arange(gw).reshape(1, 1, gw // m, m) + np.zeros((gh // m, m, 1, 1), int)
    rc = np.stack([r.transpose(0, 2, 1, 3).reshape(-1), c.transpose(0, 2, 1, 3).reshape(-1)], 1)
    inv = 1.0 / 10000.0 ** (np.arange(0, hd // 2, 2) / (hd // 2))
    ang = np.concatenate([np.outer(rc[:, 0], inv), np.outer(rc[:, 1], inv)], 1)
    ang = np.concatenate([ang, ang], 1)                                      # [N, hd]
    order, sizes = _windows(gh, gw, m, units)
    h = h.reshape(-1, k, d)[order].reshape(-1, d)
    ang = ang.reshape(-1, k, hd)[order].reshape(-1, hd)
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def turn(y):
        half = hd // 2
        return y * cos + np.concatenate([-y[..., half:], y[..., :half]], -1) * sin

    n = len(h)
    for i in range(cfg["depth"]):
        p = f"blocks.{i}."
        y = norm(h, w, p + "norm1")
        qkv = (y @ w[p + "attn.qkv.weight"].T + w[p + "attn.qkv.bias"]).reshape(n, 3, heads, hd)
        q, kk, v = turn(qkv[:, 0]), turn(qkv[:, 1]), qkv[:, 2]
        spans = [n] if i in cfg["fullatt_block_indexes"] else [s * k for s in sizes]
        o, at = np.zeros((n, heads, hd)), 0
        for s in spans:
            sl = slice(at, at + s)
            a = softmax(np.einsum("qhd,khd->hqk", q[sl], kk[sl]) / math.sqrt(hd))
            o[sl] = np.einsum("hqk,khd->qhd", a, v[sl])
            at += s
        h = h + o.reshape(n, d) @ w[p + "attn.proj.weight"].T + w[p + "attn.proj.bias"]
        y = norm(h, w, p + "norm2")

        def lin(z, name, p=p):
            return z @ w[f"{p}mlp.{name}.weight"].T + w[f"{p}mlp.{name}.bias"]

        if p + "mlp.fc1.weight" in w:                     # Qwen2-VL: QuickGELU
            z = lin(y, "fc1")
            h = h + lin(z / (1.0 + np.exp(-1.702 * z)), "fc2")
        else:
            h = h + lin(silu(lin(y, "gate_proj")) * lin(y, "up_proj"), "down_proj")
    y = norm(h, w, "merger.ln_q").reshape(n // k, k * d)
    y = gelu(y @ w["merger.mlp.0.weight"].T + w["merger.mlp.0.bias"])
    y = y @ w["merger.mlp.2.weight"].T + w["merger.mlp.2.bias"]
    return y[np.argsort(order)]


def rope_index(ids, image_token: int, grids, merge: int = 2) -> np.ndarray:
    """The three positions [3, T] of a prompt whose runs of image tokens are the images of
    `grids` (grid_h, grid_w) in turn."""
    ids = list(ids)
    out, t, nxt, g = [], 0, 0, iter(grids)
    while t < len(ids):
        if ids[t] != image_token:
            out.append([nxt] * 3)
            nxt, t = nxt + 1, t + 1
            continue
        gh, gw = next(g)
        h, w = gh // merge, gw // merge
        out += [[nxt, nxt + i, nxt + j] for i in range(h) for j in range(w)]
        nxt, t = nxt + max(h, w), t + h * w
    return np.array(out).T


def forward(w: dict, cfg: dict, ids, rows=None, pos3=None) -> np.ndarray:
    """Logits [T, vocab] of the text model (HF text names, a qwen2-style config dict with
    mrope_section) on `ids`, `rows` (position -> row) replacing those embeddings, each
    token's three positions `pos3` [3, T] (None: its index, thrice)."""
    w = {n: np.asarray(a, np.float64) for n, a in w.items()}
    t, eps = len(ids), cfg["rms_norm_eps"]
    dim, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = dim // heads
    pos3 = np.tile(np.arange(t), (3, 1)) if pos3 is None else np.asarray(pos3)
    section = np.repeat([0, 1, 2], cfg["mrope_section"])                    # pair -> section
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    ang = pos3[section].T * inv                                             # [T, hd/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]

    def turn(y):
        a, b = y[..., :hd // 2], y[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    for p, row in (rows or {}).items():
        x[p] = row
    causal = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n, h=h, p=p):
            y = h @ w[f"{p}self_attn.{name}.weight"].T + w[f"{p}self_attn.{name}.bias"]
            return y.reshape(t, n, hd)

        q, k, v = turn(proj("q_proj", heads)), turn(proj("k_proj", kv)), proj("v_proj", kv)
        k, v = np.repeat(k, heads // kv, 1), np.repeat(v, heads // kv, 1)
        a = softmax(np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + causal)
        x = x + np.einsum("hqk,khd->qhd", a, v).reshape(t, dim) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T
