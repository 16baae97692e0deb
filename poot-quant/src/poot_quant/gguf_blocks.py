"""GGUF block formats: one decode rule per type, read three ways.

A GGUF row of K values is K/B blocks of `type_size` bytes. Each type states the
value of element j of one block once, in `affine(blk, j)` = (scale, value, offset),
element = scale * value + offset, over a small block accessor. `NumpyBlocks`
evaluates that rule for all blocks at once (j is an array of 0..B-1; the numpy
reference decode), `ExprBlock` builds it as a scalar program over u32 word loads
(the in-kernel decode of one element). The two differ only in how bytes are
fetched and how ints become floats, so their f32 results agree bit for bit; tests
check that, and check both against the `gguf` package and against hand-written
blocks. `RunBlock` builds it for a run of consecutive elements (`decode_run`):
their indices are constants past a runtime start, so field positions fold, each
word is loaded once and the scale and offset of `scale_group` elements are shared.
"""
from __future__ import annotations

import math

import numpy as np
from poot.codegen.expr import Expr, ge, select, u32
from poot.dtypes import DType
from poot.formats import IntGroup, RunPart
from poot.optional import require

from poot_quant import exprs
from poot_quant.base import Format, f16_to_f32, spec
from poot_quant.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType


#: values decoded per numpy pass (a chunk of whole blocks)
DECODE_CHUNK_VALUES = 1 << 18


class NumpyBlocks:
    """Element rules evaluated over every block: blocks is uint8 [n_blocks, type_size]."""

    def __init__(self, blocks: np.ndarray):
        self.blocks = blocks

    def byte(self, offset) -> np.ndarray:
        if isinstance(offset, (int, np.integer)):
            return self.blocks[:, offset:offset + 1].astype(np.uint32)
        first = int(offset[0])
        if np.array_equal(offset, np.arange(first, first + offset.size)):  # a plain slice
            return self.blocks[:, first:first + offset.size].astype(np.uint32)
        return self.blocks[:, offset].astype(np.uint32)

    def u32(self, offset: int) -> np.ndarray:
        b = self.blocks[:, offset:offset + 4].astype(np.uint32)
        return (b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24)[:, None]

    def f16(self, offset: int) -> np.ndarray:
        return f16_to_f32(self.blocks[:, offset:offset + 2])[:, None]

    @staticmethod
    def to_f32(x):
        return x.astype(np.float32)

    @staticmethod
    def to_i32(x):
        return x.astype(np.int32)

    @staticmethod
    def sign_extend8(x):
        return (x ^ 0x80).astype(np.int32) - 0x80

    @staticmethod
    def table16(index, values):
        return np.asarray(values, np.int32)[index]

    @staticmethod
    def where_ge(x, bound: int, then, otherwise):
        return np.where(x >= bound, then, otherwise)

    @staticmethod
    def e8m0_half(e):
        bits = np.where(e >= 2, (e - 1) << 23, np.uint32(0x00200000) << e).astype(np.uint32)
        return bits.view(np.float32)


