"""Qwen2.5-VL's vision tower traced through poot.ops, one graph per padded window count.

An image of grid_h x grid_w patches comes in as the processor flattens it
(poot.models.vision.qwen25vl_preprocess): one row of channels x frames x patch x patch
values per patch, each merge x merge block of patches consecutive. The patch embedding (a
Conv3d whose stride is its kernel) is one contraction with the kernel read as a matrix.

The blocks see the patches window by window, as transformers reorders them: the merged
blocks grouped by windows of `window_units` blocks a side (the last row and column of
windows cut short). Here every window has room for its whole `window_units`^2 blocks (a
window cut short is padded), and the count of windows is padded up to one of a few sizes
per octave (`padded`), so the windowed blocks attend window by window in one batched
attention over [windows, heads, window patches], and every grid of one padded window count
runs the same graph: what depends on the grid comes in through slots, its rotary cos/sin
per patch (`vision.rope`) and which patches are padding (`vision.padding`), roles this
module owns and declares through the `poot_slot_roles` hook. The host lays the patches'
rows out so before the graph and takes the merged rows of the image back in its order
after it (`layout`): row copies. Padding patches are zeros that see only padding (within a
window, and in the full-attention blocks), so the image's patches never see them and their
rows, dropped at the end, stay finite. The graphs share one weight cache: the weights are
uploaded once.

Each block: RMSNorm, attention with one q|k|v projection (biases) and 2-D rotary positions
(the first half of each rotated pair turns by the patch's row, the second by its column,
over head_dim/4 frequencies each), non-causal within a window (or, in `full_blocks`, over
the whole image), the output projection, residual; RMSNorm, SwiGLU MLP with biases,
residual. The merger: RMSNorm, each merge x merge block of patches as one row, Linear, GELU
(erf), Linear to the language model's width. Tensor names are HF's under "vision."
(poot.models.vision.weights). Qwen2-VL's tower (`config.qwen2_vl`, every block full
attention) is the same but for LayerNorms with biases in place of the RMSNorms and an MLP
of fc1, QuickGELU and fc2 in place of the SwiGLU.
"""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from poot.dtypes import DType
from poot.errors import BindError
from poot.ir.graph import Graph
from poot.ir.types import SlotKind
from poot.models.vision.siglip import PIXELS, declarer, f32, layer_norm
from poot.plugin import hookimpl

OWNER = "poot.models.vision.qwen25vl"
#: slots: the rotary cos and sin of each patch [P, head_dim/2], and 1 for each padding
#: patch (0 for the image's) [P]
ROPE, PADDING = "vision.rope", "vision.padding"
COS, SIN = "vision.rope_cos", "vision.rope_sin"
#: compiled tower graphs an encoder keeps, one per padded window count
CACHED_GRAPHS = 8
#: QuickGELU's gain (Qwen2-VL): x * sigmoid(1.702 x), which is silu(1.702 x) / 1.702
QUICK_GELU = 1.702


def roles() -> list[SlotKind]:
    return [SlotKind(ROPE, DType.F32, None, None, owner=OWNER),
            SlotKind(PADDING, DType.I32, 0, 2, owner=OWNER)]


@hookimpl
def poot_slot_roles():
    return roles()
#: padded window counts: 2^k times one of these quarters (up to a quarter more work)
STEPS = (4, 5, 6, 7)


