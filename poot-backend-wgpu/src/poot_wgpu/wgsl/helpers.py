"""WGSL functions the printer calls where a WGSL builtin differs from poot's scalar rules.

Each rule's meaning is `poot.reference.scalar`: integer x / 0 = 0, shifts by >= 32
give 0 (or the sign fill), float-to-int casts truncate, saturate and send NaN to 0,
Max propagates NaN, f32 -> bf16 rounds to nearest even. WGSL leaves some of these
implementation-defined (max with NaN, out-of-range float-to-int) or different
(x / 0 = x, shift amounts taken mod 32), so they are spelled out here.
"""
from __future__ import annotations

_INT_MIN = "(-2147483647i - 1i)"

_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "poot_isnan": ("""fn poot_isnan(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}""", ()),
    "poot_max_f32": ("""fn poot_max_f32(a: f32, b: f32) -> f32 {
  // numpy.maximum returns the NaN operand (a first); WGSL max() may drop it. No float
  // arithmetic on the NaN: WGSL lets compilers assume finite math and fold it away.
  return select(max(a, b), select(b, a, poot_isnan(a)), poot_isnan(a) || poot_isnan(b));
}""", ("poot_isnan",)),
    "poot_min_f32": ("""fn poot_min_f32(a: f32, b: f32) -> f32 {
  return select(min(a, b), select(b, a, poot_isnan(a)), poot_isnan(a) || poot_isnan(b));
}""", ("poot_isnan",)),
    "poot_div_i32": (f"""fn poot_div_i32(a: i32, b: i32) -> i32 {{
  // x / 0 = 0; INT_MIN / -1 wraps to INT_MIN (divide by 1 instead)
  let safe = select(b, 1i, b == 0i || (a == {_INT_MIN} && b == -1i));
  return select(a / safe, 0i, b == 0i);
}}""", ()),
    "poot_div_u32": ("""fn poot_div_u32(a: u32, b: u32) -> u32 {
  return select(a / select(b, 1u, b == 0u), 0u, b == 0u);
}""", ()),
    "poot_shl_i32": ("""fn poot_shl_i32(a: i32, b: i32) -> i32 {
  let n = bitcast<u32>(b);
  return select(a << (n & 31u), 0i, n >= 32u);
}""", ()),
    "poot_shl_u32": ("""fn poot_shl_u32(a: u32, n: u32) -> u32 {
  return select(a << (n & 31u), 0u, n >= 32u);
}""", ()),
    "poot_shr_i32": ("""fn poot_shr_i32(a: i32, b: i32) -> i32 {
  // arithmetic; by >= 32 the sign fills the word
  return a >> min(bitcast<u32>(b), 31u);
}""", ()),
    "poot_shr_u32": ("""fn poot_shr_u32(a: u32, n: u32) -> u32 {
  return select(a >> (n & 31u), 0u, n >= 32u);
}""", ()),
    "poot_f32_to_i32": (f"""fn poot_f32_to_i32(x: f32) -> i32 {{
  if (poot_isnan(x)) {{ return 0i; }}
  if (x >= 2147483648.0f) {{ return 2147483647i; }}
  if (x < -2147483648.0f) {{ return {_INT_MIN}; }}
  return i32(x);
}}""", ("poot_isnan",)),
    "poot_f32_to_u32": ("""fn poot_f32_to_u32(x: f32) -> u32 {
  if (poot_isnan(x) || x <= 0.0f) { return 0u; }
  if (x >= 4294967296.0f) { return 4294967295u; }
  return u32(x);
}""", ("poot_isnan",)),
    "poot_f32_to_narrow": ("""fn poot_f32_to_narrow(x: f32, lo: f32, hi: f32) -> f32 {
  // truncate, saturate to [lo, hi] (exact in f32 for 8/16-bit ranges), NaN -> 0
  if (poot_isnan(x)) { return 0.0f; }
  return clamp(trunc(x), lo, hi);
}""", ("poot_isnan",)),
    "poot_round_bf16": ("""fn poot_round_bf16(x: f32) -> f32 {
  // f32 -> bf16 -> f32: round to nearest even on the top 16 bits; NaN stays NaN (quiet)
  let b = bitcast<u32>(x);
  if (poot_isnan(x)) { return bitcast<f32>((b | 0x00400000u) & 0xffff0000u); }
  let rounded = b + 0x7fffu + ((b >> 16u) & 1u);
  return bitcast<f32>(rounded & 0xffff0000u);
}""", ("poot_isnan",)),
    "poot_erf": ("""fn poot_erf(x: f32) -> f32 {
  // |x| < 0.5: Taylor series; else Abramowitz-Stegun 7.1.26 (abs error < 1.5e-7)
  let a = abs(x);
  if (a < 0.5f) {
    let z = x * x;
    let s = 1.0f + z * (-1.0f / 3.0f + z * (0.1f + z * (-1.0f / 42.0f + z * (1.0f / 216.0f
            + z * (-1.0f / 1320.0f)))));
    return 1.1283791670955126f * x * s;
  }
  let t = 1.0f / (1.0f + 0.3275911f * a);
  let p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f
          + t * (-1.453152027f + t * 1.061405429f))));
  let r = 1.0f - p * exp(-a * a);
  return select(r, -r, x < 0.0f);
}""", ()),
}


class Helpers:
    """The helper functions one kernel uses, emitted before its entry point."""

    def __init__(self):
        self.used: list[str] = []

    def call(self, name: str, *args: str) -> str:
        self.need(name)
        return f"{name}({', '.join(args)})"

    def need(self, name: str) -> None:
        if name in self.used:
            return
        for dep in _SOURCES[name][1]:
            self.need(dep)
        self.used.append(name)

    def source(self) -> str:
        return "\n".join(_SOURCES[name][0] for name in self.used)
