"""Qwen2.5-VL's vision tower traced through poot.ops, one graph per image grid.

An image of grid_h x grid_w patches comes in as the processor flattens it
(poot.models.vision.qwen25vl_preprocess): one row of channels x frames x patch x patch
values per patch, each merge x merge block of patches consecutive. The patch embedding (a
Conv3d whose stride is its kernel) is one contraction with the kernel read as a matrix.
The blocks see the patches in window order: the blocks of merged units grouped by windows
of `window_units` units a side (the last row and column of windows cut short), as
transformers reorders them; the host permutes the patches' rows into that order before the
graph and the merged rows back after it (`window_order`), both cheap row copies.

A graph's kernels are compiled for its patch count, so the count is padded up to one of a
few sizes per octave (`padded`): grids of one padded count share their kernels, their
window and rotary tables being consts of each grid's graph. The padding patches (zeros)
form a window of their own and see only each other, so the image's patches never see them
and their rows, dropped at the end, stay finite.

Each block: RMSNorm, attention with one q|k|v projection (biases) and 2-D rotary positions
(the first half of each rotated pair turns by the patch's row, the second by its column,
over head_dim/4 frequencies each), non-causal within a window (or, in `full_blocks`, over
the whole image), the output projection, residual; RMSNorm, SwiGLU MLP with biases,
residual. The merger: RMSNorm, each merge x merge block of patches as one row, Linear, GELU
(erf), Linear to the language model's width. Tensor names are HF's under "vision."
(poot.models.vision.weights).
"""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from poot.dtypes import DType
from poot.errors import BindError
from poot.ir.graph import Graph
from poot.models.vision.siglip import PIXELS, declarer, f32

#: compiled tower graphs an encoder keeps, one per image grid
CACHED_GRIDS = 8
#: padded patch counts: 2^k times one of these (up to a quarter of the compute wasted)
STEPS = (4, 5, 6, 7)


