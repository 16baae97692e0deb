"""Print a `poot.codegen.program.Kernel` as one WGSL compute shader.

Buffers become `@group(0) @binding(i)` storage arrays in the kernel's buffer order
(8/16-bit dtypes as u32 words; written ones as atomic words, so two threads storing
neighbouring fields of one word cannot lose each other's bits). Shared arrays are
`var<workgroup>`, local arrays function-scope `var`s. Builtin index variables come
from the WGSL builtins; a grid over the per-dimension workgroup limit is folded into
x and y and unfolded from the linear workgroup id. A CoopReduce is a tree reduction
over a workgroup array of the printer's own, with barriers between levels.
Device limits are checked here: a kernel that does not fit raises LimitExceeded.
"""
from __future__ import annotations

import re

from poot.codegen.program import (
    BUILTINS,
    Assign,
    Barrier,
    CoopReduce,
    For,
    If,
    Kernel,
    Let,
    Stmt,
    Store,
)
from poot.dtypes import DType
from poot.errors import LimitExceeded, UnsupportedOp
from poot.kernel_backend import CompiledKernel
from poot.ir.ops.reduce import ReduceOp

from poot_wgpu.device import WgpuDevice
from poot_wgpu.kernel import dispatch_groups
from poot_wgpu.wgsl.expr import ArrayInfo, Context, ExprPrinter
from poot_wgpu.wgsl.types import BACKEND, layout

_REDUCE_TYPES = {DType.F32: "f32", DType.I32: "i32"}


def _ident(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^0-9A-Za-z_]", "_", name)


