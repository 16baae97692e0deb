"""What the shared lowerings make kernels for: one declaration, every kernel backend's table.

`COVERAGE` maps each capability key that poot.codegen.lower makes kernels for to the
dtypes its lowering takes, stated over the classes of a device's dtypes (`DeviceClasses`:
the floats it computes with, its arithmetic dtypes, its contraction operands, the dtypes
its kernels load and store, the registered packed formats). A backend that prints
poot's kernel programs (cpu, cuda, rocm, vulkan, wgpu) derives its table with
`kernel_table`, stating only its device facts:

    uses       what the device does with each dtype (poot.capability.Use)
    refuse     op keys a rule of its language refuses on some dtypes, with the reason
               (SPIR-V targets: Select on F16 and BF16)
    no_select  dtypes its printer cannot select in: every op whose kernels select in
               the element dtype (`Cover.selects`) is refused on them
    declare    the offered composites it lowers (`Cover.offered`: fusions that are a
               schedule choice, measured per target): declared, so conformance runs
               their cases, but formed by compile only where the policy asks
               (`CapabilityTable.unelected`, `Policy.fuse`)
    elect      the offered composites compile forms by default on this device (declared
               too); a key in both is elected
    without    op keys it leaves out, each with the reason a refusal gives
    own        op keys no shared lowering covers that kernels of its own take
               (`KernelBackend.program_for`), with their dtypes or formats
    limits, notes

Adding an op is one `COVERAGE` entry beside its lowering; tests/test_coverage.py checks
that every lowering is declared and every declared key has a lowering.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from poot.capability import CapabilityTable, Use
from poot.dtypes import DType
from poot.errors import PootError
from poot.ir.ops import BinaryOp, UnaryOp

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
NARROW_INTS = (DType.I8, DType.U8, DType.I16, DType.U16)
#: 8- and 4-bit floats: a kernel only reads their bytes, inside a packed format's decode
BYTE_FLOATS = (DType.F8E4M3, DType.F8E5M2, DType.F8E8M0, DType.F4E2M1)

#: common uses of a dtype on a kernel backend
FULL = Use.all()
HELD = Use.STORAGE | Use.CONVERT | Use.DOT      # held, widened to F32; no arithmetic of its own
NARROW = Use.STORAGE | Use.CONVERT | Use.ARITH  # computed in 32-bit registers, wrapped back
PACKED = Use.STORAGE                            # a packed weight's source bytes only


def device_uses(*, full: Iterable[DType] = (), held: Iterable[DType] = (),
                narrow: Iterable[DType] = (), packed: Iterable[DType] = (),
                lacking: Iterable[DType] = ()) -> dict[DType, Use]:
    """A device's dtype uses by kind (`FULL`, `HELD`, `NARROW`, `PACKED`); `lacking`: dtypes
    it has no use of, listed as such (a dtype given a kind too has that kind)."""
    uses = dict.fromkeys(lacking, Use.NONE)
    for kind, dtypes in ((FULL, full), (HELD, held), (NARROW, narrow), (PACKED, packed)):
        uses.update(dict.fromkeys(dtypes, kind))
    return uses


@dataclass(frozen=True)
class DeviceClasses:
    """The classes of one device's dtypes that coverage rules are written in."""

    uses: Mapping[DType, Use]
    formats: frozenset

    def having(self, use: Use, floats_only: bool = False) -> frozenset:
        return frozenset(d for d, u in self.uses.items()
                         if use in u and (d.is_float or not floats_only))


class Dtypes:
    """A rule giving a set of dtypes (or packed formats) from a device's classes; rules
    combine with |, & and - (with each other or with single dtypes) and print as written."""

    def __init__(self, text: str, of: Callable[[DeviceClasses], frozenset]):
        self.text, self.of = text, of

    def __repr__(self) -> str:
        return self.text

    def _join(self, sym: str, other, fn) -> Dtypes:
        o = other if isinstance(other, Dtypes) else exactly(other)
        return Dtypes(f"{self.text} {sym} {o.text}", lambda c: fn(self.of(c), o.of(c)))

    def __or__(self, other) -> Dtypes:
        return self._join("|", other, frozenset.union)

    def __and__(self, other) -> Dtypes:
        return self._join("&", other, frozenset.intersection)

    def __sub__(self, other) -> Dtypes:
        return self._join("-", other, frozenset.difference)


