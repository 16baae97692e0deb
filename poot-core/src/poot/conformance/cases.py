"""The cases of the suite: every op x every dtype its type rule admits x a spread of shapes.

A Case is a small graph whose inputs are slots (see roles.py), the domains its
inputs are drawn from, and how its result is compared with the oracle: exactly
(bytes) for integer, bit, index, movement, Select, Cast, Gather/Scatter and
ArgTopK results, else by NMSE under a per-op, per-dtype threshold.

Shapes are chosen to catch tiling bugs while keeping the run short: size 1, odd
sizes, sizes that are not a multiple of any power-of-two tile (257, 67, 33),
numpy broadcasting, leading batch dims, a middle reduction axis.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from poot.codegen.cases import scan_rotate, silu_mul
from poot.conformance.domains import UNARY as UNARY_DOMAIN
from poot.conformance.inputs import Arg, nan_payload
from poot.conformance.roles import input_role
from poot.dtypes import DType
from poot.errors import IRError
from poot.ir import Builder, region
from poot.ir import ops as O
from poot.ir.graph import Graph
from poot.ir.ops.base import ARITH, FLOATS, INTS
from poot.ir.types import TensorType

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
WIDE_FLOATS = (F32, F16, BF16)

#: unit roundoff of each float dtype (the NMSE threshold scales with its square)
EPS = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8, DType.F8E4M3: 2.0**-4,
       DType.F8E5M2: 2.0**-3, DType.F8E8M0: 1.0, DType.F4E2M1: 2.0**-2}
#: error growth allowed per kind of op, in units of the dtype's roundoff
#: ("gated": two contractions' results meeting in one product, as a GatedContraction's
#: halves do: their errors add, twice a contraction's)
GROWTH = {"basic": 4, "div": 16, "transcendental": 128, "reduce": 256, "compose": 1024,
          "gated": 2048}
NMSE_CAP = 1e-3   # a looser threshold no longer tells a wrong kernel from rounding


@dataclass
class Case:
    """One check: `graph` (inputs are slots, in `args` order), compared with the oracle."""

    id: str
    key: str                       # the op key under test
    dtype: str                     # its deciding dtype or packed format
    graph: Graph
    args: tuple[Arg, ...]
    exact: bool
    tol: float = 0.0
    flops: int = 0                 # for the perf mode (0: report bytes moved)
    fixed: dict[int, np.ndarray] = field(default_factory=dict)  # inputs with set values

    @property
    def bytes_moved(self) -> int:
        ins = sum(a.type.nbytes for a in self.args)
        return ins + self.graph.type_of(self.graph.result()).nbytes


def threshold(growth: str, dtype: DType) -> float:
    return min((GROWTH[growth] * EPS.get(dtype, 2.0**-24)) ** 2, NMSE_CAP)


def build(name: str, args: list[Arg], fn: Callable) -> Graph:
    """A graph whose inputs are slots of `args`' types and whose result is fn(b, *refs)."""
    b = Builder(name, compiler=True)
    refs = [b.slot(input_role(a.type.dtype), a.type.shape, f"x{i}") for i, a in enumerate(args)]
    b.result(fn(b, *refs))
    return b.finish()


def case(id: str, key: str, dtype, args: list[Arg], fn: Callable, exact: bool,
         growth: str = "basic", flops: int = 0, fixed=None) -> Case | None:
    """A Case, or None when the op's type rule refuses these operand types."""
    try:
        g = build(id, args, fn)
    except IRError:
        return None
    out = g.type_of(g.result())
    exact = exact or out.dtype.is_int
    tol = 0.0 if exact else threshold(growth, dtype if isinstance(dtype, DType) else F32)
    return Case(id, key, str(dtype), g, tuple(args), exact, tol, flops, dict(fixed or {}))


def one(op: O.OpKind) -> Callable:
    return lambda b, *xs: b.eqn(op, *xs)


def shape_id(*shapes) -> str:
    return "_".join("x".join(map(str, s)) or "scalar" for s in shapes)


def T(shape, dtype) -> TensorType:
    return TensorType(tuple(shape), dtype)


# -- elementwise ---------------------------------------------------------------------------
UNARY_GROWTH = {O.UnaryOp.Neg: "basic", O.UnaryOp.Sqrt: "div", O.UnaryOp.Recip: "div"}
BINARY_GROWTH = {O.BinaryOp.Div: "div"}
#: IEEE defines these results exactly (round to nearest even); f32 holds every product and
#: sum of two 16-bit floats closely enough that one rounding gives the same bits, so any
#: correct kernel matches bit for bit, and one that rounds another way does not
CORRECTLY_ROUNDED = (O.BinaryOp.Add, O.BinaryOp.Sub, O.BinaryOp.Mul)
ELEMENTWISE_SHAPES = [((1,), (1,)), ((3, 257), (3, 257)), ((5, 1, 33), (4, 33))]


def unary_cases() -> Iterator[Case]:
    for u in O.UnaryOp:
        dom = UNARY_DOMAIN.get(u, "special")
        for d in DType:
            for shape in ((1,), (3, 257)):
                yield case(f"Unary.{u.name}-{d}-{shape_id(shape)}", f"Unary.{u.name}", d,
                           [Arg(T(shape, d), dom if d.is_float or dom == "words" else "any")],
                           one(O.Unary(u)), exact=u is O.UnaryOp.Neg,
                           growth=UNARY_GROWTH.get(u, "transcendental"))


def binary_cases() -> Iterator[Case]:
    for bop in O.BinaryOp:
        for d in DType:
            for sa, sb in ELEMENTWISE_SHAPES:
                a_dom = "words" if bop.bitwise else ("special" if d.is_float else "any")
                b_dom = {O.BinaryOp.Shl: "shift", O.BinaryOp.Shr: "shift"}.get(
                    bop, "words" if bop.bitwise else ("away" if d.is_float else "any"))
                yield case(f"Binary.{bop.name}-{d}-{shape_id(sa, sb)}", f"Binary.{bop.name}", d,
                           [Arg(T(sa, d), a_dom), Arg(T(sb, d), b_dom)], one(O.Binary(bop)),
                           exact=bop in CORRECTLY_ROUNDED and d in WIDE_FLOATS,
                           growth=BINARY_GROWTH.get(bop, "basic"))


def select_cases() -> Iterator[Case]:
    shapes = [((1,), (1,), (1,)), ((3, 257), (3, 257), (3, 257)), ((4, 1), (1, 33), (4, 33))]
    for d in DType:
        for sc, st, sf in shapes:
            yield case(f"Select-{d}-{shape_id(sc, st, sf)}", "Select", d,
                       [Arg(T(sc, I32), ("index", 2)), Arg(T(st, d), "special"),
                        Arg(T(sf, d), "special")], one(O.Select()), exact=True)
    for d in FLOATS:  # NaN payloads and Infs in both branches move bit for bit
        yield select_passthrough(d)