def padded(n: int) -> int:
    """The window count a graph of n windows is built for: the least 2^k x STEPS[i] / 4
    at or above n."""
    size = 1
    while True:
        for step in STEPS:
            m = -(-size * step // 4)
            if m >= n:
                return m
        size *= 2


def window_order(grid_h: int, grid_w: int, merge: int, units: int
                 ) -> tuple[np.ndarray, np.ndarray]:
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


def windows(config, grid_h: int, grid_w: int) -> int:
    """The padded window count of the graph a grid runs in."""
    mh, mw = grid_h // config.merge, grid_w // config.merge
    u = config.window_units
    return padded(-(-mh // u) * -(-mw // u))


def layout(config, grid_h: int, grid_w: int) -> dict[str, np.ndarray]:
    """A grid's slots and orders in the padded window layout of P = windows x window
    patches: COS / SIN [P, head_dim/2] (the padding's angle 0) and PADDING [P] (1 on the
    padding, 0 on the image's patches); `to` [N] (where each patch row of the processor's
    order goes) and `merged` [N/merge^2] (the graph's merged row of each of the image's
    blocks, in its order)."""
    units, window = window_order(grid_h, grid_w, config.merge, config.window_units)
    k, per = config.merge * config.merge, config.window_units ** 2
    first = np.searchsorted(window, window)                 # each window's first block
    slot = window * per + np.arange(len(units)) - first     # each block's place
    size = windows(config, grid_h, grid_w) * per * k
    to = np.empty(len(units) * k, np.int64)
    to[(units[:, None] * k + np.arange(k)).reshape(-1)] = \
        (slot[:, None] * k + np.arange(k)).reshape(-1)
    angles = np.zeros((size, config.head_dim // 2))
    angles[to] = rotary_angles(config, grid_h, grid_w)
    image = np.ones(size, np.int32)
    image[to] = 0
    merged = np.empty(len(units), np.int64)
    merged[units] = slot
    return {COS: np.cos(angles).astype(np.float32), SIN: np.sin(angles).astype(np.float32),
            PADDING: image, "to": to, "merged": merged}


def build_tower(config, weights, w: int) -> Graph:
    """The traced graph of an image laid out in `w` windows (`layout`): its patch rows
    [P, patch_values] through slot `vision.pixels`, its rotary cos and sin and padding
    through COS, SIN and PADDING, to the merged rows of the layout [P/merge^2, text_dim];
    `weights` a WeightSource of the "vision." names."""
    from poot import ops
    from poot.plugin import manager
    from poot.tracer import trace

    c = config
    d, hd, heads = c.hidden, c.head_dim, c.heads
    per = c.window_units ** 2 * c.merge * c.merge           # patches a window
    n = w * per

    def encode():
        declare = declarer(weights)

        def linear(x, name, bias=True):
            return ops.linear(x, declare(name + ".weight"),
                              f32(declare(name + ".bias")) if bias else None)

        def norm(x, name):
            if c.qwen2_vl:
                return layer_norm(x, declare(name + ".weight"), declare(name + ".bias"), c.eps)
            return ops.rms_norm(x, declare(name + ".weight"), c.eps)

        def mlp(h, p):
            if c.qwen2_vl:
                y = ops.silu(ops.mul(linear(h, p + "mlp.fc1"), QUICK_GELU))
                return linear(ops.mul(y, 1.0 / QUICK_GELU), p + "mlp.fc2")
            return linear(ops.swiglu(linear(h, p + "mlp.gate_proj"),
                                     linear(h, p + "mlp.up_proj")), p + "mlp.down_proj")

        manager()  # loads the plugins, this one included, which declare the roles
        x = ops.slot(SlotKind.get(PIXELS), (n, c.patch_values), PIXELS)
        kernel = ops.reshape(declare("vision.patch_embed.proj.weight"), (d, c.patch_values))
        x = ops.linear(x, kernel)
        cos, sin = (ops.slot(SlotKind.get(ROPE), (n, hd // 2), name) for name in (COS, SIN))
        where = ops.iota((n,), 0)
        image = ops.slot(SlotKind.get(PADDING), (n,), PADDING)

        def same(ids, lead):
            """Additive mask lead + [1, S, S] of ids lead + [S]: 0 where the query and
            the key are both the image's or both padding, -inf elsewhere."""
            m = ids.shape[-1]
            q, k = ops.reshape(ids, lead + (1, m, 1)), ops.reshape(ids, lead + (1, 1, m))
            return ops.select(ops.mul(ops.ge(q, k), ops.ge(k, q)), 0.0, float("-inf"),
                              dtype=DType.F32)

        whole = ops.reshape(same(image, ()), (n, n))                        # [P, P]
        windowed = same(ops.reshape(image, (w, per)), (w,))                 # [W, 1, S, S]

        def heads_first(y, full):
            """[P, H, hd] -> [H, P, hd] (full) or [W, H, S, hd]."""
            if full:
                return ops.transpose(y, (1, 0, 2))
            return ops.transpose(ops.reshape(y, (w, per, heads, hd)), (0, 2, 1, 3))

        def rows(o, full):
            """heads_first's inverse, flattened to [P, hidden]."""
            o = ops.transpose(o, (1, 0, 2) if full else (0, 2, 1, 3))
            return ops.reshape(o, (n, d))

        for i in range(c.layers):
            p = f"vision.blocks.{i}."
            full = i in c.full_blocks
            qkv = ops.reshape(linear(norm(x, p + "norm1"), p + "attn.qkv"), (n, 3, heads, hd))
            q, k, v = (ops.reshape(ops.slice_axis(qkv, 1, j, j + 1), (n, heads, hd))
                       for j in range(3))
            q, k = (ops.rope_partial(y, cos, sin, where, tokens_first=True) for y in (q, k))
            o = ops.attention_masked(*(heads_first(y, full) for y in (q, k, v)),
                                     whole if full else windowed, hd ** -0.5)
            x = ops.add(x, linear(rows(o, full), p + "attn.proj"))
            x = ops.add(x, mlp(norm(x, p + "norm2"), p))
        k2 = c.merge * c.merge
        y = ops.reshape(norm(x, "vision.merger.ln_q"), (n // k2, k2 * d))
        return linear(ops.gelu_erf(linear(y, "vision.merger.mlp.0")), "vision.merger.mlp.2")

    kind = "qwen2vl" if c.qwen2_vl else "qwen25vl"
    return trace(encode, name=f"{kind}_{w}windows_{c.layers}l")


class Qwen25Encoder:
    """The tower compiled for (backend, device) per padded window count (the last
    CACHED_GRAPHS kept, sharing one weight cache); `encode(patches, grid)` runs one
    image."""

    def __init__(self, config, weights, backend, device):
        self.config, self.weights, self.target = config, weights, (backend, device)
        self.executors: OrderedDict[int, object] = OrderedDict()
        self.cache = None                  # the weights, bound once for every graph
        #: seconds of the last image's run (its graph's setup apart), and of that setup
        self.seconds = 0.0
        self.setup_seconds = 0.0

    def _executor(self, w: int):
        import poot
        from poot.plan import plan
        from poot.runtime.executor import Executor

        if w in self.executors:
            self.executors.move_to_end(w)
            return self.executors[w]
        t0 = time.perf_counter()
        graph = build_tower(self.config, self.weights, w)
        ex = Executor(plan(poot.compile(graph, self.target), self.target),
                      self.weights.arrays, weights=self.cache)
        self.cache = ex.weights
        self.executors[w] = ex
        while len(self.executors) > CACHED_GRAPHS:
            self.executors.popitem(last=False)
        self.setup_seconds = time.perf_counter() - t0
        return ex

    def encode(self, patches: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
        """The merged rows [grid_h*grid_w/merge^2, text_dim] of one image's patch rows
        [grid_h*grid_w, patch_values] (the processor's order), in the image's order."""
        c, (gh, gw) = self.config, grid
        patches = np.asarray(patches, np.float32)
        if gh % c.merge or gw % c.merge or not gh * gw:
            raise BindError(f"an image grid of {gh} x {gw} patches does not divide into "
                            f"{c.merge} x {c.merge} merged blocks")
        if patches.shape != (gh * gw, c.patch_values):
            raise BindError(f"the vision tower takes {gh * gw} patch rows of "
                            f"{c.patch_values} values for a {gh} x {gw} grid, got "
                            f"{list(patches.shape)}")
        ex = self._executor(windows(c, gh, gw))
        slots = layout(c, gh, gw)
        rows = np.zeros((len(slots[PADDING]), c.patch_values), np.float32)
        rows[slots["to"]] = patches
        t0 = time.perf_counter()
        out = ex.step({PIXELS: rows, **{k: slots[k] for k in (COS, SIN, PADDING)}}).result
        self.seconds = time.perf_counter() - t0
        return np.asarray(out, np.float32)[slots["merged"]]
