"""Group-wise integer formats: GPTQ (int4, int8) and AWQ (int4, GEMM packing).

Both store W^T [K, N] as small unsigned ints q with a zero point z and an f16
scale s per (group of K rows, column n): W[n, k] = (q - z) * s, evaluated in f32
as `f32(q - z) * f32(s)` (exact: the product of a 9-bit int and an f16 fits f32).

GPTQ (AutoGPTQ / HF "gptq" layout): qweight int32 [K*bits/32, N] packs 32/bits
consecutive K rows per word (row k in bits (k % per)*bits); qzeros int32
[G, N*bits/32] packs consecutive columns the same way; scales f16 [G, N];
optional g_idx int32 [K] gives the group of each row (act-order), else k // group_size.
Checkpoint version v1 ("gptq") stores zero - 1, v2 ("gptq_v2") stores the zero.

AWQ (AutoAWQ GEMM): qweight int32 [K, N/8] and qzeros int32 [G, N/8] pack 8
columns per word in the order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column
8c + order[i]); scales f16 [G, N]; the group of row k is k // group_size.
"""
from __future__ import annotations

import math

import numpy as np
from poot.codegen.expr import Expr
from poot.dtypes import DType
from poot.formats import RunPart

from poot_quant import exprs
from poot_quant.base import Format, ceil_div, spec

