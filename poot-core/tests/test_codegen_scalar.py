"""poot.codegen.scalar: the named helpers every dialect renders, against the oracle's rules.

A helper given as a shared expression is evaluated with numpy (poot.codegen.expr.evaluate,
the oracle's scalar rules) and compared with what it stands for; the C family's rendering
is compiled by the system C compiler and run on the IR's edge cases."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest
from poot.codegen.cstyle import CPrinter
from poot.codegen.expr import Const, Un, Var, evaluate
from poot.codegen.scalar import BINARY, HELPERS, UNARY, helper_of, in_order, shared_lets
from poot.dtypes import DType
from poot.ir.ops import UnaryOp
from poot.oracle import scalar as S

F32, I32, U32, BF16 = DType.F32, DType.I32, DType.U32, DType.BF16
LANGUAGES = {"c": ("c",), "glsl": ("glsl", "c"), "wgsl": ("wgsl",)}


def _floats(n: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0, 1e30], n)).astype(np.float32)
    x[:10] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-45, 3.4e38, 0.5]
    return x


def _body(name: str, **args):
    h = HELPERS[name]
    with np.errstate(all="ignore"):
        return np.asarray(evaluate(h.body, args, {}))


def test_every_helper_is_spelled_in_every_language():
    for h in HELPERS.values():
        for langs in LANGUAGES.values():
            kind, _ = h.spelling(langs)
            assert kind in ("inline", "text", "body"), h.name
            assert set(h.calls(langs)) <= set(HELPERS), h.name


def test_the_tables_name_only_helpers_or_operators():
    for rows in (*UNARY.values(), *BINARY.values()):
        for rule in rows.values():
            assert rule in HELPERS or "{" in rule, rule


def test_bf16_rounding_is_the_oracle_cast():
    x = _floats()
    bits = _body("poot_f32_to_bf16", x=x).astype(np.uint32)
    want = S.cast(x, F32, BF16).view(np.uint16).astype(np.uint32)
    nan = np.isnan(x)
    assert np.array_equal(bits[~nan], want[~nan])
    assert np.all((bits[nan] & 0x7F80) == 0x7F80) and np.all(bits[nan] & 0x0040)  # quiet
    back = _body("poot_bf16_to_f32", h=bits)
    assert np.array_equal(back[~nan].view(np.uint32), bits[~nan] << 16)


@pytest.mark.parametrize("name,fn", [("poot_iadd", np.add), ("poot_isub", np.subtract),
                                     ("poot_imul", np.multiply)])
def test_wrapping_i32_arithmetic(name, fn):
    rng = np.random.default_rng(7)
    a = rng.integers(-2**31, 2**31, 3000, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, 3000, dtype=np.int64).astype(np.int32)
    a[:3], b[:3] = [-2**31, 2**31 - 1, -1], [-1, 1, -2**31]
    with np.errstate(over="ignore"):
        assert np.array_equal(_body(name, a=a, b=b), fn(a, b))
    assert np.array_equal(_body("poot_ineg", x=a), S.unary(UnaryOp.Neg, a, I32))


def test_erf_is_within_its_approximation():
    x = _floats()
    got = _body("poot_erf", x=x)
    want = np.array([math.erf(v) if math.isfinite(v) else
                     (v if math.isnan(v) else math.copysign(1.0, v)) for v in x.astype(float)])
    assert np.array_equal(np.isnan(got), np.isnan(x))
    # the approximation's 1.5e-7, plus the F32 rounding of its dozen steps
    assert np.max(np.abs(got[~np.isnan(x)] - want[~np.isnan(x)])) < 4e-7


def test_shared_subtrees_are_bound_once():
    lets, result = shared_lets(HELPERS["poot_erf"].body)
    names = [n for n, _ in lets]
    assert names == [f"t{i + 1}" for i in range(len(lets))] and len(lets) >= 3
    env = {"x": _floats()}
    for n, e in lets:
        env[n] = np.asarray(evaluate(e, env, {}))
    with np.errstate(all="ignore"):
        assert np.array_equal(evaluate(result, env, {}), _body("poot_erf", x=env["x"]),
                              equal_nan=True)


def test_helpers_come_after_the_helpers_they_call():
    order = [h.name for h in in_order(HELPERS, ("c",))]
    for h in HELPERS.values():
        for dep in h.calls(("c",)):
            assert order.index(dep) < order.index(h.name), (dep, h.name)
    assert helper_of(Un(UnaryOp.Exp, Var("x", F32))) == "poot_exp"
    assert helper_of(Const(1, I32)) is None


class _HostC(CPrinter):
    """The C family on the host, for one helper call at a time."""

    backend, device = "host-c", "cc"

    def bitcast(self, src, dst, text):
        return (f"({{ union {{ {self.type_name(src)} s; {self.type_name(dst)} d; }} "
                f"b_ = {{ .s = ({text}) }}; b_.d; }})")


def _compiled(tmp_path, body: str, signature: str):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH (cc, gcc)")
    src, lib = tmp_path / "helpers.c", tmp_path / "helpers.so"
    src.write_text("#include <math.h>\n" + _HostC().scalar_helpers()
                   + f"{signature} {{ {body} }}\n")
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src), "-lm"],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def test_float_to_narrow_int_saturates_in_c(tmp_path):
    """+inf and values past 2^31 saturate to a narrow type's top, as the oracle's Cast."""
    lib = _compiled(tmp_path, "return (short)poot_f2i(x, -32768.0f, 32767.0f);",
                    "short to_i16(float x)")
    lib.to_i16.restype, lib.to_i16.argtypes = ctypes.c_short, [ctypes.c_float]
    x = np.array([np.inf, 3e9, -3e9, -np.inf, 40000.0, -7.9, np.nan], np.float32)
    want = S.cast(x, F32, DType.I16)
    assert [lib.to_i16(float(v)) for v in x] == want.tolist()