def exactly(*dtypes: DType) -> Dtypes:
    return Dtypes("{" + ", ".join(map(str, dtypes)) + "}", lambda c: frozenset(dtypes))


FLOATS = Dtypes("floats", lambda c: c.having(Use.ARITH, floats_only=True))  # computed with
ARITH = Dtypes("arith", lambda c: c.having(Use.ARITH))
DOT = Dtypes("dot", lambda c: c.having(Use.DOT))                 # contraction operands
DOT_FLOATS = Dtypes("dot floats", lambda c: c.having(Use.DOT, floats_only=True))
MOVED = Dtypes("moved", lambda c: c.having(Use.STORAGE | Use.CONVERT))  # loaded and stored
WORDS = exactly(I32, U32)
FORMATS = Dtypes("formats", lambda c: frozenset(c.formats))      # every registered format


@dataclass(frozen=True)
class Cover:
    """One op key's shared lowering: the dtypes it takes; `selects`: its kernels select
    in the element dtype; `offered`: lowered, but declared only by a backend that declares
    or elects it (a fusion whose gain is a schedule's, measured per target)."""

    dtypes: Dtypes
    selects: bool = False
    offered: bool = False


def _each(keys: Iterable[str], cover: Cover) -> dict[str, Cover]:
    return dict.fromkeys(keys, cover)


#: op key -> what its shared lowering takes. A new op adds one entry here.
COVERAGE: dict[str, Cover] = {
    **_each(UnaryOp.keys(lambda u: not u.bitwise), Cover(FLOATS)),
    "Unary.Neg": Cover(FLOATS | I32),
    **_each(UnaryOp.keys(lambda u: u.bitwise) + BinaryOp.keys(lambda b: b.bitwise),
            Cover(WORDS)),
    **_each(BinaryOp.keys(lambda b: not b.bitwise), Cover(ARITH)),
    "Select": Cover(ARITH, selects=True),
    "Iota": Cover(exactly(F32, I32)),
    **_each(("Cast", "Broadcast", "Reshape", "Transpose", "Slice", "Concat", "Gather",
             "ScatterUpdate", "DynamicUpdateSlice", "Fused", "FusedRow", "Scan",
             "ContractionEpilogue"), Cover(MOVED)),
    "GatedContraction": Cover(MOVED, offered=True),
    "ContractionPrologue": Cover(MOVED, offered=True),
    "ArgTopK": Cover(ARITH),
    "Reduce.Sum": Cover(ARITH),
    "Reduce.Max": Cover(ARITH - U32),
    **_each(("MatMul", "IndexedMatMul"), Cover(DOT - U32)),
    **_each(("Attention", "PagedAttention", "SinkAttention", "BlockTopK",
             "SelectedAttention"), Cover(DOT_FLOATS)),
    "TokenMajorAttention": Cover(DOT_FLOATS, offered=True),
    "FreshKVAttention": Cover(DOT_FLOATS, selects=True, offered=True),
    **_each(("Rope", "RopeScatter"), Cover(FLOATS, selects=True)),
    "RopeUpdateSlice": Cover(FLOATS, selects=True, offered=True),
    "TransposedUpdateSlice": Cover(MOVED, offered=True),
    "DenseContraction": Cover(DOT - I32),           # u32: f16 weights two to a word
    "NormedDenseContraction": Cover(DOT - I32, offered=True),
    **_each(("GroupedDenseContraction", "DenseRowGather"), Cover(DOT & BF16)),
    **_each(("PackedDequant", "PackedContraction", "PackedRowGather",
             "IndexedPackedContraction"), Cover(FORMATS)),
    "NormedPackedContraction": Cover(FORMATS, offered=True),
    "QuantizeI8": Cover(exactly(F32)),
}

SCAN_NOTE = ("one kernel looping over the steps; its body eqns are checked as a region's, "
             "and a body with a reduction or contraction is refused (UnsupportedOp)")
PACKED_SOURCE_NOTE = ("held only as a packed weight's source bytes, which its format's decode "
                      "program reads as words; no op computes with it")

