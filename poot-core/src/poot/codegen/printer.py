"""The language-neutral printer core: one walk over a kernel program, hooks per node.

`Printer.source(kernel)` validates the program, lets the dialect rewrite it
(`rewrite`: a pattern pass that closes the language's gaps in the program's own
vocabulary before anything is printed), refuses dtypes the target cannot do, and
prints the translation unit (`unit`). Statements and expressions dispatch by type to
one hook each; a dialect writes only the hooks whose spelling is its own:

    statements   let, assign, store, loop, branch, barrier, coop_reduce, matrix
    expressions  const, var, load, unary, binary, select, cast, bitcast, dot2

Every statement hook gets the statement and its indentation depth and returns lines.
An expression hook may emit lines that must come before the statement it belongs
to (`emit_before`: a dialect that binds shared subtrees to names); the walk puts
them in front of that statement, in its scope.

Target facts (subgroup width, matrix instructions) are the printer's, given by the
backend from its device (`KernelBackend.features`), never read from the program.
"""
from __future__ import annotations

import dataclasses

from poot.codegen.expr import (
    Bin,
    Bitcast,
    Cast,
    Const,
    Dot2,
    Dot4,
    Expr,
    Load,
    Sel,
    Un,
    Var,
    children,
    lower_dot2,
)
from poot.codegen.program import (
    BUILTINS,
    TENSOR_ASYNC,
    Assign,
    AwaitInputs,
    Barrier,
    CoopReduce,
    CoopReduceScatter,
    CopyAsync,
    CopyCommit,
    CopyWait,
    For,
    GroupBarrier,
    If,
    Kernel,
    Let,
    LoadWide,
    MmaTile,
    Stmt,
    Store,
    StoreWide,
)
from poot.dtypes import DType
from poot.errors import DtypeLowering, UnsupportedOp

#: statement type -> the hook that prints it
STATEMENT_HOOKS = {Let: "let", LoadWide: "load_wide", Assign: "assign", Store: "store",
                   StoreWide: "store_wide", For: "loop", If: "branch",
                   Barrier: "barrier_stmt", GroupBarrier: "group_barrier",
                   CoopReduce: "coop_reduce", CopyAsync: "matrix",
                   CoopReduceScatter: "reduce_scatter", AwaitInputs: "await_inputs",
                   CopyCommit: "matrix", CopyWait: "matrix", MmaTile: "matrix",
                   **dict.fromkeys(TENSOR_ASYNC, "tensor_async")}


