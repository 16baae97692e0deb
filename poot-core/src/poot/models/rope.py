"""RoPE frequencies: the base rule and the scalings checkpoints ask for.

`RopeScaling` is what a config's rope_scaling (HF) or rope.scaling.* keys (GGUF) say;
`tables` turns it into the host-side cos/sin tables the traced step binds as consts.
- linear: positions divided by `factor`;
- llama3 (Llama 3.1/3.2): long wavelengths divided by `factor`, short ones kept, the band
  between `low_freq_factor` and `high_freq_factor` blended (GGUF files store the resulting
  per-frequency divisors as the `rope_freqs` tensor instead);
- yarn: frequencies blended between interpolation and extrapolation over a ramp of rotation
  counts [beta_slow, beta_fast] in the original context, and cos/sin scaled by the attention
  factor (0.1 ln(factor) + 1 unless the config gives one);
- longrope (Phi-3 / Phi-4): each frequency divided by its own factor, the short factors for a
  context within the original one and the long ones beyond, and cos/sin scaled by the
  attention factor (sqrt(1 + ln(factor) / ln(original context)) unless the config gives one).
  The context poot serves (its KV capacity) picks the set once, as llama.cpp does: every
  cached key keeps one rotation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"               # none | linear | llama3 | yarn | longrope
    factor: float = 1.0
    original_context: int = 0        # llama3 / yarn: the pre-training context length
    low_freq_factor: float = 1.0     # llama3
    high_freq_factor: float = 4.0    # llama3
    beta_fast: float = 32.0          # yarn
    beta_slow: float = 1.0           # yarn
    attention_factor: float | None = None  # yarn, longrope (None: from factor)
    truncate: bool = True            # yarn: round the correction range to whole dims
    short_factor: tuple[float, ...] = ()   # longrope: divisors per frequency, short context
    long_factor: tuple[float, ...] = ()    # longrope: the same beyond original_context

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        extra = f", original context {self.original_context}" if self.original_context else ""
        if self.kind == "longrope":
            extra += " (short factors within it, long beyond)"
        return f"{self.kind} x{self.factor:g}{extra}"


def inv_freq(rot: int, base: float, s: RopeScaling = RopeScaling(),
             freq_factors: np.ndarray | None = None,
             positions: int = 0) -> tuple[np.ndarray, float]:
    """Inverse frequencies [rot/2] (float64) and the factor cos/sin are multiplied by, for a
    context of `positions` (longrope picks its factors by it)."""
    inv = base ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    if freq_factors is not None:  # GGUF's rope_freqs: divisors per frequency
        return inv / np.asarray(freq_factors, np.float64).reshape(-1)[: rot // 2], 1.0
    if s.kind in ("none", "linear"):
        return inv / (s.factor if s.kind == "linear" else 1.0), 1.0
    if s.kind == "llama3":
        wavelen = 2 * math.pi / inv
        low_wavelen = s.original_context / s.low_freq_factor
        high_wavelen = s.original_context / s.high_freq_factor
        smooth = (s.original_context / wavelen - s.low_freq_factor) / \
            (s.high_freq_factor - s.low_freq_factor)
        blended = (1 - smooth) * inv / s.factor + smooth * inv
        out = np.where(wavelen > low_wavelen, inv / s.factor, inv)
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, out), 1.0
    if s.kind == "yarn":
        def dim_of(rotations):  # the dim whose wavelength fits `rotations` times
            return rot * math.log(s.original_context / (rotations * 2 * math.pi)) / \
                (2 * math.log(base))

        low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
        if s.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rot - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rot // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolate = 1 - ramp
        out = inv / s.factor * (1 - extrapolate) + inv * extrapolate
        att = s.attention_factor
        if att is None:
            att = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
        return out, att
    if s.kind == "longrope":
        factors = s.long_factor if positions > s.original_context else s.short_factor
        att = s.attention_factor
        if att is None:
            att = math.sqrt(1 + math.log(s.factor) / math.log(s.original_context)) \
                if s.factor > 1 else 1.0
        return inv / np.asarray(factors, np.float64), att
    raise ValueError(f"unknown RoPE scaling {s.kind!r}")


def tables(positions: int, rot: int, base: float, scaling: RopeScaling = RopeScaling(),
           freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [positions, rot/2] (float32) for the step's const binders."""
    inv, att = inv_freq(rot, base, scaling, freq_factors, positions)
    ang = np.outer(np.arange(positions, dtype=np.float64), inv)
    return (np.cos(ang) * att).astype(np.float32), (np.sin(ang) * att).astype(np.float32)
