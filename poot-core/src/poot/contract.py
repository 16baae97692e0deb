"""The backend contract: everything a poot plugin implements or receives, in one file.

A backend author reads this module alone (docs/backend-guide.md walks through it);
each class and hook below is documented once, here. The pieces, in the order a backend
meets them:

1. **Hooks** (`PootHookSpecs`): the functions a plugin marks `@hookimpl` and poot calls.
   A plugin is found through the `poot` entry point group of an installed package, or,
   for a backend's plugin, the `poot.backends` group, named by the backend it registers
   and imported only when that backend is asked for (or every backend is listed)::

       [project.entry-points."poot.backends"]
       mine = "poot_mine.plugin"        # a module with @hookimpl functions

   or registered explicitly with `poot.plugin.register(obj)` (tests, scripts).
2. **Device**: what `Backend.probe()` finds.
3. **Backend**: the base class a backend subclasses (probe, capabilities, lower,
   bind_time, runtime).
4. **Lowering**: what `Backend.lower` returns for one eqn.
5. **Plan** and its parts (Region, Place, WeightSpec, Step, Copy, Note): the plain data
   a runtime receives in `Runtime.load`.
6. **Runtime, Executable, DeviceBuffer**: the protocols a backend's runtime implements.

The capability table a backend declares (`Backend.capabilities`) is built with
`poot.capability.CapabilityTable.declare`; it lives in its own module because its
checks need the IR's op classes, and the IR sits above this file (its packed ops ask
the plugin manager, which reads the hooks below, for their weight formats).

Check a backend with `poot conformance NAME` (= `pytest --pyargs poot.conformance
--poot-backend NAME`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pluggy

from poot.errors import DeviceUnavailable

if TYPE_CHECKING:  # pragma: no cover - annotations only; the IR imports this module's users
    from poot.capability import CapabilityTable
    from poot.formats import WeightFormat
    from poot.ir.graph import Eqn, Graph, Lit
    from poot.ir.ops.base import OpKind
    from poot.ir.types import SlotKind, TensorType, ValueId, WeightRef

# == 1. Hooks ===============================================================================
PROJECT = "poot"
hookspec = pluggy.HookspecMarker(PROJECT)
#: mark a plugin's hook functions: `@hookimpl def poot_backends(): ...`
hookimpl = pluggy.HookimplMarker(PROJECT)


class PootHookSpecs:
    """The hooks poot calls. Every hook is optional for a plugin; a function whose name
    starts with `poot_` but is not one of these is reported as a misspelling.

    A list-returning hook must return a list (or tuple) of the objects it describes; a
    plugin whose module fails to import, whose hook raises or returns something else,
    or which registers a name another plugin already registered, is reported by
    `poot backends` ("plugins that failed to load") and hides no other plugin.
    """

    @hookspec
    def poot_backends(self) -> list[Backend]:
        """Return the backends this plugin provides: a list of `Backend` instances.

        Return them even when they find no device: `Backend.probe()` says which devices
        it finds, `unavailable_reason()` why it finds none. Names are global: when two
        plugins register one backend name, the first registered keeps it and the
        other is reported broken.
        """

    @hookspec
    def poot_weight_formats(self) -> list[WeightFormat]:
        """Return the packed weight formats this plugin registers (see `poot.formats`).

        Names are global ("gguf:Q4_K", "gptq:int4", ...); a format whose name another
        plugin already registered marks this plugin broken.
        """

    @hookspec
    def poot_slot_roles(self) -> list[SlotKind]:
        """Return owner-defined slot roles (`SlotKind.declare(label, dtype, lo, hi)`).

        The IR knows Token, Pos, SlotMap and WriteMap; a role only a pass or a runtime
        feature needs (adapter index, expert map, sampler inputs) is declared by its
        owner here, with its label and its one type rule (dtype and value range,
        checked when a slot is bound). poot declares the roles when the plugin manager
        starts and whenever a plugin is registered, so a graph can use them
        (`SlotKind.get(label)`); a role that conflicts with one already declared under
        its label marks its plugin broken. The conformance suite declares its own
        input roles this way.
        """

    @hookspec(firstresult=True)
    def poot_open_checkpoint(self, path: str, format_hint: str | None) -> Any:
        """Claim a checkpoint path and return an opened checkpoint, or None to pass.

        A checkpoint exposes `metadata` (dict), `tensors` (name -> TensorInfo with its
        PackedWeight descriptor or dtype, memory-mapped sources) and `close()`.
        poot-quant claims GGUF files and safetensors folders; the first plugin that
        returns a non-None value wins.
        """


# == 2. Device ===============================================================================
@dataclass(frozen=True)
class Device:
    """One device a backend found. `info` holds facts such as arch or memory, as
    (key, value) pairs; "adapter_type" or "device_type" "cpu" marks a software device."""

    backend: str
    index: int
    name: str
    info: tuple[tuple[str, Any], ...] = ()

    @property
    def is_software(self) -> bool:
        """A device emulated on the CPU (e.g. Mesa lavapipe): real shaders, CPU speed.
        Automatic selection passes it over; it is used when named."""
        kind = str(dict(self.info).get("adapter_type", dict(self.info).get("device_type", "")))
        return kind.lower() == "cpu"

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.index}"

    def __str__(self) -> str:
        return f"{self.id} ({self.name})"


# == 3. Backend ==============================================================================
class Backend:
    """Base class of backends; subclass it and override what differs.

    A backend
    1. finds its devices: `probe()` returns Device records, or an empty list with
       `unavailable_reason()` saying why ("no CUDA device: cuInit failed: ...");
    2. declares, per device, a capability table (`capabilities`): the dtype uses and,
       per op key, the dtypes or packed formats it lowers;
    3. lowers, at plan time, every eqn (a primitive, a fused region or another
       composite) to a `Lowering`, raising the typed refusal for anything its table
       does not declare, before anything runs (`lower`);
    4. says which constant eqns the planner folds on the host at bind time (`bind_time`);
    5. runs plans: `runtime(device)` returns a `Runtime`.
    """

    #: unique among installed backends; what users pass to `poot conformance` / `plan`
    name: str = "backend"
    #: automatic selection picks the highest-priority backend that finds a hardware
    #: device (the reference backend is 0, a GPU backend above it, an example below it)
    priority: int = 0
    #: the short kind of code it runs ("numpy", "cuda", "wgsl", "spirv"); "numpy" means
    #: host kernels (see `host_kernels`)
    language: str = ""
    #: True: the planner replaces every composite eqn (Fused, Attention, the packed
    #: contractions, ...) by its primitive definition before lowering, after checking
    #: that the table declares the composite itself. Only a backend whose composites are
    #: nothing but their definitions opts in (the reference backend); by default every
    #: declared composite reaches `lower` and runs your own kernel.
    inlines_composites: bool = False

    def probe(self) -> list[Device]:
        """The devices this backend can use now (the caller caches them).

        Never raises and never hangs: a missing driver or adapter gives `[]` (and
        `unavailable_reason()` says why). An exception here is reported as the
        backend's unavailability ("probe() raised ..."), never a crash."""
        return []

    def unavailable_reason(self) -> str | None:
        """Why `probe()` found no device, in one line; None when it found some."""
        return None

    def capabilities(self, device: Device) -> CapabilityTable:
        """The device's declaration, a `poot.capability.CapabilityTable`:

            CapabilityTable.declare("mine", device.id,
                dtypes={DType.F32: Use.all()},
                ops={k: [DType.F32] for k in op_keys("Unary", "Binary", "Reduce")},
                notes={"f16": "the reason a refusal gives"})

        `dtypes` says what each dtype can be used for (Use.STORAGE, CONVERT, ARITH,
        DOT); `ops` maps each op key ("Binary.Add", "MatMul", "Fused", ...;
        `poot.capability.every_op_key()`) to the dtypes, or for packed ops the format
        names, it lowers. An eqn is allowed only when every part of it is declared;
        the table's `refusal` is then the typed error (UnsupportedOp, DtypeLowering,
        LimitExceeded) naming op, dtype, backend and device. A backend never emulates
        what its table does not declare. Called often: build it once per device."""
        raise NotImplementedError(f"backend {self.name} declares no capability table")

    def lower(self, eqn: Eqn, graph: Graph, device: Device) -> Lowering:
        """Choose the kernel for one eqn of `graph`, at plan time, before anything runs.

        Receives: `eqn.op` (an OpKind of `poot.ir.ops`; Unary/Binary/Reduce carry their
        sub-op in `.op`, `eqn.op.op.name` is "Add", "Exp", ...), `eqn.inputs` (Values,
        whose types are `graph.type_of(v.id)`, and literals `poot.ir.Lit` with `.type`),
        the result type `graph.type_of(eqn.out)`, and the device.
        Returns: a `Lowering`. Raises the table's typed refusal for anything the table
        does not declare. This default does that check and returns a Lowering named by
        the op key; call it first (`super().lower(...)`) and attach your program.
        Every eqn is lowered, also those the planner then makes an alias (Reshape), a
        strided view or a bind-time fold: those never become a Step.
        """
        key = self.capabilities(device).check_eqn(eqn, graph)
        return Lowering(key, strided_inputs=self.host_kernels)

    @property
    def host_kernels(self) -> bool:
        """True when this backend's kernels are host numpy calls over views of its
        buffers (language "numpy"): they read strided views, and folding a constant eqn
        on the host at bind time costs nothing on the device."""
        return self.language == "numpy"

    def bind_time(self, eqn: Eqn, graph: Graph, device: Device) -> str | None:
        """Whether to evaluate `eqn`, whose operands are all constant (consts, computed
        values, literals or values folded before it), once at bind time on the host.

        Returns the storage representation of the folded result (a short name that goes
        into the weight cache key with the payload identities of its sources), or None
        to run the eqn on the device every step. The planner asks this only for eqns
        with constant operands. The default folds operand-less generators (Iota)
        everywhere, and every constant eqn on host-kernel backends, where a packed
        weight's storage representation is its decoded F32 matrix ("f32-decoded"). A
        GPU backend keeps packed weights packed (its contraction decodes them).
        """
        if not eqn.inputs:
            return "computed"
        if not self.host_kernels:
            return None
        return "f32-decoded" if eqn.op.name == "PackedDequant" else "folded"

    def runtime(self, device: Device) -> Runtime:
        """A `Runtime` for `device` (section 6)."""
        raise NotImplementedError(f"backend {self.name} has no runtime")

    def tensor_parallel_group(self, ranks: int):
        """A group of `ranks` tensor-parallel ranks on this backend's devices: an object with
        `ranks`, `processes` (True: one process per rank, the group picklable to them;
        False: ranks as threads of one process) and `member(rank, device)`, the rank's
        Communicator, which its runtime's `communicator` is set to. Backends without
        collectives across ranks refuse."""
        from poot.errors import UnsupportedOp

        raise UnsupportedOp(f"backend {self.name} runs no collectives across ranks",
                            op="AllReduce", backend=self.name)

    def default_device(self) -> Device:
        devs = self.probe()
        if not devs:
            raise DeviceUnavailable(f"backend {self.name} has no device: "
                                    f"{self.unavailable_reason() or 'unknown reason'}")
        return devs[0]