class ExprBlock:
    """Element rules as scalar programs: the block starts at byte `base` of "blocks" (a
    multiple of 4 when `aligned`)."""

    def __init__(self, words: exprs.Words, base: Expr, aligned: bool = False):
        self.words, self.base, self.aligned = words, base, aligned

    def byte(self, offset) -> Expr:
        return self.words.byte(self.base + offset)

    def u32(self, offset: int) -> Expr:
        """Bytes offset .. offset + 3 of the block as one little-endian U32."""
        if self.aligned and offset % 4 == 0:
            return self.words.word((self.base >> 2) + offset // 4)
        return _bytes_u32(self, offset)

    def f16(self, offset: int) -> Expr:
        return self.words.f16(self.base + offset)

    @staticmethod
    def to_f32(x: Expr) -> Expr:
        return x.cast(DType.F32)

    @staticmethod
    def to_i32(x: Expr) -> Expr:
        return x.bitcast(DType.I32)

    @staticmethod
    def sign_extend8(x: Expr) -> Expr:
        return exprs.sign_extend(x, 8)

    @staticmethod
    def table16(index: Expr, values) -> Expr:
        return exprs.table16(index, values)

    @staticmethod
    def where_ge(x: Expr, bound: int, then: Expr, otherwise: Expr) -> Expr:
        return select(ge(x, u32(bound)), then, otherwise)

    @staticmethod
    def e8m0_half(e: Expr) -> Expr:
        return exprs.e8m0_half_bits_to_f32(e)


class RunIndex:
    """An element index j = dyn + fixed within a block, while decoding a run: `dyn` a U32
    expression, a multiple of `align` (a power of two) in [0, top]; `fixed` an int below
    `align`. The layout rules' shifts, masks and sums keep the bits below the alignment
    constant, so the positions of a run's fields in its words fold to constants."""

    def __init__(self, dyn: Expr, fixed: int, align: int, top: int):
        self.dyn, self.fixed, self.align, self.top = dyn, fixed, align, top

    def __rshift__(self, s: int):
        if 1 << s <= self.align:
            return index(self.dyn >> s, self.fixed >> s, self.align >> s, self.top >> s)
        return index(self.dyn >> s, 0, 1, self.top >> s)  # fixed < align | 2^s: no carry

    def __lshift__(self, s: int):
        return index(self.dyn << s, self.fixed << s, self.align << s, self.top << s)

    def __and__(self, mask: int):
        assert mask & (mask + 1) == 0, mask                 # 2^t - 1
        if mask < self.align:
            return self.fixed & mask
        return index(self.dyn & mask, self.fixed, self.align, min(self.top, mask))

    def __add__(self, o):
        if isinstance(o, RunIndex):
            return index(self.dyn + o.dyn, self.fixed + o.fixed, min(self.align, o.align),
                         self.top + o.top)
        assert o >= 0, o
        return index(self.dyn, self.fixed + o, self.align, self.top)

    __radd__ = __add__

    @property
    def max(self) -> int:
        return self.top + self.fixed

    def expr(self) -> Expr:
        return self.dyn + self.fixed


def _bytes_u32(blk, offset: int) -> Expr:
    """Four bytes of a block composed into one little-endian U32."""
    return (blk.byte(offset) | (blk.byte(offset + 1) << 8) | (blk.byte(offset + 2) << 16)
            | (blk.byte(offset + 3) << 24))


def index(dyn: Expr, fixed: int, align: int, top: int):
    """dyn + fixed as a RunIndex (a fixed part past `align` carried into dyn), or the int
    `fixed` when dyn is always 0 (top == 0)."""
    if top == 0:
        return fixed
    carry = fixed - fixed % align
    return RunIndex(dyn + carry if carry else dyn, fixed - carry, align, top + carry)


def scalar(x):
    """A RunIndex as its expression; anything else as it is."""
    return x.expr() if isinstance(x, RunIndex) else x


class RunBlock(ExprBlock):
    """Element rules for a run within one block: j is an int or a RunIndex. The block's
    bytes start `lead` bytes into word `first` of the source. When the run's start is known
    mod 4, `lead` is an int and every field sits at a constant place in its word; else it
    is a runtime byte count and each word of the block is realigned from two words. Loads
    repeated across elements and blocks are merged by the kernel (let_shared)."""

    def __init__(self, words: exprs.Words, first: Expr, lead, type_size: int):
        self.words, self.first, self.lead, self.type_size = words, first, lead, type_size

    def bits(self, offset, width: int) -> Expr:
        """The `width` (8 or 16) bits at byte `offset` of the block (an int or RunIndex;
        16-bit fields at even offsets), as a U32."""
        if isinstance(self.lead, int):
            at = self.lead + offset
            word = self.words.word(self.first + scalar(at >> 2))
        else:
            at, word = offset, self.realigned(offset >> 2)
        return (word >> scalar((at & 3) << 3)) & ((1 << width) - 1)

    def word32(self, offset):
        """Bytes offset .. offset + 3 of the block as one U32 (two words funnelled where
        they straddle one), or None when the block's start is known only at run time."""
        if not isinstance(self.lead, int):
            return None
        at = self.lead + offset
        shift = at & 3
        if not isinstance(shift, int):
            return None
        first = self.first + scalar(at >> 2)
        lo = self.words.word(first)
        if shift == 0:
            return lo
        return (lo >> (8 * shift)) | (self.words.word(first + 1) << (32 - 8 * shift))

    def realigned(self, c) -> Expr:
        """Bytes 4c .. 4c + 3 of a block that starts `lead` (runtime) bytes into a word."""
        shift = self.lead << 3
        lo = self.words.word(self.first + scalar(c))
        if 4 * (c.max if isinstance(c, RunIndex) else c) + 4 < self.type_size:
            hi = self.words.word(self.first + scalar(c) + 1)
            return (lo >> shift) | ((hi << (24 - shift)) << 8)
        # the block's last bytes lie in the word that holds the first of them, whatever
        # the lead (type_size = 1 or 2 mod 4; the runtime lead is 0..3, or 0 or 2 if even)
        assert isinstance(c, int) and (-self.type_size) % 4 >= 2 + self.type_size % 2
        return lo >> shift

    def byte(self, offset) -> Expr:
        return self.bits(offset, 8)

    def u32(self, offset: int) -> Expr:
        word = self.word32(offset)
        return _bytes_u32(self, offset) if word is None else word

    def f16(self, offset: int) -> Expr:
        return exprs.half_bits_to_f32(self.bits(offset, 16))

    @staticmethod
    def to_f32(x) -> Expr:
        return exprs.small_uint_to_f32(*exprs.biased(x))

    @staticmethod
    def to_i32(x: Expr) -> exprs.Biased:
        return exprs.Biased(x)

    @staticmethod
    def sign_extend8(x: Expr) -> exprs.Biased:
        return exprs.Biased(x ^ 0x80, 0x80)

    @staticmethod
    def table16(index: Expr, values) -> exprs.Biased:
        return exprs.Biased(exprs.table16_byte(index, values) ^ 0x80, 0x80)

    @staticmethod
    def where_ge(x, bound: int, then: Expr, otherwise: Expr) -> Expr:
        if isinstance(x, int):
            return then if x >= bound else otherwise
        return select(ge(scalar(x), u32(bound)), then, otherwise)


class GGUFBlockFormat(Format):
    """A GGUF quant type; the single source "blocks" is the tensor's raw bytes (uint8)."""

    qtype: GGMLQuantizationType
    #: elements one GEMV lane decodes at once (a power of two dividing the block): the
    #: whole block for 32-element types; for 256-element types the shortest run in which
    #: the bit position of each element's fields is a constant (few bytes per lane)
    run = 32
    #: consecutive elements that share a scale and an offset (a divisor of `run`)
    scale_group = 32
    #: where the integer quants lie as bytes, for `int_run`: (byte offset of the field,
    #: its layout (element j -> (byte, shift), 4 consecutive elements in 4 consecutive
    #: bytes at one shift), mask, xor that makes the field u of `affine`'s q = u - bias);
    #: None: the format's integers are not whole bytes or nibbles
    quant_bytes = None
    #: `affine` gives every element as scale * integer (+ offset)
    integer_codes = True

    def __init__(self):
        self.name = f"gguf:{self.qtype.name}"
        self.block_size, self.type_size = GGML_QUANT_SIZES[self.qtype]
        self.block_shift = self.block_size.bit_length() - 1

    def affine(self, blk, j):
        """Element j of a block as (scale, q, offset): x = scale * f32(q) + offset for an
        integer q (offset None: 0); scale and offset are the same for each `scale_group`."""
        raise NotImplementedError

    def element(self, blk, j):
        """The f32 value of element j of a block."""
        scale, q, offset = self.affine(blk, j)
        x = scale * blk.to_f32(q)
        return x if offset is None else x + offset

    def roles(self, shape, attrs):
        n, k = self.check_shape(shape, attrs)
        if k % self.block_size:
            self.fail(f"K = {k} is not a multiple of the block size {self.block_size}")
        return [spec("blocks", (n, k // self.block_size * self.type_size), DType.U8)]

    def decode(self, arrays, shape, attrs):
        blocks = arrays["blocks"].reshape(-1, self.type_size)
        out = np.empty((blocks.shape[0], self.block_size), np.float32)
        j = np.arange(self.block_size, dtype=np.uint32)
        step = max(1, DECODE_CHUNK_VALUES // self.block_size)  # temporaries stay cache-sized
        for start in range(0, blocks.shape[0], step):
            out[start:start + step] = self.element(NumpyBlocks(blocks[start:start + step]), j)
        return out.reshape(shape)

    def decode_expr(self, load, n, k, shape, attrs):
        self.check_expr_sources(shape, attrs)
        n, k = exprs.as_u32(n), exprs.as_u32(k)
        blocks_per_row = shape[1] // self.block_size
        block = n * blocks_per_row + (k >> self.block_shift)
        blk = ExprBlock(exprs.Words(load, "blocks"), block * self.type_size,
                        aligned=self.type_size % 4 == 0)
        return self.element(blk, k & (self.block_size - 1))

    def run_length(self, shape, attrs) -> int:
        """`run`; for 32-element types in rows that start on a word, as many whole blocks
        as span whole words, so that the fields of every run sit at constant places."""
        row_bytes = shape[1] // self.block_size * self.type_size
        if self.run == self.block_size and row_bytes % 4 == 0:
            return self.run * 4 // math.gcd(self.type_size, 4)
        return self.run

    def word_chunks(self, shape, attrs) -> dict:
        """Rows of whole words: the fewest whole blocks that end on a word are a chunk."""
        n, k = self.check_shape(shape, attrs)
        if k // self.block_size * self.type_size % 4:
            return {}
        blocks = 4 // math.gcd(self.type_size, 4)
        return {"blocks": (self.block_size * blocks, self.type_size * blocks // 4)}

    def decode_run(self, load, n, k0, shape, attrs) -> list[RunPart]:
        self.check_expr_sources(shape, attrs)
        n, k0 = exprs.as_u32(n), exprs.as_u32(k0)
        bs, ts = self.block_size, self.type_size
        run = self.run_length(shape, attrs)
        blocks = max(1, run // bs)
        base = (n * (shape[1] // bs) + (k0 >> self.block_shift)) * ts
        words = exprs.Words(load, "blocks")
        if (shape[1] // bs * ts) % 4 == 0 and blocks * ts % 4 == 0:  # the run starts on a word
            accessors = [RunBlock(words, base >> 2, i * ts, ts) for i in range(blocks)]
        else:
            accessors = [RunBlock(words, base >> 2, base & 3, ts)]
        within = min(run, bs)
        start = index(k0 & (bs - 1), 0, within, bs - within)   # 0 when runs are whole blocks
        parts = []
        for blk in accessors:
            for g in range(0, within, self.scale_group):
                scale, _, offset = self.affine(blk, start + g)
                qs = [self.affine(blk, start + (g + i))[1] for i in range(self.scale_group)]
                parts.append(exprs.int_part(qs, scale, offset))
        return parts

    def int_run(self, load, n, k0, shape, attrs) -> list[IntGroup] | None:
        """The run of `decode_run` as IntGroups of 32 (see `quant_bytes`), or None."""
        if self.quant_bytes is None or self.scale_group != 32:
            return None
        self.check_expr_sources(shape, attrs)
        n, k0 = exprs.as_u32(n), exprs.as_u32(k0)
        bs, ts = self.block_size, self.type_size
        run = self.run_length(shape, attrs)
        blocks = max(1, run // bs)
        if (shape[1] // bs * ts) % 4 or blocks * ts % 4:
            return None                                 # fields at run-time places
        base = (n * (shape[1] // bs) + (k0 >> self.block_shift)) * ts
        words = exprs.Words(load, "blocks")
        within = min(run, bs)
        start = index(k0 & (bs - 1), 0, within, bs - within)
        offset, layout, mask, flip = self.quant_bytes
        spread = lambda x: x * 0x01010101  # noqa: E731 - a byte value in every byte
        groups = []
        for i in range(blocks):
            blk = RunBlock(words, base >> 2, i * ts, ts)
            for g in range(0, within, 32):
                scale, q, shift_offset = self.affine(blk, start + g)
                quads = []
                for e in range(0, 32, 4):
                    position, shift = layout(start + (g + e))
                    word = blk.word32(offset + position)
                    if word is None or not isinstance(shift, int):
                        return None
                    quad = (word >> shift if shift else word) & spread(mask)
                    quads.append(quad ^ spread(flip) if flip else quad)
                bias = exprs.biased(q)[1]
                if not isinstance(bias, int):
                    return None
                groups.append(IntGroup(quads, mask.bit_length(), bias, scale, shift_offset))
        return groups

    # -- quantization -------------------------------------------------------------
    def quantize(self, w, **attrs) -> list[np.ndarray]:
        w = np.asarray(w, np.float32)
        if w.ndim != 2:
            self.fail(f"quantize takes a 2-D [N, K] weight, got shape {list(w.shape)}")
        self.roles(w.shape, attrs)
        blocks = self.quantize_blocks(w.reshape(-1, self.block_size))
        return [np.ascontiguousarray(blocks, np.uint8).reshape(w.shape[0], -1)]

    #: the poot_quant.gguf_quantize function for types the gguf package cannot quantize
    quantizer: str | None = None

    def quantize_blocks(self, x: np.ndarray) -> np.ndarray:
        if self.quantizer is None:
            return require("gguf.quants").quantize(x, self.qtype)
        from poot_quant import gguf_quantize

        return getattr(gguf_quantize, self.quantizer)(x)


# -- bit-field layouts: (byte position within the field, shift) of element j ----------------
def nibble32_at(j):
    """32 nibbles: byte j % 16 holds element j (low nibble) and j + 16 (high nibble)."""
    return j & 15, (j >> 4) << 2


def high_bit32_at(j):
    """A little-endian 32-bit mask: bit j."""
    return j >> 3, j & 7


def two_bits_at(j):
    """Q2_K/Q3_K/Q6_K 2-bit fields: each 128-element half uses 32 bytes, field (j/32)%4."""
    return ((j >> 7) << 5) + (j & 31), ((j >> 5) & 3) << 1


def bit_plane_at(j):
    """Q3_K/Q5_K high bits: bit j/32 of byte j%32."""
    return j & 31, j >> 5


def kquant_nibble_at(j):
    """Q4_K/Q5_K low 4 bits: each 64 elements use 32 bytes, low nibble first."""
    return ((j >> 6) << 5) + (j & 31), ((j >> 5) & 1) << 2


def q6_low_at(j):
    """Q6_K low 4 bits: each 128 elements use 64 bytes, low nibble first."""
    return ((j >> 7) << 6) + (j & 63), ((j >> 6) & 1) << 2


def q3_scale_low_at(i):
    """Q3_K 6-bit scale i (0..15): low 4 bits in byte i % 8, nibble i / 8 ..."""
    return i & 7, (i >> 3) << 2


def q3_scale_high_at(i):
    """... top 2 bits in byte 8 + i % 4, 2-bit field i / 4."""
    return i & 3, (i >> 2) << 1


def field(blk, offset: int, layout, j, mask: int):
    """The bit field of element j stored with `layout` in the bytes at `offset`."""
    position, shift = layout(j)
    return (blk.byte(offset + position) >> scalar(shift)) & mask


def nibble32(blk, offset: int, j):
    return field(blk, offset, nibble32_at, j, 15)


def high_bit32(blk, offset: int, j):
    return field(blk, offset, high_bit32_at, j, 1)


class Q4_0(GGUFBlockFormat):
    """f16 d, 16 bytes of nibbles; x = d * (q - 8)."""
    qtype = GGMLQuantizationType.Q4_0

    quant_bytes = (2, nibble32_at, 15, 0)

    def affine(self, blk, j):
        return blk.f16(0), blk.to_i32(nibble32(blk, 2, j)) - 8, None


class Q4_1(GGUFBlockFormat):
    """f16 d, f16 m, 16 bytes of nibbles; x = d * q + m."""
    qtype = GGMLQuantizationType.Q4_1

    quant_bytes = (4, nibble32_at, 15, 0)

    def affine(self, blk, j):
        return blk.f16(0), nibble32(blk, 4, j), blk.f16(2)


class Q5_0(GGUFBlockFormat):
    """f16 d, u32 high bits, 16 bytes of nibbles; x = d * (q - 16)."""
    qtype = GGMLQuantizationType.Q5_0

    def affine(self, blk, j):
        q = nibble32(blk, 6, j) | (high_bit32(blk, 2, j) << 4)
        return blk.f16(0), blk.to_i32(q) - 16, None


class Q5_1(GGUFBlockFormat):
    """f16 d, f16 m, u32 high bits, 16 bytes of nibbles; x = d * q + m."""
    qtype = GGMLQuantizationType.Q5_1

    def affine(self, blk, j):
        q = nibble32(blk, 8, j) | (high_bit32(blk, 4, j) << 4)
        return blk.f16(0), q, blk.f16(2)


class Q8_0(GGUFBlockFormat):
    """f16 d, 32 int8; x = d * q."""
    qtype = GGMLQuantizationType.Q8_0

    quant_bytes = (2, lambda j: (j, 0), 255, 0x80)

    def affine(self, blk, j):
        return blk.f16(0), blk.sign_extend8(blk.byte(2 + j)), None


IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class IQ4_NL(GGUFBlockFormat):
    """f16 d, 16 bytes of nibbles indexing a non-linear table; x = d * table[q]."""
    qtype = GGMLQuantizationType.IQ4_NL

    def affine(self, blk, j):
        return blk.f16(0), blk.table16(nibble32(blk, 2, j), IQ4_NL_VALUES), None

    quantizer = "quantize_iq4_nl"


#: E2M1 values doubled (ggml's convention: the scale below is halved to match)
E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


class MXFP4(GGUFBlockFormat):
    """u8 E8M0 exponent e, 16 bytes of E2M1 nibbles; x = 2^(e-128) * (2 * e2m1[q])."""
    qtype = GGMLQuantizationType.MXFP4

    def affine(self, blk, j):
        return blk.e8m0_half(blk.byte(0)), blk.table16(nibble32(blk, 1, j), E2M1_DOUBLED), None


# -- the 256-element K-quants -----------------------------------------------------------
def packed_scale_min6(blk, offset: int, i):
    """Q4_K/Q5_K: 6-bit scale and min of sub-block i (0..7) from 12 bytes at `offset`.
    Sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 take
    their low 4 bits from bytes 8-11 and their top 2 bits from bits 6-7 of bytes 0-7.
    Decoded four sub-blocks at a time from three words at fixed places (the half of the
    block that holds i picks the form), then sub-block i's byte: a GEMV lane's runs share
    the select and the shift across its columns, and no word is read at a per-lane place."""
    scales, mins, mixed = blk.u32(offset), blk.u32(offset + 4), blk.u32(offset + 8)
    low6, high2, low4 = 0x3F3F3F3F, 0xC0C0C0C0, 0x0F0F0F0F
    half = i >> 2                       # one expression for the sub-blocks of a run
    scale4 = blk.where_ge(half, 1, (mixed & low4) | ((scales & high2) >> 2), scales & low6)
    min4 = blk.where_ge(half, 1, ((mixed >> 4) & low4) | ((mins & high2) >> 2), mins & low6)
    shift = scalar((i & 3) << 3)
    return (scale4 >> shift) & 0xFF, (min4 >> shift) & 0xFF


def two_bits(blk, offset: int, j):
    return field(blk, offset, two_bits_at, j, 3)


def bit_plane(blk, offset: int, j):
    return field(blk, offset, bit_plane_at, j, 1)


class Q2_K(GGUFBlockFormat):
    """16 scale bytes (4-bit scale, 4-bit min per 16), 64 bytes of 2-bit q, f16 d, f16 dmin;
    x = (d * sc) * q - dmin * m."""
    qtype = GGMLQuantizationType.Q2_K
    run, scale_group = 128, 16

    def affine(self, blk, j):
        sm = blk.byte(j >> 4)
        q = two_bits(blk, 16, j)
        return blk.f16(80) * blk.to_f32(sm & 15), q, -(blk.f16(82) * blk.to_f32(sm >> 4))

    quantizer = "quantize_q2_k"


class Q3_K(GGUFBlockFormat):
    """32 bytes high-bit mask, 64 bytes 2-bit low q, 12 bytes of 6-bit signed scales, f16 d;
    x = (d * (sc - 32)) * (low + 4 * high - 4)."""
    qtype = GGMLQuantizationType.Q3_K
    run, scale_group = 128, 16

    def affine(self, blk, j):
        q = blk.to_i32(two_bits(blk, 32, j) | (bit_plane(blk, 0, j) << 2)) - 4
        i = j >> 4
        low, high = field(blk, 96, q3_scale_low_at, i, 15), field(blk, 104, q3_scale_high_at, i, 3)
        scale = blk.to_i32(low | (high << 4)) - 32
        return blk.f16(108) * blk.to_f32(scale), q, None

    quantizer = "quantize_q3_k"


def kquant_nibble(blk, offset: int, j):
    return field(blk, offset, kquant_nibble_at, j, 15)


class Q4_K(GGUFBlockFormat):
    """f16 d, f16 dmin, 12 bytes of 6-bit scales/mins per 32, 128 bytes of nibbles;
    x = (d * sc) * q - dmin * m."""
    qtype = GGMLQuantizationType.Q4_K
    run = 64
    quant_bytes = (16, kquant_nibble_at, 15, 0)

    def affine(self, blk, j):
        scale, minimum = packed_scale_min6(blk, 4, j >> 5)
        q = kquant_nibble(blk, 16, j)
        return blk.f16(0) * blk.to_f32(scale), q, -(blk.f16(2) * blk.to_f32(minimum))

    quantizer = "quantize_q4_k"


class Q5_K(GGUFBlockFormat):
    """Q4_K plus 32 bytes of high bits (bit j/32 of byte j%32) before the nibbles."""
    qtype = GGMLQuantizationType.Q5_K
    run = 64

    def affine(self, blk, j):
        scale, minimum = packed_scale_min6(blk, 4, j >> 5)
        q = kquant_nibble(blk, 48, j) | (bit_plane(blk, 16, j) << 4)
        return blk.f16(0) * blk.to_f32(scale), q, -(blk.f16(2) * blk.to_f32(minimum))

    quantizer = "quantize_q5_k"


class Q6_K(GGUFBlockFormat):
    """128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, f16 d;
    x = (d * sc) * (q - 32)."""
    qtype = GGMLQuantizationType.Q6_K
    run, scale_group = 128, 16

    def affine(self, blk, j):
        low = field(blk, 0, q6_low_at, j, 15)
        q = blk.to_i32(low | (two_bits(blk, 128, j) << 4)) - 32
        scale = blk.sign_extend8(blk.byte(192 + (j >> 4)))
        return blk.f16(208) * blk.to_f32(scale), q, None

    quantizer = "quantize_q6_k"


GGUF_FORMATS = [cls() for cls in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
                                  IQ4_NL, MXFP4)]