class _KernelPrinter:
    def __init__(self, kernel: Kernel, dev: WgpuDevice):
        self.k, self.dev = kernel, dev
        self.lines: list[str] = []
        self.depth = 1
        written = {s.array for s in kernel.statements() if isinstance(s, Store)}
        arrays = {}
        for b in kernel.buffers:
            packed = layout(b.dtype, dev.features, dev.name, "Buffer").packed_bits
            arrays[b.name] = ArrayInfo(_ident("b_", b.name), b.dtype,
                                       atomic=bool(packed) and b.name in written)
        for a in (*kernel.shared, *kernel.locals):
            arrays[a.name] = ArrayInfo(_ident("s_" if a in kernel.shared else "l_", a.name),
                                       a.dtype)
        self.ctx = Context(dev.name, dev.features, arrays, self._builtins(), kernel=kernel.name)
        self.exprs = ExprPrinter(self.ctx)
        self.reduce_types: set[str] = set()

    # -- limits ------------------------------------------------------------------------
    def check_limits(self) -> tuple[int, int, int]:
        k, lim = self.k, self.dev.limits
        wg = k.workgroup3()
        for axis, size in zip("xyz", wg, strict=True):
            cap = lim[f"max-compute-workgroup-size-{axis}"]
            if size > cap:
                self.limit(f"workgroup {k.workgroup} is over max-compute-workgroup-size-{axis} "
                           f"{cap}")
        cap = lim["max-compute-invocations-per-workgroup"]
        if k.threads_per_group > cap:
            self.limit(f"{k.threads_per_group} threads per workgroup, over "
                       f"max-compute-invocations-per-workgroup {cap}")
        binding = lim["max-storage-buffer-binding-size"]
        for b in k.buffers:
            if b.nbytes > binding:
                self.limit(f"buffer {b.name!r} is {b.nbytes} bytes, over "
                           f"max-storage-buffer-binding-size {binding}")
        shared = sum(a.count * a.dtype.itemsize for a in k.shared)
        if k.reductions():
            shared += 4 * k.threads_per_group * len({s.value.dtype for s in k.reductions()})
        cap = lim["max-compute-workgroup-storage-size"]
        if shared > cap:
            self.limit(f"{shared} bytes of workgroup memory, over "
                       f"max-compute-workgroup-storage-size {cap}")
        cap = lim["max-storage-buffers-per-shader-stage"]
        if len(k.buffers) > cap:
            self.limit(f"{len(k.buffers)} buffers, over max-storage-buffers-per-shader-stage "
                       f"{cap}")
        return dispatch_groups(k, self.dev)

    def limit(self, msg: str):
        raise LimitExceeded(f"kernel {self.k.name}: {msg}", backend=BACKEND,
                            device=self.dev.name)

    # -- builtins --------------------------------------------------------------------------
    def _builtins(self) -> dict[str, str]:
        wg = self.k.workgroup3()
        out = {}
        for name, (kind, axis) in BUILTINS.items():
            a = "xyz"[axis]
            out[name] = {
                "local": f"i32(poot_lid.{a})",
                "group": f"poot_group_{a}",
                "global": f"(poot_group_{a} * {wg[axis]}i + i32(poot_lid.{a}))",
                "index": "i32(poot_lidx)",
            }[kind]
        return out

    def group_ids(self, folded: bool) -> None:
        gx, gy, gz = self.k.grid3()
        if not folded:
            for a in "xyz":
                self.emit(f"let poot_group_{a} = i32(poot_wid.{a});")
            return
        # the linear id is the same for every thread of a workgroup, so this return is
        # uniform and later barriers stay legal
        self.emit("let poot_lin = poot_wid.x + poot_nwg.x * (poot_wid.y + poot_nwg.y * "
                  "poot_wid.z);")
        self.emit(f"if (poot_lin >= {self.k.groups}u) {{ return; }}")
        self.emit(f"let poot_group_x = i32(poot_lin % {gx}u);")
        self.emit(f"let poot_group_y = i32((poot_lin / {gx}u) % {gy}u);")
        self.emit(f"let poot_group_z = i32(poot_lin / {gx * gy}u);")

    # -- statements --------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def expr(self, e) -> str:
        lets, text = self.exprs.print(e)
        for line in lets:
            self.emit(line)
        return text

    def block(self, body: tuple[Stmt, ...]) -> None:
        self.depth += 1
        for s in body:
            self.stmt(s)
        self.depth -= 1

    def stmt(self, s: Stmt) -> None:
        ctx = self.ctx
        if isinstance(s, Let):
            text = self.expr(s.value)
            name = _ident("v_", s.name)
            typ = ctx.layout(s.value.dtype).register
            self.emit(f"{'var' if s.mutable else 'let'} {name}: {typ} = {text};")
            ctx.variables[s.name] = name
        elif isinstance(s, Assign):
            self.emit(f"{ctx.variables[s.name]} = {self.expr(s.value)};")
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, If):
            lets, cond = self.exprs.print(s.cond, as_bool=True)
            for line in lets:
                self.emit(line)
            self.emit(f"if {cond} {{")
            self.block(s.then)
            if s.orelse:
                self.emit("} else {")
                self.block(s.orelse)
            self.emit("}")
        elif isinstance(s, Barrier):
            self.emit("workgroupBarrier();")
            self.emit("storageBarrier();")
        elif isinstance(s, CoopReduce):
            self.coop_reduce(s)
        else:
            raise UnsupportedOp(f"kernel {self.k.name}: no WGSL for statement {s!r}",
                                backend=BACKEND, device=self.dev.name)

    def loop(self, s: For) -> None:
        # the program's bounds are read once, at loop entry
        start, stop, step = (self.expr(e) for e in (s.start, s.stop, s.step))
        name = _ident("v_", s.var)
        self.emit("{")
        self.depth += 1
        self.emit(f"let poot_stop_{name} = {stop};")
        self.emit(f"let poot_step_{name} = {step};")
        self.emit(f"for (var {name}: i32 = {start}; {name} < poot_stop_{name}; "
                  f"{name} = {name} + poot_step_{name}) {{")
        self.ctx.variables[s.var] = name
        self.block(s.body)
        self.emit("}")
        self.depth -= 1
        self.emit("}")

    def store(self, s: Store) -> None:
        info = self.ctx.arrays[s.array]
        lay = self.ctx.layout(info.dtype, "Store")
        index, value = self.expr(s.index), self.expr(s.value)
        if not lay.packed_bits:
            self.emit(f"{info.wgsl_name}[{index}] = {value};")
            return
        if not info.atomic:
            raise UnsupportedOp(f"kernel {self.k.name}: store of packed {info.dtype} into "
                                f"{s.array!r}, a shared or local array", op="Store",
                                dtype=str(info.dtype), backend=BACKEND, device=self.dev.name)
        bits = lay.packed_bits
        mask = (1 << bits) - 1
        if info.dtype is DType.BF16:  # the register holds a bf16-exact f32: its top half
            field = f"(bitcast<u32>({value}) >> 16u)"
        else:
            field = f"(bitcast<u32>({value}) & {mask}u)"
        self.emit("{")
        self.depth += 1
        self.emit(f"let poot_i = u32({index});")
        self.emit(f"let poot_shift = (poot_i % {lay.per_word}u) * {bits}u;")
        self.emit(f"let poot_word = &{info.wgsl_name}[poot_i / {lay.per_word}u];")
        # clear then set only this field; other threads' fields commute with both
        self.emit(f"atomicAnd(poot_word, ~({mask}u << poot_shift));")
        self.emit(f"atomicOr(poot_word, {field} << poot_shift);")
        self.depth -= 1
        self.emit("}")

    def coop_reduce(self, s: CoopReduce) -> None:
        typ = _REDUCE_TYPES[s.value.dtype]
        self.reduce_types.add(typ)
        arr = f"poot_red_{typ}"
        width = s.width or self.k.threads_per_group
        value = self.expr(s.value)
        self.emit(f"{arr}[poot_lidx] = {value};")
        self.emit("workgroupBarrier();")
        half = width // 2
        while half:
            a, b = f"{arr}[poot_lidx]", f"{arr}[poot_lidx + {half}u]"
            if s.op is ReduceOp.Sum:
                combined = f"{a} + {b}"
            elif typ == "f32":
                combined = self.ctx.helpers.call("poot_max_f32", a, b)
            else:
                combined = f"max({a}, {b})"
            self.emit(f"if ((poot_lidx % {width}u) < {half}u) {{ {a} = {combined}; }}")
            self.emit("workgroupBarrier();")
            half //= 2
        name = _ident("v_", s.name)
        self.emit(f"let {name}: {typ} = {arr}[poot_lidx - poot_lidx % {width}u];")
        self.emit("workgroupBarrier();  // the scratch array is free for the next reduction")
        self.ctx.variables[s.name] = name

    # -- the whole shader ----------------------------------------------------------------------
    def run(self) -> CompiledKernel:
        k = self.k
        groups = self.check_limits()
        folded = groups != k.grid3()
        self.group_ids(folded)
        for a in k.locals:
            typ = self.ctx.layout(a.dtype, "LocalArray").register
            self.emit(f"var {self.ctx.arrays[a.name].wgsl_name}: array<{typ}, {a.count}>;")
        for s in k.body:
            self.stmt(s)
        head = [f"// poot kernel {k.name}: grid {k.grid}, workgroup {k.workgroup}"]
        decls = []
        for i, b in enumerate(k.buffers):
            info = self.ctx.arrays[b.name]
            lay = self.ctx.layout(b.dtype, "Buffer")
            elem = f"atomic<{lay.element}>" if info.atomic else lay.element
            decls.append(f"@group(0) @binding({i}) var<storage, read_write> {info.wgsl_name}: "
                         f"array<{elem}>;  // {b.dtype}[{b.count}] {b.access.value}")
        for a in k.shared:
            typ = _shared_type(self, a.dtype)
            decls.append(f"var<workgroup> {self.ctx.arrays[a.name].wgsl_name}: "
                         f"array<{typ}, {a.count}>;")
        for typ in sorted(self.reduce_types):
            decls.append(f"var<workgroup> poot_red_{typ}: array<{typ}, {k.threads_per_group}>;")
        if self.ctx.uses_f16:
            head.insert(0, "enable f16;")
        wx, wy, wz = k.workgroup3()
        entry = [
            f"@compute @workgroup_size({wx}, {wy}, {wz})",
            "fn main(@builtin(local_invocation_id) poot_lid: vec3<u32>,",
            "        @builtin(local_invocation_index) poot_lidx: u32,",
            "        @builtin(workgroup_id) poot_wid: vec3<u32>,",
            "        @builtin(num_workgroups) poot_nwg: vec3<u32>) {",
            *self.lines,
            "}",
        ]
        parts = ["\n".join(head), "\n".join(decls), self.ctx.helpers.source(), "\n".join(entry)]
        source = "\n\n".join(p for p in parts if p) + "\n"
        return CompiledKernel(k, source, groups=groups)


def _shared_type(printer: _KernelPrinter, dtype: DType) -> str:
    lay = printer.ctx.layout(dtype, "SharedArray")
    if lay.packed_bits:
        raise UnsupportedOp(f"kernel {printer.k.name}: workgroup array of {dtype}: WGSL has no "
                            f"8/16-bit workgroup storage; use f32/i32/u32", op="SharedArray",
                            dtype=str(dtype), backend=BACKEND, device=printer.dev.name)
    return lay.register


def print_kernel(kernel: Kernel, dev: WgpuDevice) -> CompiledKernel:
    """The WGSL of `kernel` for `dev` with its dispatch groups, or the typed refusal
    (DtypeLowering, LimitExceeded)."""
    return _KernelPrinter(kernel, dev).run()


class WgslPrinter:
    """The printer of one adapter (KernelBackend.printer)."""

    def __init__(self, dev: WgpuDevice):
        self.dev, self.device = dev, dev.name

    def source(self, kernel: Kernel) -> str:
        return print_kernel(kernel, self.dev).source
