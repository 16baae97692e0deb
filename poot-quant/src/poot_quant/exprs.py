"""Shared pieces of the in-kernel decode programs (scalar expressions over u32 word loads).

Every format's `decode_expr` is built from these: a byte/halfword reader over a
source viewed as little-endian u32 words, integer-only conversions of the small
float encodings (e4m3, e5m2, e2m1, e8m0; f16 is poot.codegen.expr's
half_bits_to_f32) to f32 bits, sign extension and a 16-entry int8 table lookup.
They use only shifts, masks, integer add/sub/mul, Select, Cast and Bitcast, so
every backend prints them without format knowledge.

Conversions never produce an f32 subnormal through arithmetic on a subnormal
operand (a device that flushes subnormals would change it); subnormal inputs
are rebuilt as an exact product `mantissa * 2^-n` of normal numbers instead.
"""
from __future__ import annotations

from collections.abc import Callable

from poot.codegen.expr import Bin, Const, Expr, f32, ge, half_bits_to_f32, select, u32
from poot.dtypes import DType
from poot.errors import FormatError
from poot.formats import RunPart
from poot.ir.ops.elementwise import BinaryOp

I32, U32, F32 = DType.I32, DType.U32, DType.F32

Loader = Callable[[str, Expr], Expr]

F32_QUIET_NAN = 0x7FC00000
#: byte offsets are computed in u32, so one source may hold at most 4 GiB
MAX_SOURCE_BYTES = 1 << 32


def as_u32(x) -> Expr:
    """An index value (Python int or I32/U32 expression) as a U32 expression."""
    if isinstance(x, Expr):
        return x if x.dtype is U32 else x.bitcast(U32)
    return u32(x)


def check_addressable(fmt: str, role: str, nbytes: int) -> None:
    if nbytes > MAX_SOURCE_BYTES:
        raise FormatError(f"{fmt}: source {role!r} holds {nbytes} bytes; decode programs "
                          f"address at most {MAX_SOURCE_BYTES} bytes (u32 byte offsets)")


class Words:
    """One source buffer read through 32-bit word loads."""

    def __init__(self, load: Loader, role: str):
        self.load, self.role = load, role

    def word(self, index) -> Expr:
        return self.load(self.role, as_u32(index).bitcast(I32))

    def byte(self, offset) -> Expr:
        """The byte at `offset` (U32), as a U32 in [0, 255]."""
        offset = as_u32(offset)
        return (self.word(offset >> 2) >> ((offset & 3) << 3)) & 0xFF

    def half(self, offset) -> Expr:
        """The 16-bit halfword at an even byte `offset`, as a U32 in [0, 65535]."""
        offset = as_u32(offset)
        return (self.word(offset >> 2) >> ((offset & 2) << 3)) & 0xFFFF

    def f16(self, offset) -> Expr:
        return half_bits_to_f32(self.half(offset))

    def f32(self, index) -> Expr:
        return self.word(index).bitcast(F32)


def sign_extend(x: Expr, bits: int) -> Expr:
    """The low `bits` of U32 x read as a two's complement integer (I32)."""
    top = 1 << (bits - 1)
    return (x ^ top).bitcast(I32) - top


def _with_sign(magnitude_bits: Expr, sign_bits: Expr) -> Expr:
    return (magnitude_bits | sign_bits).bitcast(F32)


def e4m3_bits_to_f32(b: Expr) -> Expr:
    """OCP FP8 E4M3 (fn: no Inf, S.1111.111 is NaN) to f32."""
    sign = (b & 0x80) << 24
    magnitude = b & 0x7F
    normal = (magnitude << 20) + ((127 - 7) << 23)
    subnormal = ((b & 0x7).cast(F32) * f32(2.0 ** -9)).bitcast(U32)
    bits = select(ge(magnitude, u32(0x7F)), u32(F32_QUIET_NAN),
                  select(ge(magnitude, u32(0x08)), normal, subnormal))
    return _with_sign(bits, sign)


def e5m2_bits_to_f32(b: Expr) -> Expr:
    """OCP FP8 E5M2 (the top byte of an f16) to f32; NaNs become the quiet NaN."""
    magnitude = b & 0x7F
    value = half_bits_to_f32(b << 8)
    nan = ((b & 0x80) << 24 | F32_QUIET_NAN).bitcast(F32)
    return select(ge(magnitude, u32(0x7D)), nan, value)