I32, F16 = DType.I32, DType.F16
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class GroupedIntFormat(Format):
    bits: int
    integer_codes = True

    def __init__(self, name: str, bits: int):
        self.name, self.bits = name, bits
        self.per_word = 32 // bits
        self.mask = (1 << bits) - 1

    # -- attributes ------------------------------------------------------------------
    def group_size(self, k: int, attrs) -> int:
        gs = int(attrs.get("group_size", 128))
        if gs == -1:
            return k
        if gs <= 0:
            self.fail(f"group_size must be positive or -1, got {gs}")
        return gs

    def groups(self, k: int, attrs) -> int:
        return ceil_div(k, self.group_size(k, attrs))

    def zero_offset(self, attrs) -> int:
        return 0

    def has_g_idx(self, attrs) -> bool:
        return False

    # -- layout (subclasses) -------------------------------------------------------------
    def unpack_q(self, qweight: np.ndarray, n: int, k: int) -> np.ndarray:
        """q as uint32 [K, N]."""
        raise NotImplementedError

    def unpack_cols(self, packed: np.ndarray) -> np.ndarray:
        """A [R, N/per] array of words packed along N, unpacked to uint32 [R, N]."""
        raise NotImplementedError

    def q_expr(self, qweight: exprs.Words, n, k, shape):
        raise NotImplementedError

    def q_run(self, qweight: exprs.Words, n, k0, count: int, shape) -> list:
        """q of k0 .. k0 + count - 1 (U32), k0 a multiple of count (runs stay in a word)."""
        raise NotImplementedError

    def col_shift_expr(self, n):
        raise NotImplementedError

    # -- the protocol ----------------------------------------------------------------
    def decode(self, arrays, shape, attrs):
        n, k = shape
        q = self.unpack_q(arrays["qweight"].view(np.uint32), n, k)
        zeros = self.unpack_cols(arrays["qzeros"].view(np.uint32)).astype(np.int32) \
            + self.zero_offset(attrs)
        scales = arrays["scales"].astype(np.float32)
        g = self.row_groups(arrays, shape, attrs)
        wt = (q.astype(np.int32) - zeros[g]).astype(np.float32) * scales[g]
        return np.ascontiguousarray(wt.T)

    def row_groups(self, arrays, shape, attrs) -> np.ndarray:
        n, k = shape
        if "g_idx" not in arrays:
            return np.arange(k) // self.group_size(k, attrs)
        g = arrays["g_idx"]
        groups = self.groups(k, attrs)
        if g.size and (g.min() < 0 or g.max() >= groups):
            self.fail(f"g_idx holds groups in [{g.min()}, {g.max()}]; a [{n}, {k}] weight with "
                      f"group_size {self.group_size(k, attrs)} has {groups} groups")
        return g

    def decode_expr(self, load, n, k, shape, attrs):
        self.check_expr_sources(shape, attrs)
        n, k = exprs.as_u32(n), exprs.as_u32(k)
        q = self.q_expr(exprs.Words(load, "qweight"), n, k, shape)
        z, s = self.zero_scale(load, n, self.group_of(load, k, shape, attrs), shape, attrs)
        diff = q.bitcast(I32) - (z.bitcast(I32) + self.zero_offset(attrs))
        return diff.cast(DType.F32) * s

    def group_of(self, load, k, shape, attrs) -> Expr:
        if self.has_g_idx(attrs):
            return exprs.Words(load, "g_idx").word(k)
        return exprs.div_const(k, self.group_size(shape[1], attrs))

    def zero_scale(self, load, n, g, shape, attrs) -> tuple[Expr, Expr]:
        """The stored zero point (U32) and the f32 scale of column n in group g."""
        n_cols = shape[0]
        per_shift = self.per_word.bit_length() - 1
        zword = exprs.Words(load, "qzeros").word(g * (n_cols // self.per_word) + (n >> per_shift))
        z = (zword >> self.col_shift_expr(n)) & self.mask
        return z, exprs.Words(load, "scales").f16((g * n_cols + n) << 1)

    def run_length(self, shape, attrs) -> int:
        """Up to 32 k that share a group (one scale and zero load per run); with act-order
        each k has its own group, so a run is the k of one word."""
        if self.has_g_idx(attrs):
            return self.run_unit
        run = math.gcd(self.group_size(shape[1], attrs), 32, shape[1])
        return run if run % self.run_unit == 0 else 1   # groups that split words: per element

    def decode_run(self, load, n, k0, shape, attrs) -> list[RunPart]:
        self.check_expr_sources(shape, attrs)
        n, k0 = exprs.as_u32(n), exprs.as_u32(k0)
        count = self.run_length(shape, attrs)
        qs = self.q_run(exprs.Words(load, "qweight"), n, k0, count, shape)
        if self.has_g_idx(attrs):   # a group, zero and scale per element
            groups = [self.group_of(load, k0 + i, shape, attrs) for i in range(count)]
        else:
            groups = [self.group_of(load, k0, shape, attrs)]
        parts = []
        for i, g in enumerate(groups):
            z, s = self.zero_scale(load, n, g, shape, attrs)
            mine = qs[i:i + 1] if len(groups) > 1 else qs
            parts.append(exprs.int_part([exprs.Biased(q, z + self.zero_offset(attrs))
                                         for q in mine], s))
        return parts

    # -- quantization --------------------------------------------------------------------
    def quantize(self, w, **attrs) -> list[np.ndarray]:
        w = np.asarray(w, np.float32)
        if w.ndim != 2:
            self.fail(f"quantize takes a 2-D [N, K] weight, got shape {list(w.shape)}")
        n, k = w.shape
        self.roles(w.shape, attrs)
        gs = self.group_size(k, attrs)
        g_idx = self.quantize_groups(w, gs, attrs)
        order = np.argsort(g_idx, kind="stable")        # rows of one group together
        starts = np.searchsorted(g_idx[order], np.arange(self.groups(k, attrs)))
        wt = w.T[order]                                 # [K, N], grouped
        lo = np.minimum(np.minimum.reduceat(wt, starts, axis=0), 0)
        hi = np.maximum(np.maximum.reduceat(wt, starts, axis=0), 0)
        scale, zero = self.scale_zero(lo, hi, attrs)
        scale16 = scale.astype(np.float16)
        s = scale16.astype(np.float32)[g_idx]
        q = np.clip(np.rint(np.divide(w.T, s, out=np.zeros_like(w.T), where=s != 0))
                    + zero[g_idx], 0, self.mask).astype(np.uint32)
        stored_zero = (zero - self.zero_offset(attrs)).astype(np.uint32)
        out = [self.pack_q(q), self.pack_cols(stored_zero), scale16]
        if self.has_g_idx(attrs):
            out.append(g_idx.astype(np.int32))
        return out

    def quantize_groups(self, w, gs, attrs) -> np.ndarray:
        return np.arange(w.shape[1]) // gs

    def scale_zero(self, lo, hi, attrs):
        """Asymmetric: the range [lo, hi] (which includes 0) maps onto 0..max."""
        scale = (hi - lo) / self.mask
        scale = np.where(scale == 0, 1, scale)
        zero = np.clip(np.rint(-lo / scale), 0, self.mask)
        return scale, zero

    def pack_q(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def pack_cols(self, values: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _pack_last(values: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Pack [..., W, per] small ints into int32 [..., W], element i at `shifts[i]`."""
    words = np.bitwise_or.reduce(values.astype(np.uint32) << shifts.astype(np.uint32), axis=-1)
    return np.ascontiguousarray(words, np.uint32).view(np.int32)


class GPTQ(GroupedIntFormat):
    attr_names = frozenset({"group_size", "sym", "version", "act_order"})

    def __init__(self, bits: int):
        super().__init__(f"gptq:int{bits}", bits)
        self.shifts = np.arange(self.per_word, dtype=np.uint32) * bits

    def zero_offset(self, attrs) -> int:
        version = attrs.get("version", "v1")
        if version not in ("v1", "v2"):
            self.fail(f"version must be 'v1' (stored zero = zero - 1) or 'v2', got {version!r}")
        return 1 if version == "v1" else 0

    def has_g_idx(self, attrs) -> bool:
        return bool(attrs.get("act_order", False))

    def roles(self, shape, attrs):
        n, k = self.check_shape(shape, attrs)
        if k % self.per_word or n % self.per_word:
            self.fail(f"N = {n} and K = {k} must be multiples of {self.per_word} "
                      f"({self.bits}-bit values packed in int32)")
        self.zero_offset(attrs)
        g = self.groups(k, attrs)
        roles = [spec("qweight", (k // self.per_word, n), I32),
                 spec("qzeros", (g, n // self.per_word), I32),
                 spec("scales", (g, n), F16)]
        if self.has_g_idx(attrs):
            roles.append(spec("g_idx", (k,), I32))
        return roles

    def unpack_q(self, qweight, n, k):
        q = (qweight[:, None, :] >> self.shifts[None, :, None]) & self.mask
        return q.reshape(k, n)

    def unpack_cols(self, packed):
        return ((packed[:, :, None] >> self.shifts) & self.mask).reshape(packed.shape[0], -1)

    def q_expr(self, qweight, n, k, shape):
        per_shift = self.per_word.bit_length() - 1
        word = qweight.word((k >> per_shift) * shape[0] + n)
        return (word >> ((k & (self.per_word - 1)) * self.bits)) & self.mask

    def col_shift_expr(self, n):
        return (n & (self.per_word - 1)) * self.bits

    @property
    def run_unit(self) -> int:
        return self.per_word

    def q_run(self, qweight, n, k0, count, shape):
        per_shift = self.per_word.bit_length() - 1
        out = []
        for i in range(count):
            word = qweight.word(((k0 >> per_shift) + i // self.per_word) * shape[0] + n)
            out.append((word >> (i % self.per_word) * self.bits) & self.mask)
        return out

    def pack_q(self, q):
        k, n = q.shape
        return _pack_last(q.reshape(k // self.per_word, self.per_word, n).transpose(0, 2, 1),
                          self.shifts)

    def pack_cols(self, values):
        g, n = values.shape
        return _pack_last(values.reshape(g, n // self.per_word, self.per_word), self.shifts)

    def quantize_groups(self, w, gs, attrs):
        if not self.has_g_idx(attrs):
            return super().quantize_groups(w, gs, attrs)
        # act-order: rows of K in decreasing order of importance (here the column energy,
        # where GPTQ uses the Hessian diagonal), grouped in that order
        perm = np.argsort(-(w.astype(np.float64) ** 2).sum(0), kind="stable")
        g_idx = np.empty(w.shape[1], np.int64)
        g_idx[perm] = np.arange(w.shape[1]) // gs
        return g_idx

    def scale_zero(self, lo, hi, attrs):
        if not attrs.get("sym", True):
            scale, zero = super().scale_zero(lo, hi, attrs)
            # v1 cannot store a zero of 0 (it stores zero - 1)
            return scale, np.clip(zero, self.zero_offset(attrs), self.mask)
        amax = np.maximum(-lo, hi)
        scale = 2 * amax / self.mask
        scale = np.where(scale == 0, 1, scale)
        return scale, np.full(scale.shape, (self.mask + 1) // 2, np.float32)


class AWQ(GroupedIntFormat):
    attr_names = frozenset({"group_size", "version"})
    #: nibble position of column c % 8 (the inverse of AWQ_ORDER)
    positions = np.argsort(AWQ_ORDER).astype(np.uint32)

    def __init__(self):
        super().__init__("awq:int4", 4)

    def roles(self, shape, attrs):
        n, k = self.check_shape(shape, attrs)
        if n % 8:
            self.fail(f"N = {n} must be a multiple of 8 (8 int4 columns per int32)")
        if attrs.get("version", "gemm") != "gemm":
            self.fail(f"only the GEMM packing is supported, not {attrs.get('version')!r}")
        g = self.groups(k, attrs)
        return [spec("qweight", (k, n // 8), I32), spec("qzeros", (g, n // 8), I32),
                spec("scales", (g, n), F16)]

    def unpack_q(self, qweight, n, k):
        return self.unpack_cols(qweight)

    def unpack_cols(self, packed):
        return ((packed[:, :, None] >> (4 * self.positions)) & 15).reshape(packed.shape[0], -1)

    def q_expr(self, qweight, n, k, shape):
        word = qweight.word(k * (shape[0] // 8) + (n >> 3))
        return (word >> self.col_shift_expr(n)) & 15

    def col_shift_expr(self, n):
        c = n & 7  # nibble position of column c is (c >> 1) + 4 * (c & 1)
        return ((c >> 1) + ((c & 1) << 2)) << 2

    #: a word holds 8 columns of one k: consecutive k are a row of words apart
    run_unit = 1

    def q_run(self, qweight, n, k0, count, shape):
        return [self.q_expr(qweight, n, k0 + i, shape) for i in range(count)]

    def pack_q(self, q):
        return self.pack_cols(q)

    def pack_cols(self, values):
        r, n = values.shape
        return _pack_last(values.reshape(r, n // 8, 8), 4 * self.positions)


INT_FORMATS = [GPTQ(4), GPTQ(8), AWQ()]

