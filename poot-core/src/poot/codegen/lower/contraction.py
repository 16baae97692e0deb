"""Weight contractions in checkpoint [N, K] order: dense (bf16/f16/f32), packed (any
registered format, through its decode program), grouped, indexed (MoE), row gathers,
ContractionEpilogue (the contraction's pointwise epilogue applied in registers) and
GatedContraction (each output joined from its result's two halves).

16-bit weights are read as U32 words and widened in registers (`poot.codegen.bits`);
packed weights are decoded by `WeightFormat.decode_expr`, and a run of K at a time by
`decode_run` where the GEMV schedule walks K, so no kernel here knows any format.
"""
from __future__ import annotations

import math
from dataclasses import replace

from poot.codegen import index as ix
from poot.codegen.bits import half_of, widen16
from poot.codegen.expr import Expr, Load, u32
from poot.codegen.lower.base import Sig, lowers, words
from poot.codegen.lower.dot import PROBLEMS, contraction_program, problem_for
from poot.codegen.lower.output import store_flat
from poot.codegen.lower.pointwise import pointwise_kernel
from poot.codegen.lower.problem import Problem, RowNorm, Rows
from poot.codegen.lower.schedule import GEMV_MAX_ROWS
from poot.codegen.program import KernelProgram
from poot.codegen.region import RegionEval
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.formats import RunPart, decode_run, get_format, int_run, run_length, word_chunks
from poot.ir.graph import Lit
from poot.ir.ops import (
    ContractionEpilogue,
    ContractionPrologue,
    DenseContraction,
    DenseRowGather,
    GatedContraction,
    GroupedDenseContraction,
    IndexedPackedContraction,
    NormedDenseContraction,
    NormedPackedContraction,
    PackedContraction,
    PackedDequant,
    PackedRowGather,
    Q8PackedContraction,
)

F32, U32 = DType.F32, DType.U32


