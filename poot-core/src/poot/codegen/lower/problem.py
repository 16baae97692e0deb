"""What a contraction is, as every schedule of `poot.codegen.lower.dot` reads it: out[b, m,
n] = sum_k a * w, its operands given as element functions (`Problem`), activations that
are the rows of a buffer (`Rows`) and an RMSNorm taken on the way (`RowNorm`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from poot.codegen import index as ix
from poot.codegen.builder import KernelBuilder
from poot.codegen.expr import Const, Expr, Load, Un, f32, i32
from poot.dtypes import DType
from poot.ir.ops import UnaryOp

Elem = Callable[..., Expr]


@dataclass(frozen=True)
class Rows:
    """Activations that are the rows of an F32 buffer: a(b, m, k) = buffer[m * K + k]
    (one batch), so an even k and the next are one aligned 8-byte load (`gemv.Activations`)."""

    buffer: str
    k: int

    def at(self, m: Expr, k: Expr) -> Expr:
        return ix.add(ix.mul(m, self.k), k)

    def __call__(self, b, m: Expr, k: Expr) -> Expr:
        return Load(self.buffer, self.at(m, k), DType.F32)


@dataclass(frozen=True)
class RowNorm:
    """An RMSNorm of the activation rows (NormedPackedContraction, NormedDenseContraction):
    the problem's `a(b, m, k)` is x * g, and each product of row m is divided by
    sqrt(sum_k x^2 / K + eps). x is operand 0's rows, g [K] operand `g_operand`."""

    x: Rows
    eps: float
    g_operand: int = 1

    @property
    def g_rows(self) -> Rows:
        return Rows(f"in{self.g_operand}", 0)

    def g(self, k: Expr) -> Expr:
        return self.g_rows(0, i32(0), k)

    def a(self, b, m: Expr, k: Expr) -> Expr:
        """The contraction's activation x * g (the products divide by `den` after)."""
        return self.x(b, m, k) * self.g(k)

    def den(self, ss: Expr, k: int) -> Expr:
        """sqrt(ss / K + eps), as poot.ops.rms_norm rounds it (ss times 1/K)."""
        return Un(UnaryOp.Sqrt, ss * f32(1.0 / k) + f32(self.eps))


@dataclass
class Problem:
    """One contraction. Indices are I32 expressions; element functions return `acc` dtype.

    a(b, m, k); w(b, m, n, k) (m matters only when `w_per_row`);
    w_pair(b, n, kw, load=None) -> (w[2kw], w[2kw+1]) when the weight is read two per word
    (K even); `load(buffer, word)` replaces the word's load if given;
    w_run(b, m, n, k0, load=None) -> [RunPart]: w[k0 : k0 + run] (k0 a multiple of `run`),
    see poot.formats.RunPart; `load(role, word)` replaces the weight's word loads if given;
    w_chunks: role -> (buffer, elements, words) when every role w_run reads lies in K order
    (poot.formats.word_chunks): w_run(b, m, 0, k0, load) then decodes from `load`'s copy of
    the words of row n from k = kc on (kc a multiple of `elements`), k0 counted from kc;
    w_int(b, n, k0, load=None): the same run as poot.formats.IntGroups, None if it has none;
    a_pair(b, m, kw) likewise for the activation; store(kb, b, m, n, acc) writes one result.
    row_norm: the rows are normed first (`RowNorm`; `dot.contraction_program` handles it).
    pair(kb, m, i, lo, hi): a gated contraction's (GatedContraction) store of output i of
    row m from columns i and N/2 + i, in place of `store` (`dot.contraction_program`).
    w_dense: (operand index, dtype) of a 16-bit checkpoint weight [N, K] that tensor cores
    can read as it lies, rows along K (`planes` multiplies it in place), else None.
    q8: the contraction reads `a` quantized to int8 rows (Q8PackedContraction: q8_round
    of the rows, poot.ir.ops.quantize); the integer GEMV quantizes by that rule, and
    every other schedule reads rows rounded so first (`dot.contraction_program`).
    """

    batch: int
    m: int
    n: int
    k: int
    a: Elem
    w: Elem
    store: Callable[[KernelBuilder, Expr, Expr, Expr, Expr], None]
    acc: DType = DType.F32
    w_per_row: bool = False
    w_pair: Elem | None = None
    views: dict | None = None     # operand index -> (dtype, count) its buffer is read as
    w_run: Elem | None = None
    run: int = 1                  # elements per w_run
    tiles: object = None          # mma_operands.Tiles: 16-bit operands tensor cores can read as is
    w_chunks: dict = field(default_factory=dict)
    w_int: Elem | None = None     # w_int(b, n, k0, load=None) -> [IntGroup] | None, like w_run
    parts: int = 1                # > 1: b is a part of a row parts * k long (`int_gemv.k_parts`)
    row_norm: RowNorm | None = None
    pair: Callable | None = None
    w_dense: tuple | None = None
    q8: bool = False

    def zero(self) -> Const:
        return Const(0.0 if self.acc.is_float else 0, self.acc)