# == 4. Lowering =============================================================================
@dataclass
class Lowering:
    """A backend's plan-time choice for one eqn: the kernel and its launch shape.

    `kernel` is a short name a person reads in `poot plan` ("gemv", "fused_row");
    `launch` a printable shape (grid, workgroup); `program` whatever the backend's
    runtime needs later (a poot.codegen Kernel, source text, a callable). `dispatches`
    is 0 for work-free aliases. `strided_inputs` says the kernel reads its operands
    through element strides, so the planner may hand it a Transpose as a strided view
    instead of a copy. `extra` is the backend's own.
    """

    kernel: str
    launch: str = ""
    program: Any = None
    dispatches: int = 1
    extra: dict = field(default_factory=dict)
    strided_inputs: bool = False

    def __str__(self) -> str:
        return f"{self.kernel}{f' [{self.launch}]' if self.launch else ''}"


# == 5. Plan: what Runtime.load receives ======================================================
#: every arena offset the planner hands out is a multiple of ALIGN bytes
ALIGN = 256
#: the name of the region that holds every intermediate of a step
ARENA = "arena"


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Region:
    """One buffer the executor allocates: kind "arena" (all intermediates, one buffer),
    "weight" (a bound const or a bind-time folded value, shared through the weight
    cache), "slot" (per-step inputs, rewritten by the host) or "state" (carried across
    steps, donated: updated in place).

    `value` is the binder a slot or state region holds; `weight` the WeightSpec a weight
    region holds.
    """

    name: str
    kind: str
    nbytes: int
    value: ValueId | None = None
    weight: WeightSpec | None = None


