"""A parser for the text form of `poot.ir.text`: `parse(str(g))` gives a graph equal to g.

    g2 = parse(text)             # a checked Graph (the whole-graph check runs as always)
    graphs_equal(g, g2)          # structural equality, bodies of regions included

Value ids are kept as printed. The text shows only the values in use, so rows of the value
table no eqn or binder names (left over by an edit) come back as placeholders. A malformed
text raises ParseError naming the line.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re

from poot.dtypes import DType
from poot.errors import ParseError, PootError
from poot.ir.graph import Eqn, Graph, GraphOutput, Lit, OutputKind, Value, _Tables
from poot.ir.ops.base import OpKind
from poot.ir.types import (
    BoundaryId,
    Identity,
    Slot,
    SlotKey,
    SlotKind,
    Storage,
    StorageClass,
    TensorType,
    ValueId,
    ValueMeta,
    ValueTable,
    WeightRef,
)

_BINDER = re.compile(r"^%(\d+): (\S+) = (.*)$")
_TYPE = re.compile(r"^([a-z0-9]+)\[([0-9,]*)\]$")
_STRING = r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\""""
_TRAILING_NAME = re.compile(rf"^(.*?)(?: ({_STRING}))?$")
_SLOT = re.compile(rf"^slot (\S+)(?: ({_STRING}))? in \[(-?\d+|None), (-?\d+|\.\.)\)"
                   rf"(?: bound (\d+))?$")
_WEIGHT = re.compile(rf"^const ({_STRING}) from ({_STRING})(?: payload ({_STRING}))?"
                     rf"(?: format ({_STRING}))?$")
_PACKED = re.compile(r"^(.*)\[(\d+)x(\d+)(?:;(.*))?\]$")


#: regions nested deeper than this are refused (real graphs nest one or two deep)
MAX_REGION_DEPTH = 32
#: value ids above max(this, VALUE_ID_SLACK x the text's lines) are refused: the value table
#: has a row for every id up to the largest, so the largest id bounds what parsing allocates
MIN_VALUE_ID_BOUND, VALUE_ID_SLACK = 1 << 16, 64
#: what an untrusted text may raise deep inside a literal or a number
_BAD_TEXT = (ValueError, SyntaxError, KeyError, TypeError, OverflowError, RecursionError,
             MemoryError, AttributeError, PootError)


def parse(text: str) -> Graph:
    """The Graph printed as `text` (see poot.ir.text)."""
    if not isinstance(text, str):
        raise ParseError(f"parse takes the text of a graph, got {type(text).__name__}")
    p = _Parser(text.splitlines())
    g = p.graph()
    if p.i != len(p.lines):
        p.fail("text after the graph's closing line")
    return g


# -- structural equality -------------------------------------------------------------------
def graphs_equal(a: Graph, b: Graph) -> bool:
    """Same name, binders, slots, computed generators, eqns, outputs and the metas of every
    value in use; ops compared field by field (region bodies recursively, NaN equal to NaN)."""
    if a.name != b.name or a.inputs() != b.inputs() or a.outputs() != b.outputs():
        return False
    if a.slots() != b.slots() or len(a.eqns()) != len(b.eqns()):
        return False
    if [(v, m) for v, m in a.values()] != [(v, m) for v, m in b.values()]:
        return False
    if not all(ops_equal(a.computed_def(v), b.computed_def(v)) for v in a.computed()):
        return False
    return all(x.out == y.out and ops_equal(x.op, y.op) and len(x.inputs) == len(y.inputs)
               and all(_operand_equal(p, q) for p, q in zip(x.inputs, y.inputs, strict=True))
               for x, y in zip(a.eqns(), b.eqns(), strict=True))


def ops_equal(a: OpKind, b: OpKind) -> bool:
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        if not _param_equal(getattr(a, f.name), getattr(b, f.name)):
            return False
    return True


def _param_equal(x, y) -> bool:
    if isinstance(x, Graph) and isinstance(y, Graph):
        return graphs_equal(x, y)
    if isinstance(x, OpKind) and isinstance(y, OpKind):
        return ops_equal(x, y)
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return type(x) is type(y) and x == y