class Printer:
    """Prints kernel programs as source text of one language (a dialect subclass)."""

    #: the backend and device named in refusals
    backend = ""
    device = ""
    #: dtypes this printer's device can hold and compute with
    supported: frozenset = frozenset()
    indent_unit = "  "
    #: whether the dialect prints expr.Dot2 and Dot4 itself (`dot2`, `dot4`); if not,
    #: `source` rewrites every one to plain integer multiply-adds before anything else
    #: sees the program
    native_dot2 = False

    @property
    def native_dot4(self) -> bool:
        """Whether the dialect prints expr.Dot4 itself (`dot4`) where it rewrites Dot2: a
        target of DOT4 alone (target.DOT4); DOT2's instruction set has both."""
        return self.native_dot2

    # -- the translation unit ------------------------------------------------------
    def source(self, kernel: Kernel) -> str:
        kernel.validate()
        kept = tuple(t for t, native in ((Dot2, self.native_dot2), (Dot4, self.native_dot4))
                     if native)
        if len(kept) < 2:
            kernel = without_dot2(kernel, kept)
        kernel = self.rewrite(kernel)
        self.check_dtypes(kernel)
        self._kernel = kernel
        self._before: list[str] = []
        return self.unit(kernel)

    def rewrite(self, kernel: Kernel) -> Kernel:
        """The dialect's pass over the program before printing (identity by default)."""
        return kernel

    def unit(self, kernel: Kernel) -> str:
        """The whole source of one kernel; the dialect's layout of declarations and body."""
        raise NotImplementedError

    @property
    def kernel(self) -> Kernel:
        return self._kernel

    # -- refusals --------------------------------------------------------------------
    def refuse(self, dtype: DType, what: str, op: str = "") -> DtypeLowering:
        return DtypeLowering(f"{self.backend} cannot do {what} on {dtype}", op=op,
                             dtype=str(dtype), backend=self.backend, device=self.device)

    def check_dtypes(self, kernel: Kernel) -> None:
        for d in sorted(kernel.dtypes(), key=lambda d: d.value):
            if d not in self.supported:
                raise self.refuse(d, f"kernel {kernel.name}", op=kernel.name)

    def unsupported(self, what: str) -> UnsupportedOp:
        return UnsupportedOp(f"{self.backend} prints no {what}", op=self._kernel.name,
                             backend=self.backend, device=self.device)

    # -- statements ------------------------------------------------------------------
    def pad(self, depth: int) -> str:
        return self.indent_unit * depth

    def block(self, body, depth: int) -> list[str]:
        out = []
        for s in body:
            out += self.stmt(s, depth)
        return out

    def stmt(self, s: Stmt, depth: int) -> list[str]:
        hook = STATEMENT_HOOKS.get(type(s))
        if hook is None:
            raise TypeError(f"unknown statement {s!r}")
        outer, self._before = self._before, []
        lines = getattr(self, hook)(s, depth)
        before, self._before = self._before, outer
        return [self.pad(depth) + x for x in before] + lines

    def emit_before(self, line: str) -> None:
        """A line the statement being printed needs first (a named subtree)."""
        self._before.append(line)

    def let(self, s: Let, depth: int) -> list[str]:
        raise self.unsupported("Let")

    def load_wide(self, s: LoadWide, depth: int) -> list[str]:
        """Only printers of targets that declare WIDE_LOADS print it."""
        raise self.unsupported("LoadWide")

    def assign(self, s: Assign, depth: int) -> list[str]:
        return [f"{self.pad(depth)}{self.name(s.name)} = {self.expr(s.value)};"]

    def store(self, s: Store, depth: int) -> list[str]:
        raise self.unsupported("Store")

    def store_wide(self, s: StoreWide, depth: int) -> list[str]:
        """Only printers of targets that declare WIDE_LOADS print it."""
        raise self.unsupported("StoreWide")

    def loop(self, s: For, depth: int) -> list[str]:
        raise self.unsupported("For")

    def branch(self, s: If, depth: int) -> list[str]:
        pad = self.pad(depth)
        out = [f"{pad}if {self.condition(s.cond)} {{", *self.block(s.then, depth + 1)]
        if s.orelse:
            out += [pad + "} else {", *self.block(s.orelse, depth + 1)]
        return out + [pad + "}"]

    def condition(self, e: Expr) -> str:
        """The parenthesised truth test `e != 0` of an I32 expression."""
        raise NotImplementedError

    def barrier_stmt(self, s: Barrier, depth: int) -> list[str]:
        raise self.unsupported("Barrier")

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        raise self.unsupported("CoopReduce")

    def group_barrier(self, s: GroupBarrier, depth: int) -> list[str]:
        """Only printers of targets that declare WIDE_LOADS print it, for their subgroup."""
        raise self.unsupported(f"GroupBarrier of {s.width} threads")

    def await_inputs(self, s: AwaitInputs, depth: int) -> list[str]:
        """Nothing where launches never overlap: a kernel starts after its predecessor."""
        return []

    def reduce_scatter(self, s: CoopReduceScatter, depth: int) -> list[str]:
        """Only printers of targets that declare REDUCE_SCATTER print it."""
        raise self.unsupported("CoopReduceScatter")

    def matrix(self, s: Stmt, depth: int) -> list[str]:
        """CopyAsync / CopyCommit / CopyWait / MmaTile: only printers of targets that
        declare those features print them."""
        raise self.unsupported(f"{type(s).__name__} statement")

    def tensor_async(self, s: Stmt, depth: int) -> list[str]:
        """Bulk tensor copies, mbarriers and warpgroup products (features TMA, WGMMA):
        only printers of targets that declare them print them."""
        raise self.unsupported(f"{type(s).__name__} statement")

    def name(self, var: str) -> str:
        """How a program variable is spelled (dialects may prefix them)."""
        return var

    # -- expressions -----------------------------------------------------------------
    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Bin):
            return self.binary(e)
        if isinstance(e, Sel):
            return self.select(e)
        if isinstance(e, Cast):
            return self.cast(e.x.dtype, e.dtype, self.expr(e.x))
        if isinstance(e, Bitcast):
            if e.x.dtype is e.dtype:
                return self.expr(e.x)
            return self.bitcast(e.x.dtype, e.dtype, self.expr(e.x))
        if isinstance(e, Dot2):
            return self.dot2(e)
        if isinstance(e, Dot4):
            return self.dot4(e)
        raise TypeError(f"unknown expression {e!r}")

    def dot2(self, e: Dot2) -> str:
        """The integer pair dot product, for dialects that declare `native_dot2`."""
        raise self.unsupported("Dot2")

    def dot4(self, e: Dot4) -> str:
        """The integer quad dot product, for dialects that declare `native_dot4`."""
        raise self.unsupported("Dot4")

    def var(self, e: Var) -> str:
        if e.name in BUILTINS:
            kind, axis = BUILTINS[e.name]
            return self.builtin(kind, axis, self._kernel)
        return self.name(e.name)

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        """A builtin index ("local", "group", "global" along `axis`, or "index")."""
        raise NotImplementedError

    def const(self, value, dtype: DType) -> str:
        raise NotImplementedError

    def load(self, e: Load) -> str:
        return f"{e.buffer}[{self.expr(e.index)}]"

    def unary(self, e: Un) -> str:
        raise NotImplementedError

    def binary(self, e: Bin) -> str:
        raise NotImplementedError

    def select(self, e: Sel) -> str:
        raise NotImplementedError

    def cast(self, src: DType, dst: DType, text: str) -> str:
        raise NotImplementedError

    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        raise NotImplementedError