@dataclass(frozen=True)
class Place:
    """Where one tensor lives: the bytes of region `region` from byte `offset`, of `type`.

    `strides` (in elements) is None for a C-contiguous tensor, else the strides of a
    view into its region (a Transpose planned as a strided view); it is set only for
    operands of a Lowering with `strided_inputs=True`.
    """

    region: str
    offset: int
    type: TensorType
    strides: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    @property
    def contiguous(self) -> bool:
        return self.strides is None

    def __str__(self) -> str:
        # a weight or state place shows its offset only inside the buffer (a slice of it)
        where = (f"{self.region}+{self.offset}" if self.region == ARENA or self.offset
                 else self.region)
        view = f" strides={self.strides}" if self.strides else ""
        return f"{self.type}@{where}{view}"


@dataclass(frozen=True, eq=False)
class WeightSpec:
    """A tensor bound once and cached: a const binder, or a value folded at bind time.

    A raw const has `binder` set (and `ref`, its WeightRef, when the graph names one).
    A folded value has `op` and `operands` (WeightSpecs or Lits) and is computed once on
    the host by the oracle. `representation` names its storage representation in the
    weight cache key ("f32-decoded" for a decoded packed weight, "folded" otherwise).
    """

    type: TensorType
    binder: ValueId | None = None
    ref: WeightRef | None = None
    op: OpKind | None = None
    operands: tuple[WeightSpec | Lit, ...] = ()
    representation: str = ""

    @property
    def folded(self) -> bool:
        return self.binder is None


