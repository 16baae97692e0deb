"""The contraction schedules' tuning: what a target may choose, one `DotSchedule` a target.

The GEMV, rows GEMV and integer GEMV (`poot.codegen.lower.dot` and the family modules
it dispatches to) read every number they may be tuned by from the `DotSchedule` their
lowering receives (`Sig.dot_schedule`): `dot_schedule(features)` is a target's default,
and a caller that wants another passes one (`lower(..., schedule=...)`,
`KernelBackend.schedule`), usually the default with a few fields replaced
(`dataclasses.replace`). The lowerings that read it are registered so
(`lowers(..., scheduled=True)`); their kernels lowered under a schedule other than the
target's default are named apart (`Sig.name`), so caches keyed by name never mix the two,
and every other kernel keeps its name.

Fields are named after the measurements that chose them in docs/performance.md (there in
upper case: `RUN_COLUMNS=1` is `run_columns=1`). What is not a field is fixed by the
schedules' design: `LANES` and `GEMV_MAX_ROWS` below.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from poot.codegen.target import DOT2, DOT4, REDUCE_SCATTER

#: threads that share one dot product in the GEMV schedules: the width of the cooperative
#: reduction every target gives (a warp, or a subgroup of 32)
LANES = 32
#: the most rows the GEMV holds accumulators for (ContractionPrologue's limit too)
GEMV_MAX_ROWS = 4


@dataclass(frozen=True)
class RowsRule:
    """How the rows GEMV lays out a narrow problem (see `rows_gemv.rows_plan`): `tile`
    rows a group, `columns` columns a group past one tile of rows while that leaves at
    least `min_groups` groups, and K split over up to `split` warps a group while the grid
    has fewer than `warps` warps, each lane keeps `min_trip` elements and the group's
    accumulators times its warps stay within `accs` (a workgroup's registers)."""

    tile: int
    columns: int
    split: int
    warps: int
    min_trip: int
    accs: int = 1 << 30
    min_groups: int = 0


#: targets that finish each dot product by its own butterfly (CoopReduce)
ROWS_FOLDED = RowsRule(tile=8, columns=4, split=4, warps=4096, min_trip=9)
#: a CPU device (Mesa's lavapipe) on a target of ROWS_FOLDED: its compiler (LLVM, cold in
#: CI) takes seconds for every product a thread holds (each one's unrolled multiply-adds and
#: reduction) and for every unrolled trip, while a workgroup runs on one core, so the tall
#: tiles, K split over warps and long trips that keep a GPU's warps busy buy it little:
#: few products a thread, K in one warp, and SOFTWARE_ROWS_UNROLL elements a trip
#: (docs/performance.md)
ROWS_SOFTWARE = RowsRule(tile=4, columns=1, split=1, warps=4096, min_trip=9)
SOFTWARE_ROWS_UNROLL = 2
#: the GEMV of a CPU device, unstaged: the staged GEMV's loop over K's trips has constant
#: bounds, which the printers unroll when short (a copy of the staged trip, its barriers
#: and phases, per trip), so its kernel grows with K and LLVM's compile time faster still;
#: unstaged, each lane walks K from its own start, a loop no printer unrolls, and a
#: workgroup on one core gains nothing from coalesced loads
SOFTWARE_GEMV = {"shared_bytes": 0}
#: targets with REDUCE_SCATTER, whose products cost little to finish, so the best tiles
#: are taller and K splits further (the rows sweep in docs/performance.md)
ROWS_SCATTERED = RowsRule(tile=16, columns=4, split=8, warps=8192, min_trip=2, accs=128,
                          min_groups=128)


@dataclass(frozen=True)
class DotSchedule:
    """The tuning of the contraction schedules on one target."""

    # -- the GEMV (at most GEMV_MAX_ROWS rows) ----------------------------------------------
    #: dot products (groups of LANES threads) per workgroup
    groups: int = 8
    #: strided items per lane per loop trip
    unroll: int = 4
    #: weight elements per lane per trip when decoding packed runs (>= 32 bytes of 4-bit)
    run_trip: int = 64
    #: weight rows per group when decoding runs over staged activations
    run_columns: int = 2
    #: staged activations and weights stay within this many bytes (WebGPU: 16 KiB at least)
    shared_bytes: int = 16 * 1024
    #: fewest activations per run and staging phase when the weights are staged too
    min_span: int = 16
    #: dot-product warps a 16-bit GEMV wants in flight before it splits K over more warps
    #: a column (fewer left an 8B step's q|k|v, O and down GEMVs under one wave)
    split_warps: int = 16384
    #: the GEMV (and the integer GEMV where its words are staged or K is one trip) loads
    #: its first trip's weights before the kernel's AwaitInputs, so on a target whose
    #: launches overlap that latency hides under the kernel before
    early_loads: bool = True
    #: a 16-bit GEMV reads each weight word's two activations (and norm weights) in one
    #: 8-byte load where the target has WIDE_LOADS (else two 4-byte loads)
    pairs: bool = True
    #: an RMSNorm read by a 16-bit GEMV, or by an integer GEMV of one kernel, is taken
    #: inside it (its rows' sums of squares with the activations it reads); else the norm
    #: is always a kernel of its own
    norm_prologue: bool = True

    # -- the rows GEMV (a decode batch) ---------------------------------------------------
    #: the most rows the rows GEMV serves (past them: the tiled or tensor-core GEMMs)
    batch_rows: int = 32
    #: columns (batch x N) from which the rows GEMV takes `rows_wide_columns` a group
    rows_wide_n: int = 8192
    #: columns per group of the rows GEMV over wide N
    rows_wide_columns: int = 2
    #: groups per workgroup in the rows GEMV (more workgroups for small N)
    rows_groups: int = 4
    #: most elements a lane loads per trip in the rows GEMV over narrow N
    rows_unroll: int = 18
    #: the narrow rows GEMV's layout (`dot_schedule` picks it by REDUCE_SCATTER)
    rows: RowsRule = field(default=ROWS_FOLDED)

    # -- the integer GEMV (packed weights on a DOT2 target, int8 rows on a DOT4 one) -----
    #: shared memory the integer GEMV's arrays may take (a DOT2 target's workgroup has 48
    #: KiB; `int_schedule` bounds it by a device's own limit)
    int_shared_bytes: int = 48 * 1024
    #: columns from which the integer GEMV takes `run_columns` a group
    int_wide_n: int = 4096
    #: rows from this long keep the f32 schedule (0: every row does)
    int_max_k: int = 1 << 20
    #: activations a workgroup may quantize per column it computes before K splits
    int_column_k: int = 512
    #: workgroups of an integer GEMV below which K splits
    int_min_groups: int = 256
    #: shortest part of a split K (one staged trip of 32-element blocks)
    int_part_k: int = 2048
    #: most parts K splits into
    int_max_parts: int = 8
    #: an integer GEMV whose weight chunks are whole 16-byte spans (Q4_K's 144-byte block)
    #: reads its staged tile four words a load where the target has WIDE_LOADS, the tile
    #: unpadded (four words apart per lane, eight lanes a phase: distinct banks); else one
    #: word a load from a tile padded against bank conflicts
    quads: bool = True


@functools.cache
def dot_schedule(features: frozenset) -> DotSchedule:
    """The default schedule of a target that prints `features` (target.FEATURES)."""
    if REDUCE_SCATTER in features:
        return DotSchedule(rows=ROWS_SCATTERED)
    return DotSchedule()


#: shared memory left besides the integer GEMV's arrays for its reductions' scratch (a word
#: per thread of the widest workgroup)
REDUCTION_SHARED = 4 * 1024


def int_schedule(features: frozenset, shared_bytes: int) -> DotSchedule | None:
    """The schedule of a target of `features` whose workgroups have `shared_bytes` of
    shared memory (a device's limit): the default with the integer GEMV's arrays within
    it, or None where the default's fit or the target has no integer GEMV."""
    s = dot_schedule(frozenset(features))
    room = shared_bytes - REDUCTION_SHARED
    if not {DOT2, DOT4} & set(features) or s.int_shared_bytes <= room:
        return None
    return replace(s, int_shared_bytes=room)


def device_schedule(features, shared_bytes: int, software: bool) -> DotSchedule | None:
    """The schedule of a target of `features` on one device whose workgroups have
    `shared_bytes` of shared memory: `int_schedule`'s (None where that is the target's
    default), but on a CPU device (`software`) with SOFTWARE_GEMV's fields and the rows
    GEMV laid out by ROWS_SOFTWARE where the target folds its products."""
    s = int_schedule(features, shared_bytes)
    if not software:
        return s
    base = replace(s or dot_schedule(frozenset(features)), **SOFTWARE_GEMV)
    if base.rows != ROWS_FOLDED:
        return base
    return replace(base, rows=ROWS_SOFTWARE, rows_unroll=SOFTWARE_ROWS_UNROLL)


__all__ = ["GEMV_MAX_ROWS", "LANES", "ROWS_FOLDED", "ROWS_SCATTERED", "ROWS_SOFTWARE",
           "SOFTWARE_GEMV", "SOFTWARE_ROWS_UNROLL", "DotSchedule", "RowsRule",
           "REDUCTION_SHARED", "device_schedule", "dot_schedule", "int_schedule"]