def padded(n: int, unit: int) -> int:
    """The patch count a graph of n patches is built for: the least 2^k x STEPS[i] / 4 at
    or above n that `unit` (merge x merge) divides."""
    size = unit
    while True:
        for step in STEPS:
            m = -(-size * step // 4 // unit) * unit
            if m >= n:
                return m
        size *= 2


def window_order(grid_h: int, grid_w: int, merge: int, units: int) -> tuple[np.ndarray, np.ndarray]:
    """(merged units in window order, each one's window id): windows of `units` x `units`
    merged units row by row, the units of each row by row; a grid that does not divide
    ends in narrower windows."""
    mh, mw = grid_h // merge, grid_w // merge
    order, window = [], []
    starts = [(wr, wc) for wr in range(0, mh, units) for wc in range(0, mw, units)]
    for w, (wr, wc) in enumerate(starts):
        for r in range(wr, min(wr + units, mh)):
            for c in range(wc, min(wc + units, mw)):
                order.append(r * mw + c)
                window.append(w)
    return np.asarray(order, np.int64), np.asarray(window, np.int64)


def patch_rows(grid_h: int, grid_w: int, merge: int, units: np.ndarray) -> np.ndarray:
    """The patch rows (in the processor's order: merge x merge blocks consecutive) of the
    merged units `units`, each unit's patches in order."""
    k = merge * merge
    return (np.asarray(units)[:, None] * k + np.arange(k)).reshape(-1)


def rotary_angles(config, grid_h: int, grid_w: int) -> np.ndarray:
    """Angles [grid_h*grid_w, head_dim/2] (float64) of each patch in the processor's order:
    its row's over the first head_dim/4 frequencies, its column's over the rest."""
    m, q = config.merge, config.head_dim // 2
    inv = config.rope_base ** (-np.arange(0, q, 2, dtype=np.float64) / q)
    r = np.arange(grid_h).reshape(grid_h // m, m, 1, 1)
    c = np.arange(grid_w).reshape(1, 1, grid_w // m, m)
    rows = np.broadcast_to(r, (grid_h // m, m, grid_w // m, m)).transpose(0, 2, 1, 3)
    cols = np.broadcast_to(c, (grid_h // m, m, grid_w // m, m)).transpose(0, 2, 1, 3)
    return np.concatenate([np.outer(rows.reshape(-1), inv), np.outer(cols.reshape(-1), inv)], 1)


def tables(config, grid_h: int, grid_w: int) -> dict[str, np.ndarray]:
    """The host arrays a grid's graph binds, in window order and padded to P patches:
    rope.cos / rope.sin [P, head_dim/2] (the padding's angle 0), window [P] (each patch's
    window id, the padding's one more) and image [P] (0, the padding's 1); and the row
    orders `patches` [N] (patch rows into window order) and `merged` [N/merge^2] (the
    graph's first merged rows back into the image's order)."""
    units, window = window_order(grid_h, grid_w, config.merge, config.window_units)
    rows = patch_rows(grid_h, grid_w, config.merge, units)
    k = config.merge * config.merge
    n = len(rows)
    pad = padded(n, k) - n
    angles = np.pad(rotary_angles(config, grid_h, grid_w)[rows], ((0, pad), (0, 0)))
    ids = np.repeat(window, k)
    return {"rope.cos": np.cos(angles).astype(np.float32),
            "rope.sin": np.sin(angles).astype(np.float32),
            "window": np.pad(ids, (0, pad), constant_values=ids.max() + 1).astype(np.int32),
            "image": np.pad(np.zeros(n, np.int32), (0, pad), constant_values=1),
            "patches": rows, "merged": np.argsort(units)}


def _label(grid_h: int, grid_w: int, name: str) -> str:
    return f"qwen25vl.{grid_h}x{grid_w}.{name}"


def build_tower(config, weights, grid_h: int, grid_w: int) -> Graph:
    """The traced graph of one image of grid_h x grid_w patches, its patch rows in window
    order padded to P (`padded`) [P, patch_values] through slot `vision.pixels`, to its
    merged rows in window order, the padding's last [P/merge^2, text_dim]; `weights` a
    WeightSource of the "vision." names."""
    from poot import ops
    from poot.ir.types import SlotKind
    from poot.plugin import manager
    from poot.tracer import trace

    c = config
    d, hd, heads = c.hidden, c.head_dim, c.heads
    if grid_h % c.merge or grid_w % c.merge or not grid_h * grid_w:
        raise BindError(f"an image grid of {grid_h} x {grid_w} patches does not divide into "
                        f"{c.merge} x {c.merge} merged blocks")
    n = padded(grid_h * grid_w, c.merge * c.merge)

    def encode():
        declare = declarer(weights)

        def linear(x, name, bias=True):
            return ops.linear(x, declare(name + ".weight"),
                              f32(declare(name + ".bias")) if bias else None)

        def norm(x, name):
            return ops.rms_norm(x, declare(name + ".weight"), c.eps)

        manager()  # loads the plugins, which declare the pixels' role
        x = ops.slot(SlotKind.get(PIXELS), (n, c.patch_values), PIXELS)
        kernel = ops.reshape(declare("vision.patch_embed.proj.weight"), (d, c.patch_values))
        x = ops.linear(x, kernel)
        cos, sin = (ops.const((n, hd // 2), DType.F32, _label(grid_h, grid_w, k))
                    for k in ("rope.cos", "rope.sin"))
        where = ops.iota((n,), 0)

        def same(name):
            """Additive mask [P, P]: 0 where two patches have one id, -inf elsewhere."""
            ids = ops.const((n,), DType.I32, _label(grid_h, grid_w, name))
            q, k = ops.reshape(ids, (n, 1)), ops.reshape(ids, (1, n))
            return ops.select(ops.mul(ops.ge(q, k), ops.ge(k, q)), 0.0, float("-inf"),
                              dtype=DType.F32)

        windowed, whole = same("window"), same("image")

        def rotated(y):
            return ops.transpose(ops.rope_partial(y, cos, sin, where, tokens_first=True),
                                 (1, 0, 2))                                        # [H, N, hd]

        for i in range(c.layers):
            p = f"vision.blocks.{i}."
            qkv = ops.reshape(linear(norm(x, p + "norm1"), p + "attn.qkv"), (n, 3, heads, hd))
            q, k, v = (ops.reshape(ops.slice_axis(qkv, 1, j, j + 1), (n, heads, hd))
                       for j in range(3))
            mask = whole if i in c.full_blocks else windowed
            o = ops.attention_masked(rotated(q), rotated(k), ops.transpose(v, (1, 0, 2)),
                                     mask, hd ** -0.5)                              # [H, N, hd]
            x = ops.add(x, linear(ops.reshape(ops.transpose(o, (1, 0, 2)), (n, d)),
                                  p + "attn.proj"))
            h = norm(x, p + "norm2")
            x = ops.add(x, linear(ops.swiglu(linear(h, p + "mlp.gate_proj"),
                                             linear(h, p + "mlp.up_proj")), p + "mlp.down_proj"))
        k2 = c.merge * c.merge
        y = ops.reshape(norm(x, "vision.merger.ln_q"), (n // k2, k2 * d))
        return linear(ops.gelu_erf(linear(y, "vision.merger.mlp.0")), "vision.merger.mlp.2")

    return trace(encode, name=f"qwen25vl_{grid_h}x{grid_w}_{c.layers}l")


class Qwen25Encoder:
    """The tower compiled for (backend, device) per image grid (the last CACHED_GRIDS
    kept); `encode(patches, grid)` runs one image."""

    def __init__(self, config, weights, backend, device):
        self.config, self.weights, self.target = config, weights, (backend, device)
        self.executors: OrderedDict[tuple[int, int], object] = OrderedDict()
        self.orders: dict[tuple[int, int], dict] = {}
        #: seconds of the last image's run (its grid's setup apart), and of that setup
        self.seconds = 0.0
        self.setup_seconds = 0.0

    def _executor(self, grid: tuple[int, int]):
        import poot
        from poot.plan import plan
        from poot.runtime.executor import Executor

        if grid in self.executors:
            self.executors.move_to_end(grid)
            return self.executors[grid]
        t0 = time.perf_counter()
        graph = build_tower(self.config, self.weights, *grid)
        host = tables(self.config, *grid)
        consts = {**self.weights.arrays, **{_label(*grid, k): host[k] for k in
                                            ("rope.cos", "rope.sin", "window", "image")}}
        ex = Executor(plan(poot.compile(graph, self.target), self.target), consts)
        self.executors[grid] = ex
        self.orders[grid] = {k: host[k] for k in ("patches", "merged")}
        while len(self.executors) > CACHED_GRIDS:
            old, _ = self.executors.popitem(last=False)
            self.orders.pop(old, None)
        self.setup_seconds = time.perf_counter() - t0
        return ex

    def encode(self, patches: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
        """The merged rows [grid_h*grid_w/merge^2, text_dim] of one image's patch rows
        [grid_h*grid_w, patch_values] (the processor's order), in the image's order."""
        c, (gh, gw) = self.config, grid
        patches = np.asarray(patches, np.float32)
        if patches.shape != (gh * gw, c.patch_values):
            raise BindError(f"the vision tower takes {gh * gw} patch rows of "
                            f"{c.patch_values} values for a {gh} x {gw} grid, got "
                            f"{list(patches.shape)}")
        ex = self._executor((gh, gw))
        order = self.orders[(gh, gw)]
        rows = np.zeros((padded(gh * gw, c.merge * c.merge), c.patch_values), np.float32)
        rows[:gh * gw] = patches[order["patches"]]
        t0 = time.perf_counter()
        out = ex.step({PIXELS: rows}).result
        self.seconds = time.perf_counter() - t0
        return np.asarray(out, np.float32)[order["merged"]]