def e2m1_bits_to_f32(nib: Expr) -> Expr:
    """OCP FP4 E2M1 (4 bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives) to f32."""
    sign = (nib & 0x8) << 28
    magnitude = nib & 0x7
    normal = (magnitude << 22) + ((127 - 1) << 23)
    subnormal = (magnitude & 1) * 0x3F000000  # 0 or 0.5
    return _with_sign(select(ge(magnitude, u32(2)), normal, subnormal), sign)


def e8m0_bits_to_f32(e: Expr) -> Expr:
    """OCP E8M0 scale: 2^(e-127); 0xFF is NaN; e = 0 is the f32 subnormal 2^-127."""
    bits = select(ge(e, u32(0xFF)), u32(F32_QUIET_NAN),
                  select(ge(e, u32(1)), e << 23, u32(0x00400000)))
    return bits.bitcast(F32)


def e8m0_half_bits_to_f32(e: Expr) -> Expr:
    """ggml's MXFP4 scale 2^(e-128) (half the OCP value, paired with doubled E2M1 ints);
    finite for every e (e = 255 gives 2^127)."""
    return select(ge(e, u32(2)), (e - 1) << 23, u32(0x00200000) << e).bitcast(F32)


def table16_byte(index: Expr, values: tuple[int, ...]) -> Expr:
    """The byte (U32) of values[index] for a 4-bit U32 index and 16 int8 values, from packed
    constants."""
    if len(values) != 16:
        raise ValueError("table16 takes 16 values")
    packed = [sum(((v & 0xFF) << (8 * i)) for i, v in enumerate(values[w * 4:w * 4 + 4]))
              for w in range(4)]
    hi = index >> 3 & 1
    mid = index >> 2 & 1
    low_pair = select(mid.bitcast(I32), u32(packed[1]), u32(packed[0]))
    high_pair = select(mid.bitcast(I32), u32(packed[3]), u32(packed[2]))
    word = select(hi.bitcast(I32), high_pair, low_pair)
    return (word >> ((index & 3) << 3)) & 0xFF


def table16(index: Expr, values: tuple[int, ...]) -> Expr:
    """values[index] (I32) for a 4-bit U32 index and 16 int8 values."""
    return sign_extend(table16_byte(index, values), 8)


def small_uint_to_f32(u: Expr, minus=0) -> Expr:
    """f32(u - minus) for a U32 u < 2^23 (minus: an int or a U32 below 2^23), exactly: u
    ORed into the mantissa of 2^23, less 2^23 + minus. Two full-rate ops (an OR the mask
    before it usually absorbs, and a subtraction) where an int-to-float conversion runs at
    a fraction of the rate; runs of 4-bit weights have few ops to spare per element."""
    magic = (as_u32(minus) | 0x4B000000).bitcast(F32) if isinstance(minus, Expr) \
        else f32(8388608.0 + minus)
    return (u | 0x4B000000).bitcast(F32) - magic


def div_const(x: Expr, d: int) -> Expr:
    """x // d for a non-negative U32 x and a positive constant d (a shift when d is 2^m)."""
    return x >> (d.bit_length() - 1) if d & (d - 1) == 0 else x // d


# -- runs: integers to floats at full rate ------------------------------------------------
class Biased:
    """The integer u - bias of a U32 u (bias an int or a U32): run decoding keeps integers
    unsigned until they become floats, so that the bias costs nothing there."""

    def __init__(self, u: Expr, bias=0):
        self.u, self.bias = u, bias

    def __sub__(self, c: int):
        return Biased(self.u, self.bias + c)


def biased(q) -> tuple:
    """(u, bias) of a Biased or of a plain U32."""
    return (q.u, q.bias) if isinstance(q, Biased) else (q, 0)