def select_passthrough(d: DType) -> Case:
    n = 8
    cond = np.array([1, 0, 1, 0, 1, 0, 0, 1], np.int32)
    t = np.ones(n, np.float32).astype(d.numpy)
    f = np.ones(n, np.float32).astype(d.numpy) * 2 if d is not DType.F8E8M0 else t * 2
    nan = nan_payload(d)
    t[[1, 2]] = nan            # a NaN unselected (1) and selected (2)
    f[[0, 3]] = nan[::-1]
    if d in (F32, F16, BF16, DType.F8E5M2):
        t[[3, 4]] = np.array([np.inf, -np.inf], np.float32)
        f[[5, 4]] = np.array([-np.inf, np.inf], np.float32)
    args = [Arg(T((n,), I32)), Arg(T((n,), d)), Arg(T((n,), d))]
    return case(f"Select-{d}-nan_inf_passthrough", "Select", d, args, one(O.Select()),
                exact=True, fixed={0: cond, 1: t, 2: f})


def cast_cases() -> Iterator[Case]:
    for src in DType:
        for to in DType:
            dom = "int" if to.is_int and src.is_float else "small"
            yield case(f"Cast-{src}-to-{to}-7x37", "Cast", src, [Arg(T((7, 37), src), dom)],
                       one(O.Cast(to)), exact=True)


# -- movement and data ------------------------------------------------------------------------
def shape_cases() -> Iterator[Case]:
    for d in DType:
        specs = [
            ("Broadcast", [(3, 1, 5)], O.Broadcast((2, 3, 4, 5))),
            ("Reshape", [(6, 35)], O.Reshape((5, 42))),
            ("Transpose", [(3, 5, 7)], O.Transpose((2, 0, 1))),
            ("Slice", [(5, 67)], O.Slice(1, 3, 50)),
            ("Concat", [(3, 5), (3, 7), (3, 1)], O.Concat(1)),
        ]
        for key, shapes, op in specs:
            yield case(f"{key}-{d}-{shape_id(*shapes)}", key, d,
                       [Arg(T(s, d)) for s in shapes], one(op), exact=True)


def data_cases() -> Iterator[Case]:
    for d in DType:
        yield case(f"Gather-{d}-37x9-axis0", "Gather", d,
                   [Arg(T((37, 9), d)), Arg(T((5,), I32), ("index", 37))], one(O.Gather(0)),
                   exact=True)
        yield case(f"Gather-{d}-4x37-axis1", "Gather", d,
                   [Arg(T((4, 37), d)), Arg(T((2, 3), I32), ("index", 37))], one(O.Gather(1)),
                   exact=True)
        yield case(f"ScatterUpdate-{d}-11x6", "ScatterUpdate", d,
                   [Arg(T((11, 6), d)), Arg(T((5, 6), d)), Arg(T((5,), I32), ("slots", 11))],
                   one(O.ScatterUpdate()), exact=True)
        for where, idx in (("4", 4), ("clamped", 8)):
            yield case(f"DynamicUpdateSlice-{d}-9x5-at-{where}", "DynamicUpdateSlice", d,
                       [Arg(T((9, 5), d)), Arg(T((2, 5), d)), Arg(T((1,), I32))],
                       one(O.DynamicUpdateSlice(0)), exact=True,
                       fixed={2: np.array([idx], np.int32)})
        yield case(f"ArgTopK-{d}-5x37-k4", "ArgTopK", d, [Arg(T((5, 37), d))],
                   one(O.ArgTopK(4)), exact=True)
        yield case(f"ArgTopK-{d}-2x40000-k1", "ArgTopK", d, [Arg(T((2, 40000), d))],
                   one(O.ArgTopK(1)), exact=True)


def reduce_cases() -> Iterator[Case]:
    shapes = [((1, 1), -1), ((5, 257), -1), ((6, 7, 9), 1), ((33, 3), 0)]
    for r in O.ReduceOp:
        for d in ARITH:
            for shape, axis in shapes:
                keep = axis == 1
                yield case(f"Reduce.{r.name}-{d}-{shape_id(shape)}-axis{axis}",
                           f"Reduce.{r.name}", d, [Arg(T(shape, d))],
                           one(O.Reduce(r, axis, keep)), exact=r is O.ReduceOp.Max,
                           growth="reduce")


# -- contractions ------------------------------------------------------------------------------
def matmul_cases() -> Iterator[Case]:
    shapes = [((1, 67), (67, 33)), ((7, 65), (65, 19)), ((2, 1, 5, 9), (3, 9, 4)),
              # tile-sized: tensor-core schedules (16-bit floats), ragged edges, batches
              ((130, 72), (72, 136)), ((2, 96, 40), (40, 48))]
    for d in FLOATS + (I32,):
        for sa, sb in shapes:
            flops = 2 * math.prod(np.broadcast_shapes(sa[:-2], sb[:-2])) * sa[-2] * sa[-1] * sb[-1]
            yield case(f"MatMul-{d}-{shape_id(sa, sb)}", "MatMul", d,
                       [Arg(T(sa, d)), Arg(T(sb, d))], one(O.MatMul()), exact=False,
                       growth="compose", flops=flops)
        yield case(f"IndexedMatMul-{d}-5x17-3x17x9", "IndexedMatMul", d,
                   [Arg(T((5, 17), d)), Arg(T((3, 17, 9), d)), Arg(T((5,), I32), ("index", 3))],
                   one(O.IndexedMatMul()), exact=False, growth="compose", flops=2 * 5 * 17 * 9)


#: realistic contraction depths (a 4096 model width, a 14336 FFN width) and one that is a
#: multiple of no tile; few rows and columns keep them cheap
LONG_K = (4096, 14336, 4099)
#: one packed format of each decode family (a block, a k-quant super-block, an int group,
#: a microscaled float): a GPU backend compiles a kernel per format and K, so not all
LONG_K_FORMATS = ("gguf:Q8_0", "gguf:Q4_K", "gptq:int4", "mxfp4")


