"""Packed weight blocks as 32 signed 8-bit codes and their scales: the one decode every
CPU contraction kernel shares (poot_cpu.gemv), with f32 or int8 activations alike.

A GGUF row is K/B blocks of `nbytes` bytes (B = 32 or 256); each block is B/32
sub-blocks of 32 elements. Element t of sub-block s is

    scale[s, g] * c[t] + offset[s, h]       g = t // (32 / groups), h = t // (32 / offsets)

with c a signed 8-bit code: the format's integer field u (low bits, optionally high bits
above them) less a centre, or a table entry indexed by u (IQ4_NL, MXFP4), or the field's
byte read as int8 (Q8_0). Formats whose integers are unsigned (a min or an offset of their
own) are centred too and the centre's share moves into the offset, so every code is
signed and one integer dot product (codes x activations) serves every format.

Each format is a declaration here (`Block`: where its fields lie, per sub-block, and
how its scales are stored) from which `c_source` prints the C functions the kernels call
(AVX2 and plain C) and `decode_numpy` the same arithmetic in numpy. poot-quant's integer
runs (poot.formats.int_run) are scalar programs over u32 words, and exist only for
formats whose codes are whole nibbles or bytes; the vector decode here needs the fields'
byte places instead. A declaration is used only where it agrees with the format's own
dequantize (the oracle's) on random blocks (`block_of`), so a wrong table is never
printed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Field:
    """Some bits of the 32 elements of sub-block s, at byte `at[s]` of the block:
    "nib32": 16 bytes, element t < 16 in the low nibble of byte t, t >= 16 in the high
    nibble of byte t - 16; "bytes": 32 bytes, element t = (byte t >> shift[s]) & mask;
    "mask32": one bit per element, bit t of the little-endian u32."""

    kind: str
    at: tuple[int, ...]
    shift: tuple[int, ...] = (0,)
    bits: int = 4

    @property
    def mask(self) -> int:
        return (1 << self.bits) - 1


@dataclass(frozen=True)
class Block:
    """One format's block (see the module docstring). Scales: `d` is the block scale at
    byte `d`, stored as `d_kind`: "f16", or "e8m0" (MXFP4: a byte e, 2^(e - 128), ggml's
    half of the OCP value, paired with doubled E2M1 integers); `sub` names how sub-block
    scales are stored: None (d alone), "min6" (Q4_K/Q5_K: six-bit scale and min per
    sub-block, 12 bytes at `sub_at`; offset -dmin * min with dmin the f16 at `minimum`),
    "i8x16" (Q6_K: one int8 scale per 16 elements at `sub_at`), "s6x16" (Q3_K: one six-bit
    scale less 32 per 16 elements, 12 bytes at `sub_at`: the low nibbles in bytes 0-7,
    nibble i / 8 of byte i % 8, the top two bits in bytes 8-11, field i / 4 of byte i % 4),
    "min4x16" (Q2_K: per 16 elements a byte at `sub_at`, its low nibble the scale and its
    high nibble the min, offset -dmin * min). Without `sub`, `minimum` is an f16 added to
    every element (Q4_1, Q5_1)."""

    elements: int
    nbytes: int
    low: Field
    high: Field | None = None
    centre: int = 0
    table: tuple[int, ...] | None = None
    signed: bool = False
    d: int = 0
    d_kind: str = "f16"
    minimum: int | None = None
    sub: str | None = None
    sub_at: int = 0

    @property
    def subblocks(self) -> int:
        return self.elements // 32

    @property
    def groups(self) -> int:
        """Scales per sub-block: 2 where each 16 elements have their own."""
        return 2 if self.sub in ("i8x16", "s6x16", "min4x16") else 1

    @property
    def offsets(self) -> int:
        """Offsets per sub-block: 2 where each 16 elements have their own min."""
        return 2 if self.sub == "min4x16" else 1

    @property
    def has_offset(self) -> bool:
        return self.minimum is not None

    @property
    def bits(self) -> int:
        return self.low.bits + (self.high.bits if self.high else 0)


def _nib32(at: int) -> Field:
    return Field("nib32", (at,))


def _kquant_low(at: int) -> Field:
    """Q4_K/Q5_K low nibbles: each 64 elements use 32 bytes, low nibbles first."""
    return Field("bytes", tuple(at + 32 * (s // 2) for s in range(8)),
                 tuple(4 * (s % 2) for s in range(8)))


def _two_bits(at: int) -> Field:
    """Q2_K/Q3_K 2-bit fields: each 128 elements use 32 bytes, sub-block s in bits 2 (s % 4)."""
    return Field("bytes", tuple(at + 32 * (s // 4) for s in range(8)),
                 tuple(2 * (s % 4) for s in range(8)), bits=2)


#: E2M1 values doubled (poot_quant.gguf_blocks.E2M1_DOUBLED: MXFP4's codes)
E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)

BLOCKS = {
    "gguf:Q4_0": Block(32, 18, _nib32(2), centre=8),
    "gguf:Q4_1": Block(32, 20, _nib32(4), centre=8, minimum=2),
    "gguf:Q5_0": Block(32, 22, _nib32(6), Field("mask32", (2,), bits=1), centre=16),
    "gguf:Q5_1": Block(32, 24, _nib32(8), Field("mask32", (4,), bits=1), centre=16,
                       minimum=2),
    "gguf:Q8_0": Block(32, 34, Field("bytes", (2,), bits=8), signed=True),
    "gguf:IQ4_NL": Block(32, 18, _nib32(2), table=(-127, -104, -83, -65, -49, -35, -22, -10,
                                                   1, 13, 25, 38, 53, 69, 89, 113)),
    "gguf:Q4_K": Block(256, 144, _kquant_low(16), centre=8, minimum=2, sub="min6", sub_at=4),
    "gguf:Q5_K": Block(256, 176, _kquant_low(48),
                       Field("bytes", (16,) * 8, tuple(range(8)), bits=1), centre=16,
                       minimum=2, sub="min6", sub_at=4),
    "gguf:Q6_K": Block(256, 210,
                       Field("bytes", tuple(64 * (s // 4) + 32 * (s % 2) for s in range(8)),
                             tuple(4 * (s // 2 % 2) for s in range(8))),
                       Field("bytes", tuple(128 + 32 * (s // 4) for s in range(8)),
                             tuple(2 * (s % 4) for s in range(8)), bits=2),
                       centre=32, d=208, sub="i8x16", sub_at=192),
    "gguf:Q2_K": Block(256, 84, _two_bits(16), centre=2, d=80, minimum=82, sub="min4x16"),
    # the high bit set means the code as stored, clear means 4 less: u = low | high << 2
    "gguf:Q3_K": Block(256, 110, _two_bits(32),
                       Field("bytes", (0,) * 8, tuple(range(8)), bits=1), centre=4, d=108,
                       sub="s6x16", sub_at=96),
    "gguf:MXFP4": Block(32, 17, _nib32(1), table=E2M1_DOUBLED, d_kind="e8m0"),
}


# -- numpy: the same arithmetic, for the self-check ----------------------------------------
def _field_numpy(f: Field, blocks: np.ndarray, s: int) -> np.ndarray:
    at = f.at[s]
    if f.kind == "nib32":
        raw = blocks[:, at:at + 16].astype(np.int32)
        return np.concatenate([raw & 15, raw >> 4], axis=1)
    if f.kind == "bytes":
        return (blocks[:, at:at + 32].astype(np.int32) >> f.shift[s]) & f.mask
    word = blocks[:, at:at + 4].copy().view("<u4").astype(np.int64)
    return ((word >> np.arange(32)) & 1).astype(np.int32)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _d_numpy(block: Block, blocks: np.ndarray) -> np.ndarray:
    if block.d_kind == "e8m0":
        e = blocks[:, block.d:block.d + 1].astype(np.int32)
        return np.ldexp(np.float32(1), e - 128).astype(np.float32)
    return _f16(blocks, block.d)


def _s6x16(q: np.ndarray) -> np.ndarray:
    """Q3_K's sixteen scales (less 32) from its 12 bytes q [n, 12], int32."""
    i = np.arange(16)
    low = (q[:, i % 8] >> (4 * (i // 8))) & 15
    high = (q[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    return (low | (high << 4)) - 32


def scales_numpy(block: Block, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale [n, subblocks * groups], offset [n, subblocks * offsets]) of each block, f32,
    as the printed `_scales` function computes them."""
    d = _d_numpy(block, blocks)
    n, sb = blocks.shape[0], block.subblocks
    offset = np.zeros((n, sb * block.offsets), np.float32)
    if block.sub == "min6":
        q = blocks[:, block.sub_at:block.sub_at + 12].astype(np.int32)
        sc = np.empty((n, 8), np.int32)
        mn = np.empty((n, 8), np.int32)
        sc[:, :4], mn[:, :4] = q[:, 0:4] & 63, q[:, 4:8] & 63
        sc[:, 4:] = (q[:, 8:12] & 15) | ((q[:, 0:4] >> 6) << 4)
        mn[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
        scale = d * sc.astype(np.float32)
        offset = np.float32(block.centre) * scale \
            - _f16(blocks, block.minimum) * mn.astype(np.float32)
    elif block.sub == "i8x16":
        sc = blocks[:, block.sub_at:block.sub_at + 16].view(np.int8).astype(np.float32)
        scale = d * sc
    elif block.sub == "s6x16":
        scale = d * _s6x16(blocks[:, block.sub_at:block.sub_at + 12].astype(np.int32)) \
            .astype(np.float32)
    elif block.sub == "min4x16":
        q = blocks[:, block.sub_at:block.sub_at + 16].astype(np.int32)
        scale = d * (q & 15).astype(np.float32)
        offset = np.float32(block.centre) * scale \
            - _f16(blocks, block.minimum) * (q >> 4).astype(np.float32)
    else:
        scale = d
        if block.minimum is not None:
            offset = _f16(blocks, block.minimum) + np.float32(block.centre) * d
    return scale.astype(np.float32), offset.astype(np.float32)


def codes_numpy(block: Block, blocks: np.ndarray) -> np.ndarray:
    """The signed codes of each block, int32 [n, elements]."""
    out = []
    for s in range(block.subblocks):
        u = _field_numpy(block.low, blocks, s)
        if block.high is not None:
            u = u | (_field_numpy(block.high, blocks, s) << block.low.bits)
        if block.table is not None:
            c = np.asarray(block.table, np.int32)[u]
        elif block.signed:
            c = u.astype(np.uint8).view(np.int8).astype(np.int32)
        else:
            c = u - block.centre
        out.append(c)
    return np.concatenate(out, axis=1)


def decode_numpy(block: Block, blocks: np.ndarray) -> np.ndarray:
    """Every element of each block [n, elements] in float64 from the codes and scales."""
    scale, offset = scales_numpy(block, blocks)
    c = codes_numpy(block, blocks).astype(np.float64)
    per = 32 // block.groups
    s = np.repeat(scale.astype(np.float64), per, axis=1)
    o = np.repeat(offset.astype(np.float64), 32 // block.offsets, axis=1)
    return s * c + o if block.has_offset else s * c


def _noise(n: int) -> np.ndarray:
    """`n` pseudo-random 64-bit words, the same on every run (splitmix64 of a counter):
    block_of's test blocks without numpy.random, whose extension modules would stay
    resident in every process that plans for this backend."""
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@functools.cache
def block_of(format_name: str) -> Block | None:
    """The declaration of a format, if there is one and it agrees with the format's own
    dequantize on random blocks (finite scales): every element within a few f32 roundings
    (the centred codes and their offset round apart from the format's own order)."""
    from poot.formats import get_format

    block = BLOCKS.get(format_name)
    if block is None:
        return None
    noise = _noise(16 * block.nbytes + 48)
    blocks = (noise[:16 * block.nbytes] & np.uint64(255)).astype(np.uint8).reshape(16, -1)
    spare = iter(noise[16 * block.nbytes:].reshape(3, 16, 1))
    f16 = (block.d, block.minimum) if block.d_kind == "f16" else (block.minimum,)
    for at in f16:
        if at is not None:          # -2 .. 2
            u = (next(spare) >> np.uint64(40)).astype(np.float64) / 2.0**24
            blocks[:, at:at + 2] = (u * 4 - 2).astype(np.float16).view(np.uint8)
    if block.d_kind == "e8m0":      # 2^-28 .. 2^20: the elements stay finite in f32
        blocks[:, block.d] = 100 + next(spare)[:, 0] % np.uint64(48)
    want = np.asarray(get_format(format_name).dequantize(
        [blocks], (16, block.elements)), np.float64)
    scale, offset = scales_numpy(block, blocks)
    bound = np.abs(np.repeat(scale, 32 // block.groups, axis=1)).astype(np.float64) * 256 \
        + np.abs(np.repeat(offset, 32 // block.offsets, axis=1))
    ok = np.abs(decode_numpy(block, blocks) - want) <= 4 * np.finfo(np.float32).eps * bound
    return block if ok.all() else None


# -- C ---------------------------------------------------------------------------------------
def _table(name: str, values) -> str:
    return f"  static const unsigned char {name}[] = {{{', '.join(str(v) for v in values)}}};\n"


def _field_avx(f: Field, var: str, tables: list[str], tag: str) -> str:
    """C statements setting __m256i `var` to the 32 field values (one per byte)."""
    if f.kind == "nib32":
        return (f"  const __m128i {var}_t = _mm_loadu_si128((const __m128i*)(b + {f.at[0]}));\n"
                f"  const __m256i {var} = _mm256_and_si256(_mm256_set_m128i("
                f"_mm_srli_epi16({var}_t, 4), {var}_t), _mm256_set1_epi8(15));\n")
    if f.kind == "bytes":
        at = str(f.at[0]) if len(set(f.at)) == 1 else f"{tag}_at[s]"
        if len(set(f.at)) > 1:
            tables.append(_table(f"{tag}_at", f.at))
        load = f"_mm256_loadu_si256((const __m256i*)(b + {at}))"
        if f.bits == 8:
            return f"  const __m256i {var} = {load};\n"
        if len(set(f.shift)) > 1:
            tables.append(_table(f"{tag}_sh", f.shift))
            load = f"_mm256_srl_epi16({load}, _mm_cvtsi32_si128({tag}_sh[s]))"
        elif f.shift[0]:
            load = f"_mm256_srli_epi16({load}, {f.shift[0]})"
        return f"  const __m256i {var} = _mm256_and_si256({load}, _mm256_set1_epi8({f.mask}));\n"
    # one bit per element: byte t takes byte t / 8 of the word, then tests bit t % 8
    return (f"  unsigned int {var}_w;\n  memcpy(&{var}_w, b + {f.at[0]}, 4);\n"
            f"  const __m256i {var}_sel = _mm256_set1_epi64x(0x8040201008040201LL);\n"
            f"  const __m256i {var} = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256("
            f"_mm256_shuffle_epi8(_mm256_set1_epi32((int){var}_w), _mm256_set_epi64x("
            f"0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0)), "
            f"{var}_sel), {var}_sel), _mm256_set1_epi8(1));\n")


def _field_c(f: Field, tag: str) -> str:
    """A C expression of element t's field value (scalar code)."""
    if f.kind == "nib32":
        return f"((b[{f.at[0]} + (t & 15)] >> ((t >> 4) << 2)) & 15)"
    if f.kind == "bytes":
        at = str(f.at[0]) if len(set(f.at)) == 1 else f"{tag}_at[s]"
        sh = str(f.shift[0]) if len(set(f.shift)) == 1 else f"{tag}_sh[s]"
        return f"((b[{at} + t] >> {sh}) & {f.mask})"
    return f"((b[{f.at[0]} + (t >> 3)] >> (t & 7)) & 1)"


def _d_c(block: Block) -> str:
    """C statements declaring `d`, the block scale."""
    if block.d_kind == "e8m0":
        # 2^(e - 128) as f32 bits: a normal number from e = 2, else the subnormal 2^-127
        # or 2^-128
        return (f"  const unsigned int e = b[{block.d}], e_bits = e >= 2 ? (e - 1) << 23 "
                ": 0x200000u << e;\n  float d;\n  memcpy(&d, &e_bits, 4);\n")
    return f"  const float d = poot_h2f(b + {block.d});\n"


def _scales_c(block: Block) -> str:
    """The body of `_scales`: sc[s * groups + g] and, with offsets, of[s * offsets + h].
    With AVX2 the sub-block scales unpack eight at a time (the same products and
    differences, rounded the same way, as the plain C loop)."""
    centre = f"{float(block.centre)}f"
    q = block.sub_at
    if block.sub == "min6":
        # scales 0-3 and mins 0-3: the low six bits of bytes 0-3 and 4-7; scales and mins
        # 4-7: the nibbles of bytes 8-11 below the top two bits of bytes 0-3 and 4-7
        return (_d_c(block) + f"  const float dmin = poot_h2f(b + {block.minimum});\n"
                "#ifdef POOT_AVX2\n"
                f"  unsigned int a, m, h;\n  memcpy(&a, b + {q}, 4);\n"
                f"  memcpy(&m, b + {q + 4}, 4);\n  memcpy(&h, b + {q + 8}, 4);\n"
                "  const unsigned long long s8 = (a & 0x3f3f3f3fu) | (unsigned long long)"
                "((h & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;\n"
                "  const unsigned long long m8 = (m & 0x3f3f3f3fu) | (unsigned long long)"
                "(((h >> 4) & 0x0f0f0f0fu) | ((m >> 2) & 0x30303030u)) << 32;\n"
                "  const __m256 vs = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps("
                "_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)s8))));\n"
                "  const __m256 vm = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps("
                "_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m8))));\n"
                "  _mm256_storeu_ps(sc, vs);\n"
                f"  _mm256_storeu_ps(of, _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps({centre}), "
                "vs), vm));\n"
                "#else\n"
                f"  for (int i = 0; i < 8; ++i) {{\n"
                f"    const int s6 = i < 4 ? b[{q} + i] & 63 "
                f": (b[{q + 4} + i] & 15) | ((b[{q - 4} + i] >> 6) << 4);\n"
                f"    const int m6 = i < 4 ? b[{q + 4} + i] & 63 "
                f": (b[{q + 4} + i] >> 4) | ((b[{q} + i] >> 6) << 4);\n"
                f"    sc[i] = d * (float)s6;\n"
                f"    of[i] = {centre} * sc[i] - dmin * (float)m6;\n  }}\n"
                "#endif\n")
    if block.sub == "i8x16":
        return (_d_c(block) + "#ifdef POOT_AVX2\n"
                f"  const __m128i v = _mm_loadu_si128((const __m128i*)(b + {block.sub_at}));\n"
                "  _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps("
                "_mm256_cvtepi8_epi32(v))));\n"
                "  _mm256_storeu_ps(sc + 8, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps("
                "_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v)))));\n"
                "#else\n"
                f"  for (int i = 0; i < 16; ++i) sc[i] = d * (float)(signed char)"
                f"b[{block.sub_at} + i];\n"
                "#endif\n")
    if block.sub == "s6x16":
        # the sixteen scales' low nibbles: the low then the high nibbles of bytes 0-7; their
        # top two bits: bit pair j of bytes 8-11 for scales 4j .. 4j + 3
        return (_d_c(block) + "#ifdef POOT_AVX2\n"
                f"  unsigned int h;\n  memcpy(&h, b + {q + 8}, 4);\n"
                f"  const __m128i l = _mm_loadl_epi64((const __m128i*)(b + {q}));\n"
                "  const __m128i v = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_unpacklo_epi64("
                "l, _mm_srli_epi16(l, 4)), _mm_set1_epi8(15)), _mm_slli_epi16(_mm_and_si128("
                "_mm_setr_epi32((int)h, (int)(h >> 2), (int)(h >> 4), (int)(h >> 6)), "
                "_mm_set1_epi8(3)), 4)), _mm_set1_epi8(32));\n"
                + "".join(f"  _mm256_storeu_ps(sc + {8 * j}, _mm256_mul_ps(_mm256_set1_ps(d), "
                          f"_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32({src}))));\n"
                          for j, src in enumerate(("v", "_mm_unpackhi_epi64(v, v)")))
                + "#else\n  for (int i = 0; i < 16; ++i) {\n"
                f"    const int s6 = ((b[{q} + (i & 7)] >> ((i >> 3) << 2)) & 15)"
                f" | (((b[{q + 8} + (i & 3)] >> ((i >> 2) << 1)) & 3) << 4);\n"
                "    sc[i] = d * (float)(s6 - 32);\n  }\n#endif\n")
    if block.sub == "min4x16":
        return (_d_c(block) + f"  const float dmin = poot_h2f(b + {block.minimum});\n"
                "#ifdef POOT_AVX2\n"
                f"  const __m128i v = _mm_loadu_si128((const __m128i*)(b + {q}));\n"
                "  const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15)), "
                "hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));\n"
                "  for (int j = 0; j < 2; ++j) {\n"
                "    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps("
                "_mm256_cvtepu8_epi32(j ? _mm_unpackhi_epi64(lo, lo) : lo)));\n"
                "    const __m256 m = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps("
                "_mm256_cvtepu8_epi32(j ? _mm_unpackhi_epi64(hi, hi) : hi)));\n"
                "    _mm256_storeu_ps(sc + 8 * j, s);\n"
                f"    _mm256_storeu_ps(of + 8 * j, _mm256_sub_ps(_mm256_mul_ps("
                f"_mm256_set1_ps({centre}), s), m));\n  }}\n"
                "#else\n  for (int i = 0; i < 16; ++i) {\n"
                f"    sc[i] = d * (float)(b[{q} + i] & 15);\n"
                f"    of[i] = {centre} * sc[i] - dmin * (float)(b[{q} + i] >> 4);\n  }}\n"
                "#endif\n")
    if block.minimum is not None:
        return (_d_c(block) + "  sc[0] = d;\n"
                f"  of[0] = poot_h2f(b + {block.minimum}) + {centre} * sc[0];\n")
    return _d_c(block) + "  sc[0] = d;\n"


def _codes16_avx(block: Block) -> str:
    """The body of `_codes16`: the codes of sub-block s as int16, elements 0-15 in *w0 and
    16-31 in *w1. Nibbles and bytes widen straight from the block (one widening load
    instead of the byte codes' two halves: the exact coding's decode steps are bound by
    these instructions); other fields widen the byte codes."""
    low = block.low
    if block.high is None and block.table is None and low.kind == "nib32":
        return (f"  (void)s;\n  const __m256i v = _mm256_cvtepu8_epi16("
                f"_mm_loadu_si128((const __m128i*)(b + {low.at[0]})));\n"
                f"  const __m256i c = _mm256_set1_epi16({block.centre});\n"
                "  *w0 = _mm256_sub_epi16(_mm256_and_si256(v, _mm256_set1_epi16(15)), c);\n"
                "  *w1 = _mm256_sub_epi16(_mm256_srli_epi16(v, 4), c);\n")
    if block.signed and low.kind == "bytes" and len(set(low.at)) == 1:
        return "".join(f"  *w{j} = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)"
                       f"(b + {low.at[0] + 16 * j})));\n" for j in range(2)) + "  (void)s;\n"
    return ("  const __m256i c = {name}_codes(b, s);\n"
            "  *w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c));\n"
            "  *w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c, 1));\n")


def unsigned_codes(block: Block) -> bool:
    """Whether the codes are an unsigned field less a centre (no table, not int8): u = c +
    centre < 64, whose products with int8 activations maddubs takes without saturating."""
    return block.table is None and not block.signed and block.centre > 0 and block.bits <= 6


def c_name(format_name: str) -> str:
    return "poot_blk_" + format_name.split(":")[-1].lower()


@functools.cache
def c_source(format_name: str) -> str:
    """The format's C functions, NAME_scales(b, sc, of), NAME_codes(b, s) (AVX2: a __m256i
    of the 32 codes of sub-block s), NAME_codes16(b, s, w0, w1) (AVX2: the same as two
    vectors of int16) and NAME_codes_c(b, s, c) (plain C), where b points at a block."""
    block = BLOCKS[format_name]
    name = c_name(format_name)
    tables: list[str] = []
    body = _field_avx(block.low, "lo", tables, "lo")
    u = "lo"
    if block.high is not None:
        body += _field_avx(block.high, "hi", tables, "hi")
        u = f"_mm256_or_si256(lo, _mm256_slli_epi16(hi, {block.low.bits}))"
    if block.table is not None:
        lut = ", ".join(str(v) for v in reversed(block.table))
        code = f"_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_set_epi8({lut})), {u})"
    elif block.signed:
        code = u
    else:
        code = f"_mm256_sub_epi8({u}, _mm256_set1_epi8({block.centre}))"
    avx = "".join(dict.fromkeys(tables)) + body + f"  return {code};\n"
    # AVX2 without VNNI (POOT_U8DOT, printer.SIMD_HEADER): the unsigned field values u =
    # c + centre themselves, for maddubs' unsigned operand (poot_cpu.gemv takes the
    # centre's share off again as an integer)
    ucodes = "" if not unsigned_codes(block) else (
        "#if POOT_U8DOT\n"
        f"static inline __m256i {name}_ucodes(const unsigned char* restrict b, int s) {{\n"
        f"  (void)s;\n{''.join(dict.fromkeys(tables))}{body}  return {u};\n}}\n#endif\n")
    expr = _field_c(block.low, "lo")
    if block.high is not None:
        expr = f"({expr} | ({_field_c(block.high, 'hi')} << {block.low.bits}))"
    if block.table is not None:
        scalar = f"{name}_lut[{expr}]"
        table = (f"  static const signed char {name}_lut[16] = "
                 f"{{{', '.join(str(v) for v in block.table)}}};\n")
    else:
        scalar = f"(signed char){expr}" if block.signed else f"{expr} - {block.centre}"
        table = ""
    scalar_tables = "".join(dict.fromkeys(t for t in tables))
    avx16 = _codes16_avx(block)
    offsets = "float* restrict of" if block.has_offset else "float* restrict of_unused"
    unused = "" if block.has_offset else "  (void)of_unused;\n"
    return (f"static inline void {name}_scales(const unsigned char* restrict b, "
            f"float* restrict sc, {offsets}) {{\n{unused}{_scales_c(block)}}}\n"
            "#ifdef POOT_AVX2\n"
            f"static inline __m256i {name}_codes(const unsigned char* restrict b, int s) {{\n"
            f"  (void)s;\n{avx}}}\n{ucodes}"
            f"static inline void {name}_codes16(const unsigned char* restrict b, int s, "
            f"__m256i* w0, __m256i* w1) {{\n{avx16.format(name=name)}}}\n"
            "#endif\n"
            f"static inline void {name}_codes_c(const unsigned char* restrict b, int s, "
            f"signed char* restrict c) {{\n  (void)s;\n{scalar_tables}{table}"
            f"  for (int t = 0; t < 32; ++t) c[t] = {scalar};\n}}\n")


__all__ = ["BLOCKS", "Block", "Field", "block_of", "c_name", "c_source", "codes_numpy",
           "decode_numpy", "scales_numpy", "unsigned_codes"]