def bound(e: Expr) -> int:
    """An upper bound of a U32 expression built from masks, shifts and ors of fields."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Bin):
        a, b = bound(e.a), bound(e.b)
        if e.op is BinaryOp.And:
            return min(a, b)
        if e.op in (BinaryOp.Or, BinaryOp.Xor):
            return (1 << max(a, b).bit_length()) - 1
        if e.op is BinaryOp.Shr and isinstance(e.b, Const):
            return a >> b
        if e.op is BinaryOp.Shl and isinstance(e.b, Const):
            return min(a << b, 0xFFFFFFFF)
        if e.op is BinaryOp.Add:
            return min(a + b, 0xFFFFFFFF)
    return 0xFFFFFFFF


def bit_field(e: Expr) -> tuple[Expr, int, int, int] | None:
    """(x, s, m, flip) with e == ((x >> s) & m) ^ flip for constants s, m and flip (flip
    within m), when U32 e is built that way from shifts, masks and a final xor."""
    if not (isinstance(e, Bin) and isinstance(e.b, Const) and e.dtype is U32):
        return None
    c = int(e.b.value)
    if e.op is BinaryOp.Xor:
        f = bit_field(e.a)
        if f is None or c & ~f[2]:
            return None
        return f[0], f[1], f[2], f[3] ^ c
    x, s, m, flip = bit_field(e.a) or (e.a, 0, 0xFFFFFFFF, 0)
    if flip:
        return None
    if e.op is BinaryOp.And:
        return x, s, m & c, 0
    if e.op is BinaryOp.Shr and c < 32:
        return x, s + c, m >> c, 0
    return None


def in_place_uint_to_f32(u: Expr, minus=0) -> tuple[Expr, int]:
    """(v, e) with f32(u - minus) == v * 2^e exactly, for a U32 u < 2^23 (minus as in
    `small_uint_to_f32`). A bit field of a word is masked where it lies, not shifted down
    (e = -its shift), so that it becomes a float in a mask, an OR and a subtraction; fields
    in the top half are masked in the word shifted by 16, which all of them share."""
    f = bit_field(u)
    if f is not None:
        x, s, m, flip = f
        base, at = (x >> 16, s - 16) if s >= 16 else (x, s)
        top = minus if isinstance(minus, int) else bound(minus)
        if max(m, top) << at < 1 << 23:
            bits = base & (m << at)
            return small_uint_to_f32(bits ^ (flip << at) if flip else bits,
                                     minus << at if minus else 0), -at
    return small_uint_to_f32(u, minus), 0


def unit_f32(u: Expr, bits: int) -> Expr:
    """1 + u / 2^bits for a U32 u < 2^bits (bits <= 23), exactly: u placed at the top of
    the mantissa of 1.0. A bit field moves there in one shift of its word, then a mask and
    an OR (which a backend may fuse: one LOP3 on CUDA)."""
    at = 23 - bits
    f = bit_field(u)
    if f is None or f[3] or f[2] >> bits:
        return ((u << at) | 0x3F800000).bitcast(F32)
    x, s, m, _ = f
    moved = x if at == s else x << (at - s) if at > s else x >> (s - at)
    return ((moved & (m << at)) | 0x3F800000).bitcast(F32)


def int_part(qs: list, scale: Expr, offset: Expr | None = None) -> RunPart:
    """The RunPart of elements scale * q + offset for integers q (Biased or U32).

    Without an offset each value is f32(q) exactly (`small_uint_to_f32`, the bias folded
    into its subtraction). With one, the kernel sums the activations anyway, so each value
    is 1 + u / 2^bits with no subtraction at all, and the part's scale and offset absorb
    the change: scale * (u - bias) + offset = (scale * 2^bits) * value + (offset - scale *
    (2^bits + bias)); the sums then cancel to a few bits of f32 rounding."""
    if offset is None:
        values, exponents = zip(*(in_place_uint_to_f32(*biased(q)) for q in qs),
                                strict=True)
        return RunPart(list(values), scale, None, list(exponents) if any(exponents) else None)
    pairs = [biased(q) for q in qs]
    bias = pairs[0][1]
    bits = max(bound(u) for u, _ in pairs).bit_length()
    if bits > 23 or isinstance(bias, Expr) or any(b != bias for _, b in pairs):
        return RunPart([small_uint_to_f32(u, b) for u, b in pairs], scale, offset)
    return RunPart([unit_f32(u, bits) for u, _ in pairs], scale * f32(2.0 ** bits),
                   offset - scale * f32(2.0 ** bits + bias))