def _operand_equal(p, q) -> bool:
    if isinstance(p, Lit) and isinstance(q, Lit):
        return p.dtype is q.dtype and _param_equal(p.value, q.value)
    return p == q


# -- the parser ----------------------------------------------------------------------------
def _op_classes() -> dict[str, type]:
    from poot.ir import ops as O

    found: dict[str, type] = {}
    todo = [OpKind]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.setdefault(sub.__name__, sub)
            todo.append(sub)
    found.update(O.ALL_OPS)
    return found


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets and quotes; parts stripped; an empty string gives []."""
    parts, depth, quote, cur, i = [], 0, None, [], 0
    while i < len(s):
        c = s[i]
        if quote:
            cur.append(c)
            if c == "\\" and i + 1 < len(s):
                cur.append(s[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            depth -= 1
            cur.append(c)
        elif depth == 0 and s.startswith(sep, i):
            parts.append("".join(cur).strip())
            cur = []
            i += len(sep)
            continue
        else:
            cur.append(c)
        i += 1
    last = "".join(cur).strip()
    if parts or last:
        parts.append(last)
    return parts


def _literal(s: str):
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return s


def _string(s: str) -> str:
    v = ast.literal_eval(s)
    if not isinstance(v, str):
        raise ValueError(f"expected a quoted string, got {s}")
    return v


def _name(s: str) -> str:
    return _string(s) if s[:1] in ("'", '"') else s


def _type(s: str) -> TensorType:
    m = _TYPE.match(s)
    if not m:
        raise ValueError(f"bad tensor type {s!r}")
    dims = tuple(int(d) for d in m.group(2).split(",")) if m.group(2) else ()
    return TensorType(dims, DType.parse(m.group(1)))


def _float(s: str) -> float:
    return float(s)  # repr of a float, inf, -inf and nan included


def _packed(s: str):
    from poot.ir.packed import PackedWeight

    m = _PACKED.match(s)
    if not m:
        raise ValueError(f"bad packed weight {s!r}")
    attrs = []
    for kv in split_top(m.group(4) or ""):
        k, _, v = kv.partition("=")
        attrs.append((k, _literal(v)))
    return PackedWeight(m.group(1), (int(m.group(2)), int(m.group(3))), tuple(attrs))


def split_op(s: str) -> tuple[str, str]:
    """Split `Name{...} rest` into the op text and the rest."""
    depth, quote = 0, None
    for i, c in enumerate(s):
        if quote:
            if c == quote and s[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
        elif c == " " and depth == 0:
            return s[:i], s[i + 1:]
    return s, ""


def parse_op(text: str, body: Graph | None = None, n_operands: int = 0) -> OpKind:
    """An op from its printed form; region ops take their parsed `body`."""
    from poot.ir import ops as O

    name, brace, rest = text.partition("{")
    if brace and not rest.endswith("}"):
        raise ValueError(f"unbalanced braces in {text!r}")
    params = {}
    for kv in split_top(rest[:-1]) if brace else []:
        k, eq, v = kv.partition("=")
        if not eq:
            raise ValueError(f"parameter {kv!r} is not name=value")
        params[k.strip()] = v.strip()
    if name in O.UnaryOp.__members__:
        return O.Unary(O.UnaryOp[name])
    if name in O.BinaryOp.__members__:
        return O.Binary(O.BinaryOp[name])
    cls = _op_classes().get(name)
    if cls is None:
        raise ValueError(f"unknown op {name!r}")
    params.pop("eqns", None)  # a region's size, printed for reading; the body says it
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw = {}
    for k, v in params.items():
        if k not in fields:
            raise ValueError(f"{name} has no parameter {k!r}")
        kw[k] = _value(cls, k, v)
    if "body" in fields:
        if body is None:
            raise ValueError(f"{name} needs its region body under it")
        kw["body"] = body
        if "n_head" in fields and "n_head" not in kw:
            kw["n_head"] = n_operands - (len(body.inputs()) - 1)
    return cls(**kw)


def _value(cls: type, key: str, v: str):
    from poot.ir import ops as O

    if key == "op":
        enum = {"Reduce": O.ReduceOp, "Unary": O.UnaryOp, "Binary": O.BinaryOp}.get(cls.__name__)
        if enum is None:
            raise ValueError(f"{cls.__name__} has no sub-op")
        return enum[v]
    if key in ("to", "dtype"):
        return DType.parse(v)
    if key == "weight":
        return _packed(v)
    if key == "head":
        return parse_op(v)
    if key == "scale":
        return _float(v)
    if v in ("inf", "-inf", "nan"):
        return float(v)
    return _literal(v)


class _Parser:
    def __init__(self, lines: list[str]):
        self.lines = lines
        self.i = 0
        self.max_id = max(MIN_VALUE_ID_BOUND, VALUE_ID_SLACK * len(lines))

    def value_id(self, index: int) -> int:
        if index > self.max_id:
            raise ValueError(f"value id %{index} is above the bound {self.max_id} for a text "
                             f"of {len(self.lines)} lines")
        return index

    def fail(self, msg: str, cause: Exception | None = None):
        line = self.lines[self.i] if self.i < len(self.lines) else "<end of text>"
        raise ParseError(f"line {self.i + 1}: {msg}: {line.strip()!r}") from cause

    def next(self) -> str:
        while self.i < len(self.lines) and not self.lines[self.i].strip():
            self.i += 1
        if self.i >= len(self.lines):
            self.fail("unexpected end of text")
        return self.lines[self.i].strip()

    def graph(self, depth: int = 0) -> Graph:
        if depth > MAX_REGION_DEPTH:
            self.fail(f"regions nested deeper than {MAX_REGION_DEPTH} levels")
        head = self.next()
        if not head.endswith("("):
            self.fail("a graph starts with 'name('")
        name = head[:-1]
        rows: dict[int, ValueMeta] = {}
        inputs, slots, computed = [], [], {}
        self.i += 1
        while (line := self.next()) != ") {":
            try:
                vid, meta, gen = self.binder(line)
                rows[self.value_id(vid.index)] = meta
            except _BAD_TEXT as e:
                self.fail(f"bad binder ({_short(e)})", e)
            inputs.append(vid)
            if meta.storage.cls is StorageClass.SLOT:
                slots.append((vid, meta.storage.slot))
            if gen is not None:
                computed[vid] = gen
            self.i += 1
        self.i += 1
        eqns = []
        while not (line := self.next()).startswith("} -> "):
            try:
                out, aval, label, op_text, args = self.eqn_line(line)
                self.value_id(out.index)
                for a in args:
                    if isinstance(a, Value):
                        self.value_id(a.id.index)
            except _BAD_TEXT as e:
                self.fail(f"bad eqn ({_short(e)})", e)
            self.i += 1
            body = None
            if "body" in {f.name for f in dataclasses.fields(self.op_class(op_text))}:
                body = self.graph(depth + 1)
            try:
                op = parse_op(op_text, body, len(args))
            except _BAD_TEXT as e:
                self.i -= 1
                self.fail(f"bad op ({_short(e)})", e)
            ident = Identity.named(label) if label is not None else Identity.ANONYMOUS
            rows[out.index] = ValueMeta(aval, Storage.DEVICE, ident)
            eqns.append(Eqn(op, tuple(args), out))
        try:
            outputs = [self.output(o) for o in split_top(line[len("} -> "):], ";")]
            for o in outputs:
                self.value_id(o.value.index)
        except _BAD_TEXT as e:
            self.fail(f"bad outputs ({_short(e)})", e)
        self.i += 1
        size = max(rows, default=-1) + 1
        hole = ValueMeta(TensorType((), DType.F32))
        table = ValueTable([rows.get(i, hole) for i in range(size)])
        try:
            return Graph(_Tables(table, inputs, slots, eqns, outputs, computed), name)
        except _BAD_TEXT as e:
            self.i -= 1
            raise ParseError(f"the parsed graph {name!r} is not well formed: {e}") from e

    def op_class(self, op_text: str) -> type:
        from poot.ir import ops as O

        name = op_text.partition("{")[0]
        if name in O.UnaryOp.__members__ or name in O.BinaryOp.__members__:
            return O.Unary if name in O.UnaryOp.__members__ else O.Binary
        cls = _op_classes().get(name)
        if cls is None:
            self.fail(f"unknown op {name!r}")
        return cls

    def binder(self, line: str) -> tuple[ValueId, ValueMeta, OpKind | None]:
        m = _BINDER.match(line)
        if not m:
            raise ValueError("expected '%N: type = const|slot|state|computed|param ...'")
        vid, aval, what = ValueId(int(m.group(1))), _type(m.group(2)), m.group(3)
        kind = what.split(" ", 1)[0]
        gen = None
        if kind == "const" and " from " in what:
            w = _WEIGHT.match(what)
            if not w:
                raise ValueError("bad weight const")
            tensor, ckpt = _string(w.group(1)), _string(w.group(2))
            payload = _string(w.group(3)) if w.group(3) else ""
            fmt = _string(w.group(4)) if w.group(4) else ""
            return vid, ValueMeta(aval, Storage.CONST, Identity.of_weight(
                WeightRef(ckpt, tensor, payload, fmt))), None
        if kind == "slot":
            s = _SLOT.match(what)
            if not s:
                raise ValueError("bad slot")
            skind = SlotKind.get(s.group(1))
            label = _string(s.group(2)) if s.group(2) else ""
            hi = None if s.group(4) == ".." else int(s.group(4))
            bound = int(s.group(5)) if s.group(5) else (hi if skind.hi is None else None)
            slot = Slot(skind, bound)
            if slot.valid_range() != ((None if s.group(3) == "None" else int(s.group(3))), hi):
                raise ValueError(f"range does not match slot kind {skind.label}")
            return vid, ValueMeta(aval, Storage(StorageClass.SLOT, slot),
                                  Identity.of_slot(SlotKey(skind, label))), None
        rest = what[len(kind):].strip()
        if kind == "computed":
            op_text, rest = split_op(rest)
            gen = parse_op(op_text)
        if rest and not re.fullmatch(_STRING, rest):
            raise ValueError(f"unexpected {rest!r}")
        ident = Identity.named(_string(rest)) if rest else Identity.ANONYMOUS
        storage = {"const": Storage.CONST, "state": Storage.STATE, "param": Storage.DEVICE,
                   "computed": Storage.COMPUTED}.get(kind)
        if storage is None:
            raise ValueError(f"unknown binder kind {kind!r}")
        return vid, ValueMeta(aval, storage, ident), gen

    def eqn_line(self, line: str):
        m = _BINDER.match(line)
        if not m:
            raise ValueError("expected '%N: type = Op args'")
        out, aval = ValueId(int(m.group(1))), _type(m.group(2))
        op_text, rest = split_op(m.group(3))
        args_text, hash_, label = rest.partition("# ")
        label = label if hash_ else None
        if label is not None and label[:1] in ("'", '"'):
            label = _string(label)
        args = [self.operand(a) for a in split_top(args_text.strip())]
        return out, aval, label, op_text, args

    @staticmethod
    def operand(s: str):
        if s.startswith("%"):
            return Value(ValueId(int(s[1:])))
        value, _, dtype = s.rpartition(":")
        dtype = DType.parse(dtype)
        return Lit(int(value) if dtype.is_int else float(value), dtype)

    @staticmethod
    def output(s: str) -> GraphOutput:
        kind, _, rest = s.partition(" ")
        if kind == "result":
            return GraphOutput(ValueId(int(rest.lstrip("%"))), OutputKind.RESULT)
        vid_text, _, tail = rest.partition(" ")
        vid = ValueId(int(vid_text.lstrip("%")))
        if kind == "witness":
            return GraphOutput(vid, OutputKind.WITNESS, label=_string(tail))
        if kind == "export":
            if not tail.startswith("@"):
                raise ValueError("an export names its boundary as @name")
            return GraphOutput(vid, OutputKind.EXPORT, boundary=BoundaryId(_name(tail[1:])))
        if kind == "state_next":
            if not tail.startswith("<- %"):
                raise ValueError("state_next is 'state_next %out <- %state_in'")
            return GraphOutput(vid, OutputKind.STATE_NEXT, input=ValueId(int(tail[4:])))
        raise ValueError(f"unknown output kind {kind!r}")


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 200 else text[:200] + "..."


__all__ = ["parse", "graphs_equal", "ops_equal", "parse_op", "split_top"]