def long_k_cases() -> Iterator[Case]:
    """Contractions over realistic K, dense and packed: a kernel wrong only past some K
    (a dropped tail, an accumulator that overflows a tile loop) fails here."""
    from poot.formats import PackedWeight, formats

    for d in WIDE_FLOATS:
        for k in LONG_K:
            yield case(f"MatMul-{d}-longK-2x{k}x3", "MatMul", d,
                       [Arg(T((2, k), d)), Arg(T((k, 3), d))], one(O.MatMul()), exact=False,
                       growth="compose", flops=2 * 2 * k * 3)
    for w in (F32, BF16, F16, U32):
        for k in LONG_K:
            k = k + k % 2 if w is U32 else k          # two f16 per u32 word: K even
            ws = (3, k // 2) if w is U32 else (3, k)
            yield case(f"DenseContraction-{w}-longK-2x{k}-3x{k}", "DenseContraction", w,
                       [Arg(T((2, k), F32)), Arg(T(ws, w), _f16_words(ws) if w is U32 else "any")],
                       one(O.DenseContraction()), exact=False, growth="compose",
                       flops=2 * 2 * k * 3)
    for name in [f for f in LONG_K_FORMATS if f in formats()]:
        for k in (14336, 4352):                       # 4352 = 17 blocks of 256
            w = PackedWeight(name, (8, k))
            srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
            yield case(f"PackedContraction-{name}-longK-2x{k}", "PackedContraction", name,
                       [Arg(T((2, k), F32))] + srcs, one(O.PackedContraction(w)), exact=False,
                       growth="compose", flops=2 * 2 * k * 8)
    # one row, as in decode (the cases above have two): a GEMV wrong only for one row at
    # long K (a whole trip's staging, a ring of copies) fails here
    for name, k in (("gguf:Q4_0", 3072), ("gguf:Q4_K", 14336)):
        if name not in formats():
            continue
        w = PackedWeight(name, (24, k))
        srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
        yield case(f"PackedContraction-{name}-longK-1x{k}", "PackedContraction", name,
                   [Arg(T((1, k), F32))] + srcs, one(O.PackedContraction(w)), exact=False,
                   growth="compose", flops=2 * k * 24)
        yield _normed_case(w, 1, srcs)


#: packed formats of the decode-batch cases: 32-element blocks with and without an offset,
#: and 256-element superblocks
BATCH_FORMATS = ("gguf:Q4_1", "gguf:Q8_0", "gguf:Q4_K")


def decode_batch_cases() -> Iterator[Case]:
    """Contractions of a decode batch (12 rows: the rows GEMV, gated too) and of prefill
    chunks (40 and 80 rows: tensor cores on cuda), with K past whole loop trips (a tail)
    where the weight allows, and N odd (one column per group) and even; K = 1200 long
    enough for the rows GEMV to split a row tile's K over 4 warps (with a tail)."""
    from poot.formats import PackedWeight, formats

    for rows in (12, 40):
        for w, n, k in ((BF16, 19, 200), (U32, 20, 200), (F32, 8, 72), (F32, 19, 1200)):
            ws = (n, k // 2) if w is U32 else (n, k)
            yield case(f"DenseContraction-{w}-batch-{rows}x{k}-{n}x{k}", "DenseContraction",
                       w, [Arg(T((rows, k), F32)),
                           Arg(T(ws, w), _f16_words(ws) if w is U32 else "any")],
                       one(O.DenseContraction()), exact=False, growth="compose",
                       flops=2 * rows * k * n)
    for name in [f for f in BATCH_FORMATS if f in formats()]:
        k = 256 if name.endswith("_K") else 288
        w = PackedWeight(name, (8, k))
        srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
        for rows in (12, 40, 80):
            yield case(f"PackedContraction-{name}-batch-{rows}x{k}", "PackedContraction",
                       name, [Arg(T((rows, k), F32))] + srcs, one(O.PackedContraction(w)),
                       exact=False, growth="compose", flops=2 * rows * k * 8)
        # a speculative verification's gate|up: the rows GEMV joins each pair of columns
        yield _gated_case(O.PackedContraction(w), name, 12, srcs, 8, k)


def _normed_case(w, rows: int, srcs) -> Case | None:
    """rms_norm(x, g) of `rows` rows into packed weight `w`: one row takes the norm
    inside the integer GEMV where a target can, longer K splits and runs it apart."""
    n, k = w.shape
    return case(f"NormedPackedContraction-{w.format}-{rows}x{k}", "NormedPackedContraction",
                w.format, [Arg(T((rows, k), F32)), Arg(T((k,), F32))] + srcs,
                one(O.NormedPackedContraction(w, 1e-5)), exact=False, growth="compose",
                flops=2 * rows * k * n)


def _prologue_case(head, key, rows: int, weight: list, n: int) -> Case:
    """`head` contracting swiglu(g, u) of `rows` rows, g and u 256 long (a decode step's
    down projection reading the SwiGLU of its gate and up)."""
    a = T((rows, 256), F32)
    op = O.ContractionPrologue(head, 1 + len(weight), region([a, a], silu_mul))
    return case(f"ContractionPrologue-{head.name}-{key}-{rows}x256", "ContractionPrologue",
                F32, [Arg(a), *weight, Arg(a)], one(op), exact=False, growth="compose",
                flops=2 * rows * 256 * n)


def _gated_case(head, key, rows: int, weight: list, n: int, k: int) -> Case:
    """swiglu of the two halves of `head`'s [rows, n] result (a stacked gate and up
    projection of K = k): a GEMV's workgroup joins each pair, longer batches after it."""
    half = T((rows, n // 2), F32)
    op = O.GatedContraction(head, 1 + len(weight), region([half, half], silu_mul))
    return case(f"GatedContraction-{head.name}-{key}-{rows}x{k}", "GatedContraction", F32,
                [Arg(T((rows, k), F32)), *weight], one(op), exact=False, growth="gated",
                flops=2 * rows * k * n)


def _f16_words(shape) -> tuple:
    """f16 values held two to a u32 word (the dense:f16words layout), not random words,
    whose halves would hold NaN and Inf patterns."""
    from poot.formats import PackedWeight

    return ("packed", PackedWeight("dense:f16words", (shape[0], 2 * shape[1])), 0)


def dense_cases() -> Iterator[Case]:
    for w in (F32, BF16, F16, U32):
        ws = (19, 32) if w is U32 else (19, 64)
        yield case(f"DenseContraction-{w}-3x64-19x64", "DenseContraction", w,
                   [Arg(T((3, 64), F32)), Arg(T(ws, w), _f16_words(ws) if w is U32 else "any")],
                   one(O.DenseContraction()), exact=False, growth="compose",
                   flops=2 * 3 * 64 * 19)
    # rms_norm into a dense weight: one row (a decode GEMV takes the norm in), three, and
    # a K long enough to split each dot product over warps, with a tail
    for w, rows, k in ((BF16, 1, 64), (BF16, 3, 64), (BF16, 1, 2088), (F16, 1, 64),
                       (U32, 1, 64), (F32, 2, 64)):
        ws = (19, k // 2) if w is U32 else (19, k)
        yield case(f"NormedDenseContraction-{w}-{rows}x{k}-19x{k}", "NormedDenseContraction",
                   w, [Arg(T((rows, k), F32)),
                       Arg(T(ws, w), _f16_words(ws) if w is U32 else "any"),
                       Arg(T((k,), F32))],
                   one(O.NormedDenseContraction(1e-5)), exact=False, growth="compose",
                   flops=2 * rows * k * 19)
    yield case("DenseRowGather-bf16-37x16", "DenseRowGather", BF16,
               [Arg(T((37, 16), BF16)), Arg(T((5,), I32), ("index", 37))],
               one(O.DenseRowGather()), exact=True)
    for rows in (1, 2):
        yield _prologue_case(O.DenseContraction(), "bf16", rows, [Arg(T((19, 256), BF16))], 19)
    for rows in (1, 2, 12):
        yield _gated_case(O.DenseContraction(), "bf16", rows, [Arg(T((38, 256), BF16))], 38,
                          256)
    yield case("GroupedDenseContraction-bf16-2x3x16", "GroupedDenseContraction", BF16,
               [Arg(T((2, 3, 16), F32)), Arg(T((10, 16), BF16))],
               one(O.GroupedDenseContraction(2)), exact=False, growth="compose",
               flops=2 * 2 * 3 * 16 * 5)


def packed_cases() -> Iterator[Case]:
    """Every packed format registered by an installed format plugin, in each packed op."""
    from poot.formats import PackedWeight, formats

    for name in sorted(formats()):
        w = PackedWeight(name, (8, 256))
        srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
        yield case(f"PackedDequant-{name}-8x256", "PackedDequant", name, srcs,
                   one(O.PackedDequant(w)), exact=False, growth="basic")
        yield case(f"PackedContraction-{name}-3x256", "PackedContraction", name,
                   [Arg(T((3, 256), F32))] + srcs, one(O.PackedContraction(w)), exact=False,
                   growth="compose", flops=2 * 3 * 256 * 8)
        yield _normed_case(w, 1, srcs)
        yield _normed_case(w, 3, srcs)
        for rows in (1, 3):
            yield _prologue_case(O.PackedContraction(w), name, rows, srcs, 8)
            yield _gated_case(O.PackedContraction(w), name, rows, srcs, 8, 256)
        yield case(f"PackedRowGather-{name}-5", "PackedRowGather", name,
                   [Arg(T((5,), I32), ("index", 8))] + srcs, one(O.PackedRowGather(w)),
                   exact=False, growth="basic")
        yield case(f"IndexedPackedContraction-{name}-4x256-2experts",
                   "IndexedPackedContraction", name,
                   [Arg(T((4, 256), F32)), Arg(T((4,), I32), ("index", 2))] + srcs,
                   one(O.IndexedPackedContraction(w, 2)), exact=False, growth="compose",
                   flops=2 * 4 * 256 * 4)


# -- composites --------------------------------------------------------------------------------
def _pointwise_body(b, x, y):
    e = b.eqn(O.Unary(O.UnaryOp.Exp), x)
    p = b.eqn(O.Binary(O.BinaryOp.Mul), x, y)
    return b.eqn(O.Binary(O.BinaryOp.Max), b.eqn(O.Binary(O.BinaryOp.Add), p, e), y)


def _softmax_body(b, x):
    m = b.eqn(O.Reduce(O.ReduceOp.Max, -1, True), x)
    ex = b.eqn(O.Unary(O.UnaryOp.Exp), b.eqn(O.Binary(O.BinaryOp.Sub), x, m))
    return b.eqn(O.Binary(O.BinaryOp.Div), ex, b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), ex))


def _rms_body(b, x, w):
    d = x.type.dtype
    ss = b.eqn(O.Reduce(O.ReduceOp.Sum, -1, True), b.eqn(O.Binary(O.BinaryOp.Mul), x, x))
    ms = b.eqn(O.Binary(O.BinaryOp.Mul), ss, b.lit(1.0 / x.type.shape[-1], d))
    den = b.eqn(O.Unary(O.UnaryOp.Sqrt), b.eqn(O.Binary(O.BinaryOp.Add), ms, b.lit(1e-5, d)))
    return b.eqn(O.Binary(O.BinaryOp.Mul), b.eqn(O.Binary(O.BinaryOp.Div), x, den), w)


def _epilogue_body(b, h, bias):
    return b.eqn(O.Unary(O.UnaryOp.Tanh), b.eqn(O.Binary(O.BinaryOp.Add), h, bias))


def region_cases() -> Iterator[Case]:
    for d in WIDE_FLOATS:
        x, y = T((3, 257), d), T((257,), d)
        body = region([x, y], _pointwise_body)
        yield case(f"Fused-{d}-3x257", "Fused", d, [Arg(x, "small"), Arg(y)],
                   one(O.Fused(body)), exact=False, growth="transcendental")
        r = T((5, 67), d)
        yield case(f"FusedRow-softmax-{d}-5x67", "FusedRow", d, [Arg(r)],
                   one(O.FusedRow(region([r], _softmax_body), -1)), exact=False,
                   growth="compose")
        yield case(f"FusedRow-rmsnorm-{d}-5x67", "FusedRow", d, [Arg(r), Arg(T((67,), d))],
                   one(O.FusedRow(region([r, T((67,), d)], _rms_body), -1)), exact=False,
                   growth="compose")
        for m, k, n in ((7, 33, 19), (130, 72, 40)):      # FMA tiles; tensor-core tiles
            h = T((m, n), d)
            body = region([h, T((n,), d)], _epilogue_body)
            yield case(f"ContractionEpilogue-MatMul-{d}-{m}x{k}x{n}", "ContractionEpilogue", d,
                       [Arg(T((m, k), d)), Arg(T((k, n), d)), Arg(T((n,), d))],
                       one(O.ContractionEpilogue(O.MatMul(), 2, body)), exact=False,
                       growth="compose", flops=2 * m * k * n)
    h = T((3, 19), F32)
    body = region([h, T((19,), F32)], _epilogue_body)
    yield case("ContractionEpilogue-DenseContraction-bf16-3x64x19", "ContractionEpilogue", F32,
               [Arg(T((3, 64), F32)), Arg(T((19, 64), BF16)), Arg(T((19,), F32))],
               one(O.ContractionEpilogue(O.DenseContraction(), 2, body)), exact=False,
               growth="compose", flops=2 * 3 * 64 * 19)


def causal_mask(t: int, s: int, d: DType) -> np.ndarray:
    """The additive causal mask of the last t of s positions: 0 where a query may look,
    -inf where it may not (every row keeps at least one key)."""
    allowed = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
    return np.where(allowed, 0.0, -np.inf).astype(np.float32).astype(d.numpy)


def attention_cases() -> Iterator[Case]:
    for d in WIDE_FLOATS:
        q, k = T((4, 3, 16), d), T((2, 11, 16), d)
        yield case(f"Attention-{d}-gqa4x2-t3-s11", "Attention", d,
                   [Arg(q), Arg(k), Arg(k), Arg(T((3, 11), d), "small")],
                   one(O.Attention(0.25)), exact=False, growth="compose",
                   flops=4 * 4 * 3 * 11 * 16)
        qd, kd = T((2, 4, 1, 16), d), T((2, 2, 37, 16), d)
        yield case(f"Attention-{d}-decode-b2-gqa4x2-s37", "Attention", d,
                   [Arg(qd), Arg(kd), Arg(kd), Arg(T((1, 37), d), "small")],
                   one(O.Attention(0.25)), exact=False, growth="compose",
                   flops=2 * 2 * 4 * 37 * 16 * 2)
        yield case(f"Attention-{d}-causal-inf-mask-t3-s11", "Attention", d,
                   [Arg(q), Arg(k), Arg(k), Arg(T((3, 11), d))], one(O.Attention(0.25)),
                   exact=False, growth="compose", fixed={3: causal_mask(3, 11, d)})
        # a step's rows token by token [T, Hq, D], causal over a cache of 11
        yield case(f"TokenMajorAttention-{d}-gqa4x2-t3-s11", "TokenMajorAttention", d,
                   [Arg(T((3, 4, 16), d)), Arg(k), Arg(k), Arg(T((3, 11), d))],
                   one(O.TokenMajorAttention(0.25)), exact=False, growth="compose",
                   fixed={3: causal_mask(3, 11, d)}, flops=4 * 4 * 3 * 11 * 16)
        yield case(f"Rope-{d}-3x4x16-rot12", "Rope", d,
                   [Arg(T((3, 4, 16), d)), Arg(T((3, 1, 6), d)), Arg(T((3, 1, 6), d))],
                   one(O.Rope(12)), exact=False, growth="basic")
        yield case(f"RopeScatter-{d}-p11-2x3x2x16-rot12", "RopeScatter", d,
                   [Arg(T((11, 2, 16), d)), Arg(T((2, 3, 2, 16), d)), Arg(T((2, 3, 1, 6), d)),
                    Arg(T((2, 3, 1, 6), d)), Arg(T((6,), I32), ("slots", 11))],
                   one(O.RopeScatter(12)), exact=False, growth="basic")
        # one token's keys at 5; two rows past the end, the index clamped as DUS's
        for t, where, idx in ((1, "5", 5), (2, "clamped", 12)):
            yield case(f"RopeUpdateSlice-{d}-3x10x16-{t}x1x3x16-rot12-at-{where}",
                       "RopeUpdateSlice", d,
                       [Arg(T((3, 10, 16), d)), Arg(T((t, 1, 3, 16), d)),
                        Arg(T((t, 1, 1, 6), d)), Arg(T((t, 1, 1, 6), d)), Arg(T((1,), I32))],
                       one(O.RopeUpdateSlice(12, 1)), exact=False, growth="basic",
                       fixed={4: np.array([idx], np.int32)})
    # a step of 4 tokens' keys [T, Hkv, D] written head by head into the cache [Hkv, S, D]
    for d in WIDE_FLOATS:
        yield case(f"RopeUpdateSlice-{d}-3x10x16-1x4x3x16-rot12-tokens-first",
                   "RopeUpdateSlice", d,
                   [Arg(T((3, 10, 16), d)), Arg(T((1, 4, 3, 16), d)),
                    Arg(T((1, 4, 1, 6), d)), Arg(T((1, 4, 1, 6), d)), Arg(T((1,), I32))],
                   one(O.RopeUpdateSlice(12, 1, True)), exact=False, growth="basic",
                   fixed={4: np.array([5], np.int32)})
    # and their values [T, Hkv, D] as they are, the last with an f32 step into an f16 cache
    for d, x in ((F32, F32), (F16, F16), (BF16, BF16), (F16, F32)):
        yield case(f"TransposedUpdateSlice-{d}-3x10x16-{x}-4x3x16", "TransposedUpdateSlice", d,
                   [Arg(T((3, 10, 16), d)), Arg(T((4, 3, 16), x)), Arg(T((1,), I32))],
                   one(O.TransposedUpdateSlice(1)), exact=x == d, growth="basic",
                   fixed={2: np.array([5], np.int32)})
    # f32 keys rounded into an f16 cache (its dtype decides)
    yield case("RopeUpdateSlice-f16-3x10x16-f32-1x1x3x16-rot12", "RopeUpdateSlice", F16,
               [Arg(T((3, 10, 16), F16)), Arg(T((1, 1, 3, 16), F32)), Arg(T((1, 1, 1, 6), F32)),
                Arg(T((1, 1, 1, 6), F32)), Arg(T((1,), I32))],
               one(O.RopeUpdateSlice(12, 1)), exact=False, growth="basic",
               fixed={4: np.array([4], np.int32)})
    # attention over a cache with this step's rows written in, read from where they are:
    # one token's at 5; three tokens' past the end (the index clamped as DUS's), causal.
    # f32 only and the f16 cache below: each case is a slow attention shader to compile on
    # lavapipe, and the 16-bit reads are Attention's own (its cases run every dtype)
    for d in (F32,):
        kc = T((2, 11, 16), d)
        yield case(f"FreshKVAttention-{d}-decode-gqa4x2-s11-rot12-at-5", "FreshKVAttention",
                   d, [Arg(T((4, 1, 16), d)), Arg(kc), Arg(kc), Arg(T((1, 11), d), "small"),
                       Arg(T((2, 1, 16), d)), Arg(T((2, 1, 16), d)), Arg(T((1, 6), d)),
                       Arg(T((1, 6), d)), Arg(T((1,), I32))],
                   one(O.FreshKVAttention(0.25, 12)), exact=False, growth="compose",
                   fixed={8: np.array([5], np.int32)}, flops=4 * 11 * 16 * 4)
        yield case(f"FreshKVAttention-{d}-gqa4x2-t3-s11-rot12-clamped", "FreshKVAttention",
                   d, [Arg(T((4, 3, 16), d)), Arg(kc), Arg(kc), Arg(T((3, 11), d)),
                       Arg(T((2, 3, 16), d)), Arg(T((2, 3, 16), d)), Arg(T((3, 6), d)),
                       Arg(T((3, 6), d)), Arg(T((1,), I32))],
                   one(O.FreshKVAttention(0.25, 12)), exact=False, growth="compose",
                   fixed={3: causal_mask(3, 11, d), 8: np.array([10], np.int32)},
                   flops=4 * 4 * 3 * 11 * 16)
    # f32 rows rounded into an f16 cache (its dtype decides)
    kc = T((2, 11, 16), F16)
    yield case("FreshKVAttention-f16-f32-rows-decode-s11-rot12", "FreshKVAttention", F16,
               [Arg(T((4, 1, 16), F32)), Arg(kc), Arg(kc), Arg(T((1, 11), F32), "small"),
                Arg(T((2, 1, 16), F32)), Arg(T((2, 1, 16), F32)), Arg(T((1, 6), F32)),
                Arg(T((1, 6), F32)), Arg(T((1,), I32))],
               one(O.FreshKVAttention(0.25, 12)), exact=False, growth="compose",
               fixed={8: np.array([3], np.int32)}, flops=4 * 11 * 16 * 4)
    for d in WIDE_FLOATS:   # gpt-oss's sinks: prefill with GQA and a causal mask, decode
        q, k, sinks = T((4, 3, 16), d), T((2, 11, 16), d), T((4,), d)
        yield case(f"SinkAttention-{d}-gqa4x2-t3-s11", "SinkAttention", d,
                   [Arg(q), Arg(k), Arg(k), Arg(T((3, 11), d)), Arg(sinks)],
                   one(O.SinkAttention(0.25)), exact=False, growth="compose",
                   fixed={3: causal_mask(3, 11, d)})
        qd, kd = T((2, 4, 1, 16), d), T((2, 2, 37, 16), d)
        yield case(f"SinkAttention-{d}-decode-b2-gqa4x2-s37", "SinkAttention", d,
                   [Arg(qd), Arg(kd), Arg(kd), Arg(T((1, 37), d), "small"), Arg(sinks)],
                   one(O.SinkAttention(0.25)), exact=False, growth="compose")
        # few rows over many keys: decode splits the keys, the merge adds the sink
        yield case(f"SinkAttention-{d}-decode-split-gqa2x1-s200", "SinkAttention", d,
                   [Arg(T((2, 1, 16), d)), Arg(T((1, 200, 16), d)), Arg(T((1, 200, 16), d)),
                    Arg(T((1, 200), d), "small"), Arg(T((2,), d))],
                   one(O.SinkAttention(0.25)), exact=False, growth="compose")
    for d in WIDE_FLOATS:   # a batch of 3 sequences reading 13 positions of a 20-row pool
        qp, pool = T((3, 4, 1, 16), d), T((20, 2, 16), d)
        yield case(f"PagedAttention-{d}-decode-b3-gqa4x2-s13-p20", "PagedAttention", d,
                   [Arg(qp), Arg(pool), Arg(pool), Arg(T((3, 13), I32), ("index", 20)),
                    Arg(T((3, 1, 1, 1, 13), d), "small")],
                   one(O.PagedAttention(0.25)), exact=False, growth="compose",
                   flops=3 * 4 * 13 * 16 * 2)
    # a prompt chunk at positions 10..13 of a 96-key cache: the walk ends at the last live key
    cache = np.where(np.arange(96)[None, :] <= np.arange(4)[:, None] + 10, 0.0, -np.inf)
    yield case("Attention-f32-prefill-cache-t4-s96", "Attention", F32,
               [Arg(T((2, 4, 16), F32)), Arg(T((1, 96, 16), F32)), Arg(T((1, 96, 16), F32)),
                Arg(T((4, 96), F32))], one(O.Attention(0.25)), exact=False, growth="compose",
               fixed={3: cache.astype(np.float32)})
    yield case("PagedAttention-f32-prefill-b2-gqa4x2-t3-s11-p16", "PagedAttention", F32,
               [Arg(T((2, 4, 3, 16), F32)), Arg(T((16, 2, 16), F32)), Arg(T((16, 2, 16), F32)),
                Arg(T((2, 11), I32), ("index", 16)), Arg(T((2, 1, 1, 3, 11), F32), "small")],
               one(O.PagedAttention(0.25)), exact=False, growth="compose")
    yield from widened_kv_cases()
    yield from q8_kv_cases()
    yield case("BlockTopK-f32-2x3x8-s16-b4-k2", "BlockTopK", F32,
               [Arg(T((2, 3, 8), F32), "int"), Arg(T((2, 16, 8), F32), "int")],
               one(O.BlockTopK(4, 2)), exact=True)
    yield case("BlockTopK-bf16-2x1x8-s24-b4-k3", "BlockTopK", BF16,
               [Arg(T((2, 1, 8), BF16), "int"), Arg(T((2, 24, 8), BF16), "int")],
               one(O.BlockTopK(4, 3)), exact=True)
    yield case("SelectedAttention-f32-2x3x8-s16-b4", "SelectedAttention", F32,
               [Arg(T((2, 3, 8), F32)), Arg(T((2, 16, 8), F32)), Arg(T((2, 16, 8), F32)),
                Arg(T((2, 3, 2), I32), ("index", 4)), Arg(T((3, 16), F32), "small")],
               one(O.SelectedAttention(4, 0.3)), exact=False, growth="compose")
    for d in (F16, BF16):
        yield case(f"SelectedAttention-{d}-decode-2x1x40-s32-b8", "SelectedAttention", d,
                   [Arg(T((2, 1, 40), d)), Arg(T((2, 32, 40), d)), Arg(T((2, 32, 40), d)),
                    Arg(T((2, 1, 3), I32), ("index", 4)), Arg(T((2, 1, 32), d), "small")],
                   one(O.SelectedAttention(8, 0.2)), exact=False, growth="compose")


def widened_kv_cases() -> Iterator[Case]:
    """An f32 query reading f16 or bf16 keys and values directly (an f16 KV cache):
    prefill, decode, split decode, sinks and paged for f16; bf16 (its own loads) where the
    kernels load differently: prefill tiles, decode rows, pool rows. The keys are widened
    exactly, so the result is held to f32's threshold; the case's dtype is the keys' (the
    deciding one)."""
    tight = threshold("compose", F32)
    for d in (F16, BF16):
        q, k = T((4, 3, 16), F32), T((2, 11, 16), d)
        qd, kd = T((2, 4, 1, 16), F32), T((2, 2, 37, 16), d)
        pool = T((20, 2, 16), d)
        found = [
            case(f"Attention-f32q-{d}kv-gqa4x2-t3-s11", "Attention", d,
                 [Arg(q), Arg(k), Arg(k), Arg(T((3, 11), F32))], one(O.Attention(0.25)),
                 exact=False, growth="compose", fixed={3: causal_mask(3, 11, F32)}),
            case(f"Attention-f32q-{d}kv-decode-b2-gqa4x2-s37", "Attention", d,
                 [Arg(qd), Arg(kd), Arg(kd), Arg(T((1, 37), F32), "small")],
                 one(O.Attention(0.25)), exact=False, growth="compose"),
            case(f"PagedAttention-f32q-{d}kv-decode-b3-gqa4x2-s13-p20", "PagedAttention", d,
                 [Arg(T((3, 4, 1, 16), F32)), Arg(pool), Arg(pool),
                  Arg(T((3, 13), I32), ("index", 20)), Arg(T((3, 1, 1, 1, 13), F32), "small")],
                 one(O.PagedAttention(0.25)), exact=False, growth="compose"),
        ]
        if d is F16:
            found += [
                case(f"Attention-f32q-{d}kv-decode-split-gqa2x1-s200", "Attention", d,
                     [Arg(T((2, 1, 16), F32)), Arg(T((1, 200, 16), d)),
                      Arg(T((1, 200, 16), d)), Arg(T((1, 200), F32), "small")],
                     one(O.Attention(0.25)), exact=False, growth="compose"),
                case(f"SinkAttention-f32q-{d}kv-decode-b2-gqa4x2-s37", "SinkAttention", d,
                     [Arg(qd), Arg(kd), Arg(kd), Arg(T((1, 37), F32), "small"),
                      Arg(T((4,), F32))], one(O.SinkAttention(0.25)), exact=False,
                     growth="compose"),
                case(f"PagedAttention-f32q-{d}kv-prefill-b2-gqa4x2-t3-s11-p20",
                     "PagedAttention", d,
                     [Arg(T((2, 4, 3, 16), F32)), Arg(pool), Arg(pool),
                      Arg(T((2, 11), I32), ("index", 20)),
                      Arg(T((2, 1, 1, 3, 11), F32), "small")],
                     one(O.PagedAttention(0.25)), exact=False, growth="compose"),
            ]
        for c in found:
            c.tol = tight
            yield c


def q8_kv_cases() -> Iterator[Case]:
    """An f32 query reading q8_0 keys and values directly (Q8KVAttention: a q8_0 KV cache):
    prefill with a causal mask, batched decode, decode over many keys, and a paged batch's
    per-sequence mask over gathered rows, each also with gpt-oss's sinks (Q8KVSinkAttention);
    and through slot maps from pools (PagedQ8KVAttention), decode and prefill. Codes span
    -127..127 with scales a cache's size; the dequantization is exact in the definition's
    one rounding, so the result is held to f32's threshold. The case's dtype is the codes'
    (the deciding one)."""
    rng = np.random.default_rng(49)
    tight = threshold("compose", F32)

    def kv(shape):
        return [Arg(T(shape, DType.I8)), Arg(T(shape[:-1] + (shape[-1] // 32,), F32))]

    def scales(*shapes):
        return {i: (rng.random(s[:-1] + (s[-1] // 32,)) * 0.03).astype(np.float32)
                for i, s in shapes}

    shapes = [
        ("gqa4x2-t3-s11", T((4, 3, 64), F32), (2, 11, 64), Arg(T((3, 11), F32))),
        ("decode-b2-gqa4x2-s37", T((2, 4, 1, 32), F32), (2, 2, 37, 32),
         Arg(T((1, 37), F32), "small")),
        ("decode-split-gqa2x1-s200", T((2, 1, 32), F32), (1, 200, 32),
         Arg(T((1, 200), F32), "small")),
        ("paged-b3-gqa4x2-s13", T((3, 4, 1, 32), F32), (3, 2, 13, 32),
         Arg(T((3, 1, 1, 1, 13), F32), "small")),
    ]
    for name, q, rows, mask in shapes:
        fixed = scales((2, rows), (4, rows))
        if name.endswith("t3-s11"):
            fixed[5] = causal_mask(3, 11, F32)
        c = case(f"Q8KVAttention-f32q-i8kv-{name}", "Q8KVAttention", DType.I8,
                 [Arg(q), *kv(rows), *kv(rows), mask], one(O.Q8KVAttention(0.25)),
                 exact=False, growth="compose", fixed=fixed)
        c.tol = tight
        yield c
        # gpt-oss's sink logit per head over the same rows (Q8KVSinkAttention)
        c = case(f"Q8KVSinkAttention-f32q-i8kv-{name}", "Q8KVSinkAttention", DType.I8,
                 [Arg(q), *kv(rows), *kv(rows), mask, Arg(T((q.shape[-3],), F32))],
                 one(O.Q8KVSinkAttention(0.25)), exact=False, growth="compose",
                 fixed=dict(fixed))
        c.tol = tight
        yield c
    # pools of 20 slots read through slot maps: a decode batch of 3, a prefill batch of 2
    pool = (20, 2, 32)
    for name, q, smap, mask in (
            ("decode-b3-gqa4x2-s13-p20", T((3, 4, 1, 32), F32), T((3, 13), I32),
             T((3, 1, 1, 1, 13), F32)),
            ("prefill-b2-gqa4x2-t3-s11-p20", T((2, 4, 3, 32), F32), T((2, 11), I32),
             T((2, 1, 1, 3, 11), F32))):
        c = case(f"PagedQ8KVAttention-f32q-i8kv-{name}", "PagedQ8KVAttention", DType.I8,
                 [Arg(q), *kv(pool), *kv(pool), Arg(smap, ("index", 20)), Arg(mask, "small")],
                 one(O.PagedQ8KVAttention(0.25)), exact=False, growth="compose",
                 fixed=scales((2, pool), (4, pool)))
        c.tol = tight
        yield c


# -- precision (docs/ir.md sections 10.8 and 15) ------------------------------------------------
def _q8_inputs(shape) -> tuple[np.ndarray, np.ndarray]:
    """x [..., G, 32] and its q8 scales amax / 127 [..., G, 1], with the rule's edges
    planted: a block of zeros (d = 0), a block of exact ties (x = (k + 1/2) d with d = 1),
    and |x| = 127 d at the clamp."""
    rng = np.random.default_rng(49)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    flat[0] = 0.0
    if flat.shape[0] > 1:
        flat[1] = np.arange(shape[-1], dtype=np.float32) - shape[-1] / 2 + 0.5
    d = (np.abs(x).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    if flat.shape[0] > 1:
        d.reshape(-1)[1] = 1.0
    return x, d


def precision_cases() -> Iterator[Case]:
    """QuantizeI8 alone; the q8 rows chain; every integer-coded packed format read as q8
    rows (the chain, and Q8PackedContraction); 16-bit weights read rounded activations;
    attention over f16 and q8_0 caches it writes, dense and paged."""
    from poot.formats import PackedWeight, formats
    from poot.ir.ops.quantize import q8_round

    for shape in ((1, 1, 32), (3, 4, 32)):
        x, d = _q8_inputs(shape)
        yield case(f"QuantizeI8-f32-{shape_id(shape)}-planted", "QuantizeI8", F32,
                   [Arg(T(shape, F32)), Arg(T(shape[:-1] + (1,), F32))], one(O.QuantizeI8()),
                   exact=True, fixed={0: x, 1: d})
    yield case("QuantizeI8-f32-5x67-clamped", "QuantizeI8", F32,
               [Arg(T((5, 67), F32), "special"), Arg(T((5, 1), F32), "positive")],
               one(O.QuantizeI8()), exact=True)
    yield case("QuantizeI8-q8-rows-f32-5x96", "QuantizeI8", F32, [Arg(T((5, 96), F32))],
               lambda b, x: q8_round(b, x), exact=False, growth="basic")
    for name in sorted(formats()):
        if not getattr(formats()[name], "integer_codes", False):
            continue
        w = PackedWeight(name, (8, 256))
        srcs = [Arg(s.type, ("packed", w, i)) for i, s in enumerate(w.sources())]
        for rows in (1, 3, 12):
            yield case(f"Q8PackedContraction-{name}-{rows}x256", "Q8PackedContraction", name,
                       [Arg(T((rows, 256), F32))] + srcs, one(O.Q8PackedContraction(w)),
                       exact=False, growth="compose", flops=2 * rows * 256 * 8)
        yield case(f"PackedContraction-{name}-q8-rows-3x256", "PackedContraction", name,
                   [Arg(T((3, 256), F32))] + srcs,
                   lambda b, x, *src, w=w: b.eqn(O.PackedContraction(w), q8_round(b, x), *src),
                   exact=False, growth="compose", flops=2 * 3 * 256 * 8)
    for w, act in ((BF16, BF16), (F16, F16), (U32, F16)):
        ws = (19, 32) if w is U32 else (19, 64)
        for rows in (1, 3):
            yield case(f"DenseContraction-{w}-{act}-activations-{rows}x64-19x64",
                       "DenseContraction", w,
                       [Arg(T((rows, 64), F32)),
                        Arg(T(ws, w), _f16_words(ws) if w is U32 else "any")],
                       lambda b, x, wt, act=act: b.eqn(O.DenseContraction(), b.eqn(
                           O.Cast(F32), b.eqn(O.Cast(act), x)), wt),
                       exact=False, growth="compose", flops=2 * rows * 64 * 19)
    # prefill rows on a bf16 weight, f32 and bf16-rounded activations (CUDA's warpgroup
    # GEMM reads the weight in place beside two activation planes, or one)
    for act in (F32, BF16):
        yield case(f"DenseContraction-bf16-{act}-activations-130x256-72x256",
                   "DenseContraction", BF16, [Arg(T((130, 256), F32)), Arg(T((72, 256), BF16))],
                   lambda b, x, wt, act=act: b.eqn(O.DenseContraction(), x if act is F32 else
                                                   b.eqn(O.Cast(F32), b.eqn(O.Cast(act), x)),
                                                   wt),
                   exact=False, growth="compose", flops=2 * 130 * 256 * 72)
    yield from kv_cases()


def kv_cases() -> Iterator[Case]:
    """A decode step over a cache of f16 or q8_0 rows it writes first (build_decoder's
    kv_dtype): dense (DynamicUpdateSlice at pos, Attention) and paged (ScatterUpdate into
    a pool, Gather through a slot map, Attention)."""
    from poot.ir.ops.quantize import q8_quantize, q8_rows

    def encode(b, x, kv):
        if kv == "f16":
            return [b.eqn(O.Cast(F16), x)]
        q, d = q8_quantize(b, x)
        return [b.eqn(O.Reshape(x.type.shape), q),
                b.eqn(O.Reshape(x.type.shape[:-1] + (x.type.shape[-1] // 32,)), d)]

    def decode(b, parts, kv):
        if kv == "f16":
            return b.eqn(O.Cast(F32), parts[0])
        return q8_rows(b, *parts)

    def cache(kv, shape):
        if kv == "f16":
            return [Arg(T(shape, F16))]
        return [Arg(T(shape, DType.I8)), Arg(T(shape[:-1] + (shape[-1] // 32,), F32), "small")]

    hkv, d = 2, 64
    for kv in ("f16", "q8_0"):
        # dense: q [Hq=4, 1, D], new rows [Hkv, 1, D] at pos of a 16-position cache
        parts = len(cache(kv, (1, 1, d)))

        def dense(b, q, k, v, pos, mask, *caches, kv=kv, parts=parts):
            rows = []
            for new, cs in ((k, caches[:parts]), (v, caches[parts:])):
                rows.append(decode(b, [b.eqn(O.DynamicUpdateSlice(1), c, e, pos) for c, e in
                                       zip(cs, encode(b, new, kv), strict=True)], kv))
            return b.eqn(O.Attention(0.25), q, *rows, mask)

        shape = (hkv, 16, d)
        yield case(f"Attention-{kv}-kv-cache-decode-gqa4x2-s16", "Attention", F32,
                   [Arg(T((4, 1, d), F32)), Arg(T((hkv, 1, d), F32)), Arg(T((hkv, 1, d), F32)),
                    Arg(T((1,), I32), ("index", 16)), Arg(T((1, 16), F32), "small"),
                    *cache(kv, shape), *cache(kv, shape)],
                   dense, exact=False, growth="compose")

        # paged: 2 sequences write one row each into a 20-row pool and read 13 positions
        def paged(b, q, k, v, slots, smap, mask, *pools, kv=kv, parts=parts):
            rows = []
            for new, ps in ((k, pools[:parts]), (v, pools[parts:])):
                written = [b.eqn(O.ScatterUpdate(), p, e, slots) for p, e in
                           zip(ps, encode(b, new, kv), strict=True)]
                got = decode(b, [b.eqn(O.Gather(0), w, smap) for w in written], kv)
                rows.append(b.eqn(O.Transpose((0, 2, 1, 3)), got))        # [B, Hkv, S, D]
            return b.eqn(O.Attention(0.25), q, *rows, mask)

        pool = (20, hkv, d)
        yield case(f"Attention-{kv}-kv-pool-decode-b2-gqa4x2-s13-p20", "Attention", F32,
                   [Arg(T((2, 4, 1, d), F32)), Arg(T((2, hkv, d), F32)),
                    Arg(T((2, hkv, d), F32)), Arg(T((2,), I32), ("index", 20)),
                    Arg(T((2, 13), I32), ("index", 20)), Arg(T((2, 1, 1, 1, 13), F32), "small"),
                    *cache(kv, pool), *cache(kv, pool)],
                   paged, exact=False, growth="compose")


def _scan_body(b, carry, x):
    return b.eqn(O.Binary(O.BinaryOp.Add), b.eqn(O.Binary(O.BinaryOp.Mul), carry, x), x)


def other_cases() -> Iterator[Case]:
    c = T((4,), F32)
    yield case("Scan-f32-5x4", "Scan", F32, [Arg(c), Arg(T((5, 4), F32), "small")],
               one(O.Scan(region([c, c], _scan_body), 5)), exact=False, growth="compose")
    for d in (F16, BF16):   # the body's eqns decide: bf16 has no arithmetic on SPIR-V
        cd = T((3, 4), d)
        yield case(f"Scan-{d}-6x3x4", "Scan", d, [Arg(cd), Arg(T((6, 3, 4), d), "small")],
                   one(O.Scan(region([cd, cd], _scan_body), 6)), exact=False,
                   growth="compose")
    r = T((9,), I32)
    yield case("Scan-i32-rotate-4x9", "Scan", I32, [Arg(r), Arg(T((4, 9), I32))],
               one(O.Scan(region([r, r], scan_rotate), 4)), exact=True)
    yield case("AllReduce-f32-1rank-3x5", "AllReduce", F32, [Arg(T((3, 5), F32))],
               one(O.AllReduce(1)), exact=True)
    yield case("AllGather-f32-1rank-3x5", "AllGather", F32, [Arg(T((3, 5), F32))],
               one(O.AllGather(1, 0)), exact=True)
    for d in (F32, I32):
        yield case(f"Iota-{d}-4x6-axis1", "Iota", d, [], lambda b, d=d: b.eqn(
            O.Binary(O.BinaryOp.Add), b.eqn(O.Iota((4, 6), 1, d)), b.lit(1, d)), exact=True)


FAMILIES = (unary_cases, binary_cases, select_cases, cast_cases, shape_cases, data_cases,
            reduce_cases, matmul_cases, dense_cases, packed_cases, long_k_cases,
            decode_batch_cases, region_cases,
            attention_cases, other_cases, precision_cases)


def all_cases() -> list[Case]:
    """Every case, in a stable order; a case id is unique. Built once per set of
    registered packed formats (cases are immutable graphs)."""
    from poot.formats import formats

    return list(_cases(tuple(sorted(formats()))))


@functools.lru_cache(maxsize=4)
def _cases(_formats: tuple[str, ...]) -> tuple[Case, ...]:
    out, seen = [], set()
    for fam in FAMILIES:
        for c in fam():
            if c is None:
                continue
            if c.id in seen:  # pragma: no cover - a bug in this module
                raise AssertionError(f"duplicate case id {c.id}")
            seen.add(c.id)
            out.append(c)
    return tuple(out)


__all__ = ["Case", "all_cases", "FAMILIES", "threshold", "build", "F32", "INTS"]