@dataclass(frozen=True, eq=False)
class Step:
    """One planned eqn that dispatches work.

    `inputs` holds a Place per Value operand and the Lit itself per literal, in operand
    order; `out` is where the result goes. `inplace` marks a DynamicUpdateSlice or
    ScatterUpdate whose `out` is the donated state buffer its first operand already
    occupies: writing only the update is enough. `lowering` is what `Backend.lower`
    returned for `eqn`.
    """

    index: int
    eqn: Eqn
    lowering: Lowering
    inputs: tuple[Place | Lit, ...]
    out: Place
    inplace: bool = False


@dataclass(frozen=True)
class Copy:
    """An end-of-step copy: a state_out value that could not be updated in place."""

    src: Place
    dst: Place


@dataclass(frozen=True)
class Note:
    """A planned eqn that dispatches nothing: an alias (Reshape, or a Slice that is one
    contiguous run of its operand, at an offset), a strided view (Transpose, Slice) or a
    value folded at bind time. Kept for printing."""

    index: int
    eqn: Eqn
    kind: str            # "alias", "view" or "bind"
    out: Place


@dataclass
class Plan:
    """A graph laid out for one backend device, before the first dispatch.

    What a step does, in order: every `steps` entry (one eqn each), then every `copies`
    entry. `regions` names every buffer (`Runtime.load` receives one DeviceBuffer per
    name); `places` says where each value lives; `notes` (aliases, views, bind-time
    folds) dispatch nothing. `poot.plan.show.format_plan(plan)` prints it.
    """

    graph: Graph
    backend: Backend
    device: Device
    steps: list[Step]
    copies: list[Copy]
    notes: list[Note]
    regions: dict[str, Region]
    places: dict[ValueId, Place]
    outputs: list[tuple[Any, Place]]          # (GraphOutput, Place) for non-state outputs
    state: list[tuple[ValueId, ValueId, str]]  # (state_in, state_out, region name)
    #: sum of the sizes of every intermediate that got its own buffer, unshared
    unshared_bytes: int = 0
    intervals: dict[ValueId, tuple[int, int]] = field(default_factory=dict)

    @property
    def arena_size(self) -> int:
        return self.regions[ARENA].nbytes

    @property
    def dispatches(self) -> int:
        return sum(s.lowering.dispatches for s in self.steps) + len(self.copies)

    def weight_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "weight"]

    def slot_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "slot"]

    def state_regions(self) -> list[Region]:
        return [r for r in self.regions.values() if r.kind == "state"]