# -- weight readers ---------------------------------------------------------------------
class DenseWeight:
    """Element (row, k) of a [rows, K] checkpoint weight held in buffer `name`."""

    def __init__(self, name: str, t, k: int):
        self.name, self.k = name, k
        if t.dtype is U32:                      # f16 values packed two per word
            self.dtype, self.view = DType.F16, None
        else:
            self.dtype = t.dtype
            self.view = words(t) if t.dtype in (DType.BF16, DType.F16) else None
        self.wide = self.dtype in (DType.BF16, DType.F16)

    def elem(self, row: Expr, k: Expr) -> Expr:
        e = ix.add(ix.mul(row, self.k), k)
        if not self.wide:
            return Load(self.name, e, F32)
        word = Load(self.name, ix.div(e, 2), U32)
        return widen16(half_of(word, ix.mod(e, 2)), self.dtype)

    def pair(self, row: Expr, kw: Expr, load=None) -> tuple[Expr, Expr]:
        """Elements (row, 2kw) and (row, 2kw + 1): one word (K even), read by
        `load(buffer, word index)` when given (a word already loaded), else loaded here."""
        at = ix.add(ix.mul(row, self.k // 2), kw)
        word = Load(self.name, at, U32) if load is None else load(self.name, at)
        return (widen16(word & u32(0xFFFF), self.dtype), widen16(word >> u32(16), self.dtype))


class PackedReader:
    """Element (row, k) of a packed weight whose sources are buffers in{first}, ..."""

    def __init__(self, sig: Sig, weight, first: int):
        self.weight, self.first = weight, first
        self.format = get_format(weight.format)
        self.roles = {s.role: first + j for j, s in enumerate(weight.sources())}
        self.views = {i: words(sig.type(i)) for i in self.roles.values()}
        self.run = run_length(self.format, weight.shape, weight.attr_dict)
        # role -> (buffer, elements, words) for the roles stored in K order (Problem.w_chunks)
        chunks = word_chunks(self.format, weight.shape, weight.attr_dict)
        self.chunks = {role: (f"in{self.roles[role]}", *c) for role, c in chunks.items()} \
            if set(chunks) == set(self.roles) else {}      # a run's words all staged, or none

    def load(self, role: str, word_index) -> Expr:
        if role not in self.roles:
            raise UnsupportedOp(f"decode program of {self.weight.format} reads unknown source "
                                f"{role!r}", op="PackedContraction")
        return Load(f"in{self.roles[role]}", ix.i32(word_index), U32)

    def elem(self, row: Expr, k: Expr) -> Expr:
        value = self.format.decode_expr(self.load, row, k, self.weight.shape,
                                        self.weight.attr_dict)
        return value.cast(F32)

    def run_parts(self, row: Expr, k0: Expr, load=None) -> list[RunPart]:
        """Elements (row, k0 .. k0 + run - 1), k0 a multiple of `run`; words read through
        `load(role, word_index)` when given (a staged copy), else from the sources."""
        parts = decode_run(self.format, load or self.load, row, k0, self.weight.shape,
                           self.weight.attr_dict)
        cast = lambda x: None if x is None else x.cast(F32)  # noqa: E731
        return [RunPart([v.cast(F32) for v in p.values], cast(p.scale), cast(p.offset),
                        p.exponents) for p in parts]

    def int_groups(self, row: Expr, k0: Expr, load=None):
        """The run at (row, k0) as poot.formats.IntGroups, or None (see `run_parts`)."""
        return int_run(self.format, load or self.load, row, k0, self.weight.shape,
                       self.weight.attr_dict)


def _rows(t) -> int:
    return math.prod(t.shape[:-1])


# -- contractions -------------------------------------------------------------------------
@problem_for(DenseContraction)
def dense_problem(sig: Sig, epilogue) -> Problem:
    return _dense(sig, epilogue, Rows("in0", sig.type(0).shape[-1]))


@problem_for(NormedDenseContraction)
def normed_dense_problem(sig: Sig, epilogue) -> Problem:
    """The dense contraction of rms_norm(in0, in2) (`RowNorm`, as `normed_problem`)."""
    norm = RowNorm(Rows("in0", sig.type(0).shape[-1]), sig.op.eps, g_operand=2)
    return _dense(sig, epilogue, norm.a, row_norm=norm)


def _dense(sig: Sig, epilogue, a, **extra) -> Problem:
    """A dense weight's (in1) contraction with activation `a(b, m, k)` of in0's rows."""
    rows, k, n = _rows(sig.type(0)), sig.type(0).shape[-1], sig.out.shape[-1]
    w = DenseWeight("in1", sig.type(1), k)
    return Problem(1, rows, n, k, a, lambda b, m, nn, kk: w.elem(nn, kk),
                   store_flat(sig, rows, n, epilogue),
                   w_pair=(lambda b, nn, kw, load=None: w.pair(nn, kw, load)) if w.wide
                   else None,
                   views={1: w.view} if w.view else None,
                   w_dense=(1, w.dtype) if w.wide and w.view else None, **extra)


@problem_for(GroupedDenseContraction)
def grouped_problem(sig: Sig, epilogue) -> Problem:
    a = sig.type(0)
    g, m, k = a.shape
    n = sig.out.shape[-1]
    w = DenseWeight("in1", sig.type(1), k)

    def a_elem(b, mm, kk):
        return Load("in0", ix.add(ix.mul(ix.add(ix.mul(b, m), mm), k), kk), F32)

    return Problem(g, m, n, k, a_elem, lambda b, mm, nn, kk: w.elem(ix.add(ix.mul(b, n), nn), kk),
                   store_flat(sig, m, n, epilogue),
                   w_pair=lambda b, nn, kw, load=None: w.pair(ix.add(ix.mul(b, n), nn), kw, load),
                   views={1: w.view})


@problem_for(PackedContraction)
def packed_problem(sig: Sig, epilogue) -> Problem:
    k = sig.type(0).shape[-1]
    return _packed(sig, epilogue, 1, Rows("in0", k))


def q8_problem(sig: Sig, epilogue) -> Problem:
    """Q8PackedContraction: PackedContraction's problem over int8 rows (`Problem.q8`).
    Registered as a contraction head only (a ContractionEpilogue's or GatedContraction's);
    the op alone is a backend's own lowering where its table declares it
    (`KernelBackend.program_for`: poot.codegen.lower.q8)."""
    return replace(packed_problem(sig, epilogue), q8=True)


PROBLEMS[Q8PackedContraction] = q8_problem


@problem_for(NormedPackedContraction)
def normed_problem(sig: Sig, epilogue) -> Problem:
    """The packed contraction of rms_norm(in0, in1): the norm's root divides the products
    (`RowNorm`), so the activation is x * g."""
    k = sig.type(0).shape[-1]
    norm = RowNorm(Rows("in0", k), sig.op.eps)
    return _packed(sig, epilogue, 2, norm.a, row_norm=norm)


def _packed(sig: Sig, epilogue, first: int, a, **extra) -> Problem:
    """A packed weight's contraction: its sources from operand `first` on, activation
    `a(b, m, k)` of in0's rows."""
    rows, k, n = _rows(sig.type(0)), sig.type(0).shape[-1], sig.out.shape[-1]
    w = PackedReader(sig, sig.op.weight, first)
    return Problem(1, rows, n, k, a, lambda b, m, nn, kk: w.elem(nn, kk),
                   store_flat(sig, rows, n, epilogue), views=w.views,
                   w_run=lambda b, m, nn, k0, load=None: w.run_parts(nn, k0, load),
                   run=w.run, w_chunks=w.chunks,
                   w_int=lambda b, nn, k0, load=None: w.int_groups(nn, k0, load), **extra)


@problem_for(IndexedPackedContraction)
def indexed_packed_problem(sig: Sig, epilogue) -> Problem:
    x = sig.type(0)
    m, k = x.shape
    n = sig.out.shape[-1]
    experts = sig.op.experts
    w = PackedReader(sig, sig.op.weight, 2)

    def row(mm, nn):
        e = ix.clamp(Load("in1", mm, DType.I32), 0, experts - 1)
        return ix.add(ix.mul(e, n), nn)

    return Problem(1, m, n, k, Rows("in0", k), lambda b, mm, nn, kk: w.elem(row(mm, nn), kk),
                   store_flat(sig, m, n, epilogue), w_per_row=True, views=w.views,
                   w_run=lambda b, mm, nn, k0: w.run_parts(row(mm, nn), k0), run=w.run)


# -- row gathers ------------------------------------------------------------------------------
def _row_gather(sig: Sig, ids_index: int, rows: int, elem, views) -> KernelProgram:
    ids = sig.type(ids_index)

    def value(c, kb):
        flat = ix.ravel(c[:-1], ids.shape)
        row = kb.let("row", ix.clamp(Load(f"in{ids_index}", flat, ids.dtype), 0, rows - 1))
        return elem(row, c[-1])

    def declare(kb):
        sig.declare_inputs(kb, views)
    return pointwise_kernel(sig, value, declare)


@lowers(PackedDequant)
def lower_packed_dequant(sig: Sig) -> KernelProgram:
    w = PackedReader(sig, sig.op.weight, 0)
    return pointwise_kernel(sig, lambda c, kb: w.elem(c[0], c[1]),
                            lambda kb: sig.declare_inputs(kb, w.views))


@lowers(DenseRowGather)
def lower_dense_row_gather(sig: Sig) -> KernelProgram:
    table = sig.type(0)
    w = DenseWeight("in0", table, table.shape[1])
    return _row_gather(sig, 1, table.shape[0], w.elem, {0: w.view})


@lowers(PackedRowGather)
def lower_packed_row_gather(sig: Sig) -> KernelProgram:
    w = PackedReader(sig, sig.op.weight, 1)
    return _row_gather(sig, 0, sig.op.weight.shape[0], w.elem, w.views)


@problem_for(ContractionPrologue)
def prologue_problem(sig: Sig, epilogue) -> Problem:
    """The head's contraction of the body's result: each activation element is the body
    evaluated where the schedule reads it, over its parameters in0, in{n_head}, ... (each
    of the activation's type). Decode rows only: wider problems stage activation tiles
    from memory."""
    op, t = sig.op, sig.type(0)
    if type(op.head) not in (DenseContraction, PackedContraction) or \
            _rows(t) > GEMV_MAX_ROWS:
        raise UnsupportedOp(f"no prologue for {op.head.name} of {_rows(t)} rows (a dense or "
                            f"packed contraction of at most {GEMV_MAX_ROWS})",
                            op="ContractionPrologue")
    names = ["in0"] + [f"in{j}" for j in range(op.n_head, len(sig.ins))]

    def a(b, m, kk):
        coords = [*ix.unravel(m, t.shape[:-1]), kk]
        params = [lambda c, x=x: Load(x, ix.ravel(c, t.shape), t.dtype) for x in names]
        return RegionEval(None, op.body, params).result_at(coords)
    head = Sig(op.head, sig.ins[:op.n_head], sig.out, sig.features)
    return replace(PROBLEMS[type(op.head)](head, epilogue), a=a)


# -- epilogue -------------------------------------------------------------------------------
@lowers(ContractionEpilogue, scheduled=True)
def lower_contraction_epilogue(sig: Sig) -> KernelProgram:
    make, head_sig = _head(sig)
    if head_sig.out.shape != sig.out.shape:
        raise UnsupportedOp(f"epilogue changes the shape {head_sig.out} -> {sig.out}",
                            op="ContractionEpilogue")

    def epilogue(kb, flat, acc):
        return _body_at(kb, sig, ix.unravel(flat, sig.out.shape), [acc], head_sig.out.dtype)

    p = make(head_sig, epilogue)
    p.store = store_flat(sig, p.m, p.n, epilogue)
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


@lowers(GatedContraction, scheduled=True)
def lower_gated_contraction(sig: Sig) -> KernelProgram:
    """The head's problem, each output joining its two columns i and N/2 + i through the
    body (lower.gemv: in the GEMV's workgroup, else after the contraction, lower.dot)."""
    make, head_sig = _head(sig)
    p = make(head_sig, None)

    def pair(kb, m, i, lo, hi):
        idx = kb.let("o", ix.add(ix.mul(m, sig.out.shape[-1]), i))
        value = _body_at(kb, sig, ix.unravel(idx, sig.out.shape), [lo, hi],
                         head_sig.out.dtype)
        kb.store("out", idx, value.cast(sig.out.dtype))
    p.pair = pair
    return contraction_program(p, sig, lambda kb: sig.declare_all(kb, p.views))


def _head(sig: Sig):
    """(the problem maker, the Sig) of a region op's contraction head, its first n_head
    operands."""
    op = sig.op
    make = PROBLEMS.get(type(op.head))
    if make is None:
        raise UnsupportedOp(f"{op.name} head {op.head.name} is not a contraction", op=op.name)
    head_ins = sig.ins[: op.n_head]
    head_out = op.head.infer([x.type if isinstance(x, Lit) else x for x in head_ins])
    return make, Sig(op.head, head_ins, head_out)


def _body_at(kb, sig: Sig, coords, heads: list, dtype) -> Expr:
    """A region op's body at output `coords`: its first parameters the head's values
    `heads` rounded to its result's `dtype`, the rest its operands past the head's."""
    params = [lambda c, h=h: h.cast(dtype) for h in heads]
    params += [lambda c, j=j: _operand(sig, j, c) for j in range(sig.op.n_head, len(sig.ins))]
    return RegionEval(kb, sig.op.body, params).result_at(coords)


def _operand(sig: Sig, j: int, coords) -> Expr:
    x = sig.ins[j]
    if isinstance(x, Lit):
        return sig.operand_at(j, coords)
    return Load(f"in{j}", ix.ravel(coords, x.shape), x.dtype)