#: the IR specification's rule for SPIR-V targets (Vulkan's GLSL, WGSL): no select in a
#: 16-bit float
SPIRV_SELECT = {d: f"Select on {d.name} is not lowered on SPIR-V targets (the IR spec's rule)"
                for d in (F16, BF16)}

#: why what the lowerings leave out is refused, on every kernel backend
NOTES = {"AllReduce": "collectives are cuts between stages (a runtime's communicator "
                      "declares them)",
         "AllGather": "collectives are cuts between stages (a runtime's communicator "
                      "declares them)",
         "Scan": SCAN_NOTE,
         "Reduce.Max:u32": "no unsigned accumulator for Max",
         "MatMul:u32": "u32 is a contraction operand only as DenseContraction's f16 words"}


def kernel_ops(uses: Mapping[DType, Use], formats: Iterable[str], *,
               refuse: Mapping[str, Mapping[DType, str]] | None = None,
               no_select: Mapping[DType, str] | None = None, declare: Iterable[str] = (),
               elect: Iterable[str] = (), without: Mapping[str, str] | None = None,
               own: Mapping[str, Iterable] | None = None) -> tuple[dict, dict, frozenset]:
    """(op key -> dtypes, notes, unelected keys) of a device with these facts
    (`kernel_table`'s)."""
    refuse, no_select, without = dict(refuse or {}), dict(no_select or {}), dict(without or {})
    elect, own = set(elect), dict(own or {})
    offered = set(declare) | elect
    unknown = sorted((set(refuse) | set(without) | offered) - set(COVERAGE))
    if unknown or any(not COVERAGE[k].offered for k in offered):
        raise PootError(f"facts name op keys the lowerings do not offer: "
                        f"{unknown or sorted(k for k in offered if not COVERAGE[k].offered)}")
    if set(own) & set(COVERAGE):
        raise PootError(f"{sorted(set(own) & set(COVERAGE))}: the shared lowerings declare "
                        f"these already (a backend's own kernels for them need no entry)")
    classes = DeviceClasses(dict(uses), frozenset(formats))
    ops, notes = {}, dict(NOTES)
    for key, cover in COVERAGE.items():
        if key in without or (cover.offered and key not in offered):
            continue
        refused = dict(refuse.get(key, {}))
        if cover.selects:
            refused.update({d: why if key == "Select" else f"its kernels select in {d}: {why}"
                            for d, why in no_select.items()})
        ops[key] = cover.dtypes.of(classes) - set(refused)
        notes.update({f"{key}:{d}": why for d, why in refused.items()})
    notes.update(without)
    notes.update({str(d): PACKED_SOURCE_NOTE for d in BYTE_FLOATS if uses.get(d) == PACKED})
    ops.update({k: frozenset(v) for k, v in own.items()})
    return ops, notes, frozenset(k for k in offered - elect if k in ops)


def kernel_table(backend: str, device: str, uses: Mapping[DType, Use], formats, *,
                 refuse=None, no_select=None, declare: Iterable[str] = (),
                 elect: Iterable[str] = (), without=None, own=None,
                 limits: Mapping[str, int] | None = None,
                 notes: Mapping[str, str] | None = None) -> CapabilityTable:
    """The capability table of a kernel backend's device: `COVERAGE` on its facts (see the
    module docstring); `notes` (the device's own: its dtypes, its numerics) come last."""
    ops, derived, unelected = kernel_ops(uses, formats, refuse=refuse, no_select=no_select,
                                         declare=declare, elect=elect, without=without,
                                         own=own)
    return CapabilityTable.declare(backend, device, uses, ops, limits,
                                   {**derived, **(notes or {})}, unelected)


__all__ = ["ARITH", "BYTE_FLOATS", "COVERAGE", "Cover", "DOT", "DOT_FLOATS", "DeviceClasses",
           "Dtypes", "FLOATS", "FORMATS", "FULL", "HELD", "MOVED", "NARROW", "NARROW_INTS",
           "NOTES", "PACKED", "SCAN_NOTE", "SPIRV_SELECT", "WORDS", "device_uses", "exactly",
           "kernel_ops", "kernel_table"]