def without_dot2(kernel: Kernel, kept: tuple = ()) -> Kernel:
    """`kernel` with every Dot2 and Dot4 (but those of the types `kept`) replaced by
    `lower_dot2` (shared subtrees stay shared)."""
    lowered = tuple(t for t in (Dot2, Dot4) if t not in kept)
    memo: dict[int, tuple[Expr, Expr]] = {}     # id -> (node kept alive, its rewrite)

    def expr(e: Expr) -> Expr:
        if id(e) not in memo:
            kids = [expr(c) for c in children(e)]
            swap = dict(zip(map(id, children(e)), kids, strict=True))
            out = e if all(a is b for a, b in zip(children(e), kids, strict=True)) else \
                dataclasses.replace(e, **{f.name: swap[id(getattr(e, f.name))]
                                          for f in dataclasses.fields(e)
                                          if isinstance(getattr(e, f.name), Expr)})
            memo[id(e)] = (e, expr(lower_dot2(out)) if isinstance(out, lowered) else out)
        return memo[id(e)][1]

    def block(body: tuple) -> tuple:
        out = tuple(stmt(x) for x in body)
        return body if all(a is b for a, b in zip(out, body, strict=True)) else out

    def stmt(s):
        changes = {}
        for f in dataclasses.fields(s):
            v = getattr(s, f.name)
            if isinstance(v, Expr):
                new = expr(v)
            elif isinstance(v, tuple) and v and all(isinstance(x, Stmt) for x in v):
                new = block(v)
            else:
                continue
            if new is not v:
                changes[f.name] = new
        return dataclasses.replace(s, **changes) if changes else s

    body = block(kernel.body)
    return kernel if body is kernel.body else dataclasses.replace(kernel, body=body)


__all__ = ["Printer", "STATEMENT_HOOKS", "without_dot2"]
