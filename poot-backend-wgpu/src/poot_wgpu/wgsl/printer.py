"""WGSL: a dialect of the printer core (poot.codegen.printer) for one wgpu adapter.

Language gaps the program can say in its own words are rewritten before printing
(poot_wgpu.wgsl.rewrite: F16 arithmetic in F32, 8/16-bit integer arithmetic in 32-bit
words, constant subtrees folded), so Unary and Binary print through the shared tables
(poot.codegen.scalar.UNARY, BINARY) as every dialect's do. What is left is WGSL's
spelling:

* Buffers are `@group(0) @binding(i)` storage arrays in the kernel's buffer order;
  8/16-bit dtypes live in u32 words (`types.LAYOUTS`), written ones as atomic words so
  two threads storing neighbouring fields of one word cannot lose each other's bits.
  Every binding is declared read_write; a dispatch that only reads a buffer declares it
  read-only when it binds it (poot_wgpu.kernel.with_read_only).
* Comparisons are bools; the program's I32 indicators are `select(0i, 1i, b)`, and an
  indicator feeding a condition or And/Or uses the bool itself.
* A node a tree uses more than once is bound to a `let` before its statement, so
  shared decode subtrees are computed once and the text stays linear in the tree.
* Where a WGSL builtin differs from poot's scalar rules (x / 0, shifts >= 32, NaN in
  max, float-to-int saturation, bf16 rounding, erf) the named helper of the shared table
  spells the rule out, in WGSL (`helpers`).
* A grid over the per-dimension workgroup limit is folded into x and y and unfolded
  from the linear workgroup id; a CoopReduce is a tree reduction over a workgroup
  array of the printer's own, except that one over the whole workgroup uses subgroup
  operations where the adapter has the `subgroup` feature (`subgroup_reduce`). Device limits are checked first (kernel.check_limits).
* Dot4 (target.DOT4) is dot4I8Packed, which takes both words' bytes as signed: a
  second product adds the top bits of the unsigned operand's bytes where they may be set.
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
from poot.codegen.expr import Bin, Const, Dot4, Expr, Load, Sel, Un, Var, children
from poot.codegen.printer import Printer
from poot.codegen.program import Barrier, CoopReduce, For, Kernel, Let, Store
from poot.codegen.scalar import BINARY, HELPERS, INT_RANGES, UNARY, word_class
from poot.codegen.target import DOT4
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp
from poot.ir.ops.elementwise import BinaryOp, UnaryOp
from poot.ir.ops.reduce import ReduceOp
from poot.kernel_backend import CompiledKernel

from poot_wgpu.device import WgpuDevice, target_features
from poot_wgpu.kernel import check_limits, dispatch_groups
from poot_wgpu.wgsl.helpers import Helpers
from poot_wgpu.wgsl.rewrite import rewrite_expr, rewrite_kernel
from poot_wgpu.wgsl.types import ARITHMETIC, BACKEND, Layout, layout

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
_NARROW_BITS = {DType.I8: 8, DType.U8: 8, DType.I16: 16, DType.U16: 16}
_REDUCE_TYPES = {F32: "f32", I32: "i32"}

def _ident(prefix: str, name: str) -> str:
    return prefix + re.sub(r"[^0-9A-Za-z_]", "_", name)


def _small_constant(e: Expr, bound: int) -> int | None:
    """The value of an integer constant in [0, bound), else None."""
    if isinstance(e, Const) and e.dtype.is_int and 0 <= int(e.value) < bound:
        return int(e.value)
    return None


def f32_literal(value: float) -> str:
    v = np.float32(value)
    bits = int(v.view(np.uint32))
    if not np.isfinite(v) or (v != 0 and abs(v) < np.finfo(np.float32).tiny):
        return f"bitcast<f32>(0x{bits:08x}u)"  # WGSL has no NaN/Inf literals; keep subnormals
    text = repr(float(v))
    return f"({text}f)" if text.startswith("-") else f"{text}f"


def _wrap_int(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if signed and value >> (bits - 1) else value


def int_literal(value: int, dtype: DType) -> str:
    if dtype in (I32, DType.I16, DType.I8):
        v = _wrap_int(int(value), 32 if dtype is I32 else _NARROW_BITS[dtype], True)
        if v == -2**31:
            return "(-2147483647i - 1i)"
        return f"({v}i)" if v < 0 else f"{v}i"
    v = _wrap_int(int(value), 32 if dtype is U32 else _NARROW_BITS[dtype], False)
    return f"{v}u"


class WgslPrinter(Printer):
    """Prints kernel programs as WGSL compute shaders for one adapter (`dev`)."""

    backend = BACKEND

    def __init__(self, dev: WgpuDevice):
        self.dev, self.device = dev, dev.name

    @property
    def native_dot4(self) -> bool:
        return DOT4 in target_features(self.dev)

    def rewrite(self, kernel: Kernel) -> Kernel:
        return rewrite_kernel(kernel)

    def check_dtypes(self, kernel: Kernel) -> None:
        """Each dtype is checked where it is used (`layout`), naming that use."""

    # -- per-kernel state ------------------------------------------------------------
    def unit(self, kernel: Kernel) -> str:
        self.helpers, self.uses_f16, self.reduce_types = Helpers(self), False, set()
        self.uses_subgroups = False
        self._temps, self._tree = 0, None
        written = {s.array for s in kernel.statements() if isinstance(s, Store)}
        self.arrays: dict[str, tuple[str, DType, bool]] = {}   # name -> (wgsl, dtype, atomic)
        for b in kernel.buffers:
            packed = self.layout(b.dtype, "Buffer").packed_bits
            self.arrays[b.name] = (_ident("b_", b.name), b.dtype, bool(packed) and
                                   b.name in written)
        for a in (*kernel.shared, *kernel.locals):
            prefix = "s_" if a in kernel.shared else "l_"
            self.arrays[a.name] = (_ident(prefix, a.name), a.dtype, False)
        self.variables = {}
        check_limits(kernel, self.dev)
        groups = dispatch_groups(kernel, self.dev)
        body = self.group_ids(kernel, folded=groups != kernel.grid3())
        for a in kernel.locals:
            typ = self.layout(a.dtype, "LocalArray").register
            body.append(f"  var {self.arrays[a.name][0]}: array<{typ}, {a.count}>;")
        body += self.block(kernel.body, 1)
        return self.assemble(kernel, body)

    def assemble(self, k: Kernel, body: list[str]) -> str:
        head = [f"// poot kernel {k.name}: grid {k.grid}, workgroup {k.workgroup}"]
        decls = []
        for i, b in enumerate(k.buffers):
            wgsl, _, atomic = self.arrays[b.name]
            element = self.layout(b.dtype, "Buffer").element
            element = f"atomic<{element}>" if atomic else element
            decls.append(f"@group(0) @binding({i}) var<storage, read_write> {wgsl}: "
                         f"array<{element}>;  // {b.dtype}[{b.count}] {b.access.value}")
        for a in k.shared:
            lay = self.layout(a.dtype, "SharedArray")
            if lay.packed_bits:
                raise UnsupportedOp(f"kernel {k.name}: workgroup array of {a.dtype}: WGSL has "
                                    f"no 8/16-bit workgroup storage; use f32/i32/u32",
                                    op="SharedArray", dtype=str(a.dtype), backend=BACKEND,
                                    device=self.device)
            decls.append(f"var<workgroup> {self.arrays[a.name][0]}: "
                         f"array<{lay.register}, {a.count}>;")
        for typ in sorted(self.reduce_types):
            decls.append(f"var<workgroup> poot_red_{typ}: array<{typ}, {k.threads_per_group}>;")
        if self.uses_f16:
            head.insert(0, "enable f16;")
        wx, wy, wz = k.workgroup3()
        # naga takes the subgroup builtins with the device's `subgroup` feature alone (no
        # `enable subgroups;`)
        subgroups = ["        @builtin(subgroup_invocation_id) poot_sg_lane: u32,",
                     "        @builtin(subgroup_id) poot_sg_id: u32,",
                     "        @builtin(num_subgroups) poot_sg_count: u32,"] \
            if self.uses_subgroups else []
        entry = [f"@compute @workgroup_size({wx}, {wy}, {wz})",
                 "fn main(@builtin(local_invocation_id) poot_lid: vec3<u32>,",
                 "        @builtin(local_invocation_index) poot_lidx: u32,", *subgroups,
                 "        @builtin(workgroup_id) poot_wid: vec3<u32>,",
                 "        @builtin(num_workgroups) poot_nwg: vec3<u32>) {", *body, "}"]
        parts = ["\n".join(head), "\n".join(decls), self.helpers.source(), "\n".join(entry)]
        return "\n\n".join(p for p in parts if p) + "\n"

    # -- dtypes, limits, refusals ------------------------------------------------------
    def layout(self, dtype: DType, op: str = "") -> Layout:
        lay = layout(dtype, self.dev.features, self.device, op)
        self.uses_f16 |= dtype is F16
        return lay

    def refuse_dtype(self, msg: str, dtype: DType, op: str):
        raise DtypeLowering(f"kernel {self.kernel.name}: {msg}", op=op, dtype=str(dtype),
                            backend=BACKEND, device=self.device)

    def arith(self, d: DType, op: str) -> None:
        self.layout(d, op)
        if d not in ARITHMETIC:
            self.refuse_dtype(f"{op} on {d}: {d} is storage-and-conversion only on wgpu; cast "
                              f"to f32 first", d, op)

    # -- builtins and group ids ------------------------------------------------------------
    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        a = "xyz"[axis]
        return {"local": f"i32(poot_lid.{a})", "group": f"poot_group_{a}",
                "global": f"(poot_group_{a} * {kernel.workgroup3()[axis]}i + i32(poot_lid.{a}))",
                "index": "i32(poot_lidx)"}[kind]

    def group_ids(self, k: Kernel, folded: bool) -> list[str]:
        if not folded:
            return [f"  let poot_group_{a} = i32(poot_wid.{a});" for a in "xyz"]
        gx, gy, _ = k.grid3()
        # the linear id is the same for every thread of a workgroup, so this return is
        # uniform and later barriers stay legal
        return ["  let poot_lin = poot_wid.x + poot_nwg.x * (poot_wid.y + poot_nwg.y * "
                "poot_wid.z);", f"  if (poot_lin >= {k.groups}u) {{ return; }}",
                f"  let poot_group_x = i32(poot_lin % {gx}u);",
                f"  let poot_group_y = i32((poot_lin / {gx}u) % {gy}u);",
                f"  let poot_group_z = i32(poot_lin / {gx * gy}u);"]

    def name(self, var: str) -> str:
        try:
            return self.variables[var]
        except KeyError:
            raise UnsupportedOp(f"kernel {self.kernel.name}: variable {var!r} is not in scope",
                                backend=BACKEND, device=self.device) from None

    # -- statements --------------------------------------------------------------------------
    def let(self, s: Let, depth: int) -> list[str]:
        text = self.expr(s.value)
        name = self.variables[s.name] = _ident("v_", s.name)
        typ = self.layout(s.value.dtype).register
        return [f"{self.pad(depth)}{'var' if s.mutable else 'let'} {name}: {typ} = {text};"]

    def barrier_stmt(self, s: Barrier, depth: int) -> list[str]:
        return [self.pad(depth) + "workgroupBarrier();", self.pad(depth) + "storageBarrier();"]

    def loop(self, s: For, depth: int) -> list[str]:
        # the program's bounds are read once, at loop entry
        pad, inner = self.pad(depth), self.pad(depth + 1)
        start, stop, step = (self.expr(e) for e in (s.start, s.stop, s.step))
        name = self.variables[s.var] = _ident("v_", s.var)
        return [pad + "{", f"{inner}let poot_stop_{name} = {stop};",
                f"{inner}let poot_step_{name} = {step};",
                f"{inner}for (var {name}: i32 = {start}; {name} < poot_stop_{name}; "
                f"{name} = {name} + poot_step_{name}) {{", *self.block(s.body, depth + 2),
                inner + "}", pad + "}"]

    def store(self, s: Store, depth: int) -> list[str]:
        wgsl, dtype, atomic = self.arrays[s.array]
        lay = self.layout(dtype, "Store")
        pad, inner = self.pad(depth), self.pad(depth + 1)
        index, value = self.expr(s.index), self.expr(s.value)
        if not lay.packed_bits:
            return [f"{pad}{wgsl}[{index}] = {value};"]
        if not atomic:
            raise UnsupportedOp(f"kernel {self.kernel.name}: store of packed {dtype} into "
                                f"{s.array!r}, a shared or local array", op="Store",
                                dtype=str(dtype), backend=BACKEND, device=self.device)
        bits, mask = lay.packed_bits, (1 << lay.packed_bits) - 1
        if dtype is BF16:  # the register holds a bf16-exact f32: its top half
            field = f"(bitcast<u32>({value}) >> 16u)"
        else:
            field = f"(bitcast<u32>({value}) & {mask}u)"
        # clear then set only this field; other threads' fields commute with both
        return [pad + "{", f"{inner}let poot_i = u32({index});",
                f"{inner}let poot_shift = (poot_i % {lay.per_word}u) * {bits}u;",
                f"{inner}let poot_word = &{wgsl}[poot_i / {lay.per_word}u];",
                f"{inner}atomicAnd(poot_word, ~({mask}u << poot_shift));",
                f"{inner}atomicOr(poot_word, {field} << poot_shift);", pad + "}"]

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        pad = self.pad(depth)
        typ = _REDUCE_TYPES[s.value.dtype]
        self.reduce_types.add(typ)
        arr, width = f"poot_red_{typ}", s.width or self.kernel.threads_per_group
        if width == self.kernel.threads_per_group and self.subgroup_op(s.op, typ):
            return self.subgroup_reduce(s, typ, pad)
        out = [f"{pad}{arr}[poot_lidx] = {self.expr(s.value)};", f"{pad}workgroupBarrier();"]
        half = width // 2
        while half:
            a, b = f"{arr}[poot_lidx]", f"{arr}[poot_lidx + {half}u]"
            out += [f"{pad}if ((poot_lidx % {width}u) < {half}u) {{ {a} = "
                    f"{self.combine(s.op, typ, a, b)}; }}", f"{pad}workgroupBarrier();"]
            half //= 2
        name = self.variables[s.name] = _ident("v_", s.name)
        return out + [f"{pad}let {name}: {typ} = {arr}[poot_lidx - poot_lidx % {width}u];",
                      f"{pad}workgroupBarrier();  // the scratch array is free for the next "
                      f"reduction"]

    def combine(self, op: ReduceOp, typ: str, a: str, b: str) -> str:
        if op is ReduceOp.Sum:
            return f"{a} + {b}"
        return self.helpers.call("poot_fmax", a, b) if typ == "f32" else f"max({a}, {b})"

    def subgroup_op(self, op: ReduceOp, typ: str) -> str | None:
        """The subgroup builtin that reduces `op` over `typ`, where the adapter has the
        `subgroup` feature: Sum, and Max of integers (an f32 Max keeps the NaN rule of
        poot_fmax, which subgroupMax does not promise)."""
        if not self.dev.has("subgroup"):
            return None
        if op is ReduceOp.Sum:
            return "subgroupAdd"
        return "subgroupMax" if typ != "f32" else None

    def subgroup_reduce(self, s: CoopReduce, typ: str, pad: str) -> list[str]:
        """A reduction over the whole workgroup with subgroup operations: each subgroup
        reduces its lanes, its first lane stores the partial at the subgroup's id, and the
        workgroup's first thread folds the partials in id order and shares the result (every
        thread folding them was slower on lavapipe than the tree). Which invocations form a
        subgroup does not matter here (only that each belongs to one), so WGSL's loose
        promise suffices."""
        self.uses_subgroups = True
        arr, name = f"poot_red_{typ}", _ident("v_", s.name)
        part, acc = f"{name}_part", f"{name}_acc"
        self.variables[s.name] = name
        return [f"{pad}let {part}: {typ} = {self.subgroup_op(s.op, typ)}({self.expr(s.value)});",
                f"{pad}if (poot_sg_lane == 0u) {{ {arr}[poot_sg_id] = {part}; }}",
                f"{pad}workgroupBarrier();",
                f"{pad}if (poot_lidx == 0u) {{",
                f"{pad}  var {acc}: {typ} = {arr}[0];",
                f"{pad}  for (var poot_j = 1u; poot_j < poot_sg_count; poot_j++) {{ "
                f"{acc} = {self.combine(s.op, typ, acc, f'{arr}[poot_j]')}; }}",
                f"{pad}  {arr}[0] = {acc};",
                f"{pad}}}",
                f"{pad}workgroupBarrier();",
                f"{pad}let {name}: {typ} = {arr}[0];",
                f"{pad}workgroupBarrier();  // the scratch array is free for the next "
                f"reduction"]

    # -- expressions: one tree at a time, shared nodes named ------------------------------
    def expr(self, e: Expr) -> str:
        if self._tree is not None:
            return self.node(e)
        uses: Counter[int] = Counter()
        seen: set[int] = set()

        def count(n: Expr):
            uses[id(n)] += 1
            if id(n) not in seen:
                seen.add(id(n))
                for c in children(n):
                    count(c)

        count(e)
        self._tree, self.bools = (uses, {}), {}
        try:
            return self.node(e)
        finally:
            self._tree = None

    def node(self, n: Expr) -> str:
        uses, memo = self._tree
        if id(n) in memo:
            return memo[id(n)]
        for c in children(n):   # children first, in order: the names follow the tree
            self.node(c)
        text = super().expr(n)
        if uses[id(n)] > 1 and not isinstance(n, (Const, Var)):
            self._temps += 1
            self.emit_before(f"let t{self._temps} = {text};")
            text = f"t{self._temps}"
        memo[id(n)] = text
        return text

    def condition(self, e: Expr) -> str:
        """The bool `e != 0` of an I32 expression."""
        text = self.expr(e)
        return self.bools.get(id(e)) or f"({text} != 0i)"

    def indicator(self, n: Expr, boolean: str) -> str:
        self.bools[id(n)] = boolean
        return f"select(0i, 1i, {boolean})"

    def const(self, value, d: DType) -> str:
        self.layout(d, "Const")
        if d is F32:
            return f32_literal(value)
        if d is BF16:
            return f32_literal(float(np.float32(value).astype(d.numpy)))
        if d is F16:
            v = float(np.float16(value))
            if math.isfinite(v) and (v == 0 or abs(v) >= float(np.finfo(np.float16).tiny)):
                text = repr(v)
                return f"({text}h)" if text.startswith("-") else f"{text}h"
            return f"f16({f32_literal(v)})"
        return int_literal(int(value), d)

    def var(self, e: Var) -> str:
        self.layout(e.dtype)
        return super().var(e)

    def load(self, n: Load) -> str:
        wgsl, dtype, atomic = self.arrays[n.buffer]
        lay, index = self.layout(dtype, "Load"), self.expr(n.index)
        if not lay.packed_bits:
            return f"{wgsl}[{index}]"
        word = f"{wgsl}[u32({index}) / {lay.per_word}u]"
        word = f"atomicLoad(&{word})" if atomic else word
        offset = f"(u32({index}) % {lay.per_word}u) * {lay.packed_bits}u"
        if dtype is BF16:
            return self.helpers.call("poot_bf16_to_f32", f"extractBits({word}, {offset}, 16u)")
        if dtype.is_signed:  # extractBits on i32 sign-extends the field
            return f"extractBits(bitcast<i32>({word}), {offset}, {lay.packed_bits}u)"
        return f"extractBits({word}, {offset}, {lay.packed_bits}u)"

    def apply(self, rule: str, **args: str) -> str:
        """A table entry: an operator template, or a helper's call (its WGSL spelling)."""
        if rule in HELPERS:
            return self.helpers.call(rule, *args.values())
        return rule.format(**args)

    def unary(self, n: Un) -> str:
        d = n.x.dtype
        self.arith(d, f"Unary.{n.op.name}")
        if n.op is UnaryOp.Clz:
            return f"countLeadingZeros({self.expr(n.x)})"
        return self.apply(UNARY[n.op][word_class(d)], x=self.expr(n.x))

    def binary(self, n: Bin) -> str:
        d, op = n.a.dtype, n.op
        self.arith(d, f"Binary.{op.name}")
        a, b = self.expr(n.a), self.expr(n.b)
        if op.compare:
            return self.indicator(n, self.apply(BINARY[op][word_class(d)], a=a, b=b))
        if op in (BinaryOp.And, BinaryOp.Or, BinaryOp.Xor):
            logical = self.logical(n)
            if logical:
                return self.indicator(n, logical)
        if op in (BinaryOp.Shl, BinaryOp.Shr):
            amount = _small_constant(n.b, 32)
            if amount is not None:  # in range: WGSL's shift is ours
                return f"({a} {'<<' if op is BinaryOp.Shl else '>>'} {amount}u)"
        if d.is_int and op is BinaryOp.Div and _small_constant(n.b, 2**31) not in (None, 0):
            return f"({a} / {b})"   # a positive divisor: WGSL's division is ours
        return self.wrap(self.apply(BINARY[op][word_class(d)], a=a, b=b), d)

    def logical(self, n: Bin) -> str | None:
        """And/Or of two indicators, or Xor of one with 1, as a bool (None otherwise)."""
        a, b = self.bools.get(id(n.a)), self.bools.get(id(n.b))
        if a and b and n.op in (BinaryOp.And, BinaryOp.Or):
            return f"({a} {'&&' if n.op is BinaryOp.And else '||'} {b})"
        if n.op is BinaryOp.Xor and a and _small_constant(n.b, 2) == 1:
            return f"(!{a})"
        return None

    def wrap(self, text: str, d: DType) -> str:
        """Wrap an i32/u32 result back to an 8/16-bit integer dtype (a no-op for others)."""
        bits = _NARROW_BITS.get(d)
        if bits is None:
            return text
        return f"extractBits({text}, 0u, {bits}u)" if d.is_signed else \
            f"({text} & {(1 << bits) - 1}u)"

    def select(self, n: Sel) -> str:
        if n.dtype in (F16, BF16):  # the spec's rule for SPIR-V targets
            self.refuse_dtype(f"Select on {n.dtype} is not lowered on SPIR-V targets (wgpu); "
                              f"select in f32 or i32", n.dtype, "Select")
        self.layout(n.dtype, "Select")
        cond = self.expr(n.cond)
        return f"select({self.expr(n.f)}, {self.expr(n.t)}, " \
               f"{self.bools.get(id(n.cond)) or f'({cond} != 0i)'})"

    def dot4(self, n: Dot4) -> str:
        """dot4I8Packed takes both words' bytes as signed: b's bytes from 128 on add their
        top bit's product separately (where they may reach it)."""
        a, b, c = f"bitcast<u32>({self.expr(n.a)})", self.expr(n.b), self.expr(n.c)
        if n.b_bits <= 7:
            return f"(dot4I8Packed({a}, {b}) + {c})"
        return (f"(dot4I8Packed({a}, {b} & 0x7f7f7f7fu) + "
                f"128i * dot4I8Packed({a}, ({b} >> 7u) & 0x01010101u) + {c})")

    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        for d in (src, dst):
            if d not in (F32, I32, U32):
                self.refuse_dtype(f"Bitcast {src} -> {dst}: only 32-bit words", d, "Bitcast")
        return f"bitcast<{dst.value}>({text})"

    def cast(self, src: DType, to: DType, x: str) -> str:
        self.layout(src, "Cast")
        self.layout(to, "Cast")
        if src is to:
            return x
        if src.is_float or to.is_float:
            return self.from_f32(x if src in (F32, BF16) else f"f32({x})", to)
        src_wide, to_wide = ("i32" if d.is_signed else "u32" for d in (src, to))
        if src_wide != to_wide:
            x = f"bitcast<{to_wide}>({x})"  # 32-bit two's complement reinterpretation
        return self.wrap(x, to)

    def from_f32(self, x: str, to: DType) -> str:
        h = self.helpers
        if to in (F32, F16):
            return x if to is F32 else f"f16({x})"
        if to is BF16:      # the register holds the bf16-exact f32
            return f"bitcast<f32>({h.call('poot_f32_to_bf16', x)} << 16u)"
        if to is U32:
            return h.call("poot_f2u", x)
        lo, hi = INT_RANGES[to]
        code = h.call("poot_f2i", x, f32_literal(lo), f32_literal(hi))
        return code if to.is_signed else f"u32({code})"     # in range: exact

    # -- helper functions ------------------------------------------------------------------
    def body_lines(self, params, lets, result: Expr) -> list[str]:
        """A shared helper body (poot.codegen.scalar) as WGSL statements: its lets, then
        the return (printed with this printer's expression rules, in the helper's scope)."""
        saved = self.variables, self._before
        self.variables = {p: p for p, _ in params} | {n: n for n, _ in lets}
        out = []
        try:
            for name, e in [*lets, (None, result)]:
                self._before = []
                text = self.expr(rewrite_expr(e))
                out += self._before
                out.append(f"let {name} = {text};" if name else f"return {text};")
        finally:
            self.variables, self._before = saved
        return out


def print_kernel(kernel: Kernel, dev: WgpuDevice) -> CompiledKernel:
    """The WGSL of `kernel` for `dev` with its dispatch groups, or the typed refusal
    (DtypeLowering, LimitExceeded)."""
    return CompiledKernel(kernel, WgslPrinter(dev).source(kernel),
                          groups=dispatch_groups(kernel, dev))