# == 6. Runtime ==============================================================================
@runtime_checkable
class DeviceBuffer(Protocol):
    """A block of device memory at a stable address, as `Runtime.alloc` returns it.

    `nbytes` is its size and `label` a name for messages and `poot plan`. A backend adds
    whatever it needs (a device pointer, a wgpu buffer, a numpy array).
    """

    nbytes: int
    label: str


@runtime_checkable
class Executable(Protocol):
    """A plan loaded onto a runtime with its buffers bound: one call of `run()` is one step."""

    #: True once a recording exists, so the next `run()` replays it (always False for
    #: runtimes that run the plan directly, such as the reference runtime)
    recorded: bool

    def run(self) -> None:
        """Run one step: every planned kernel in order, then the plan's end-of-step copies.

        Reads slots, state and weights from their buffers and writes the arena and the
        donated state buffers in place. Allocates and compiles nothing. A GPU runtime
        records the step on the first call and replays it afterwards (buffers are at
        stable addresses and slots are rewritten in place, so the recording stays
        valid); it returns when the step is complete.
        """
        ...


@runtime_checkable
class Runtime(Protocol):
    """Memory and execution on one device of one backend; knows nothing about graphs
    beyond the Plan it is handed. The executor (`poot.runtime.Executor`) drives it:

        rt = backend.runtime(device)
        arena = rt.alloc(plan.arena_size, "arena")           # once, before the first step
        w = rt.alloc(nbytes, "w:blk.0.attn_q"); rt.write(w, 0, array)   # each weight once
        exe = rt.load(plan, {region name: buffer for every region of the plan})
        for each step:
            rt.write(slot_buffer, 0, token_ids)               # slots rewritten in place
            exe.run()                                         # one step
            rt.read(arena, place.offset, place.nbytes)        # outputs, as bytes

    Rules the conformance suite checks: a DeviceBuffer never moves or changes size;
    `write` before `run` is seen by that step and `read` after it sees its results; a
    kernel writes only its result's bytes (the suite surrounds every result and every
    buffer with sentinel bytes) and never its operands; replaying a step changes no bit.
    """

    device: Device

    def alloc(self, nbytes: int, label: str) -> DeviceBuffer:
        """Device memory of `nbytes` bytes at a stable address (contents undefined).

        Alignment: at least ALIGN (256) bytes, so every arena offset the planner hands
        out is aligned for any dtype and for storage-buffer binding. Raises
        `poot.errors.CapacityError` when the device is out of memory.
        """
        ...

    def write(self, buf: DeviceBuffer, offset: int, array: np.ndarray) -> None:
        """Copy the bytes of `array` (C order) from the host into `buf` at byte `offset`,
        in place (the buffer keeps its address)."""
        ...

    def read(self, buf: DeviceBuffer, offset: int, nbytes: int) -> np.ndarray:
        """`nbytes` bytes of `buf` from byte `offset`, as a fresh host uint8 array."""
        ...

    def load(self, plan: Plan, buffers: Mapping[str, DeviceBuffer]) -> Executable:
        """Build the plan's kernels once and bind them to `buffers` (one DeviceBuffer per
        `plan.regions` name). Raises the backend's typed LoweringError for anything it
        cannot run, before any step runs."""
        ...


class Communicator(Protocol):
    """One rank's membership of a tensor-parallel group, owned by a runtime that has one
    (`runtime.communicator`). The runtime runs a plan's collective steps (AllReduce sums
    over the group, AllGather concatenates the ranks' shards in rank order, both along the
    flat buffer) through it; a runtime without one refuses a plan holding them. Capability
    tables declare the collectives only through `CapabilityTable.with_communicator`."""

    rank: int
    ranks: int
    #: the element types its collectives move (and AllReduce sums)
    dtypes: frozenset


__all__ = ["PROJECT", "hookspec", "hookimpl", "PootHookSpecs", "Device", "Backend",
           "Lowering", "ALIGN", "ARENA", "align", "Region", "Place", "WeightSpec", "Step",
           "Copy", "Note", "Plan", "DeviceBuffer", "Executable", "Runtime", "Communicator"]
