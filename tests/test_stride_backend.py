"""The second third-party example backend (tests/plugins/poot-backend-stride, installed
with `pip install -e tests/plugins/poot-backend-stride`), written from the backend guide
and poot/contract.py alone: found through its entry point, its own kernels read strided
views, and it passes the suite on the cases it declares (`poot conformance stride`, run
by scripts/test.sh)."""
from __future__ import annotations

import numpy as np
import pytest
from poot.dtypes import DType
from poot.errors import UnsupportedOp
from poot.plugin import manager

try:
    from poot_stride import StrideBackend
except ImportError as exc:  # the set-up must install it; say how instead of skipping
    raise ImportError("the stride backend is not installed: run "
                      "`pip install -e tests/plugins/poot-backend-stride`") from exc


def test_stride_is_found_through_its_entry_point():
    m = manager()
    assert isinstance(m.backends().get("stride"), StrideBackend), m.broken
    assert m.backend_plugins["stride"] == "stride"


def _graph(fn, *shapes):
    """A graph of per-step F32 slot inputs x0, x1, ... (the conformance suite's builder)."""
    from poot.conformance.cases import T, build
    from poot.conformance.inputs import Arg

    return build(fn.__name__, [Arg(T(s, DType.F32)) for s in shapes], fn)


def test_a_transpose_reaches_its_kernel_as_a_strided_view_and_matches_the_oracle():
    from poot.ir import ops as O
    from poot.plan import plan
    from poot.runtime import Executor

    def transposed_matmul(b, x, w):
        return b.eqn(O.MatMul(), x, b.eqn(O.Transpose((1, 0)), w))

    p = plan(_graph(transposed_matmul, (3, 5), (7, 5)), "stride")
    assert [s.lowering.kernel for s in p.steps] == ["stride.matmul"]
    assert [n.kind for n in p.notes] == ["view"] and p.steps[0].inputs[1].strides == (1, 5)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 5), np.float32), rng.standard_normal((7, 5), np.float32)
    got = Executor(p, {}).step({"x0": x, "x1": w}).result
    np.testing.assert_allclose(got, np.float64(x) @ np.float64(w).T, rtol=1e-6, atol=1e-6)


def test_an_undeclared_op_is_refused_before_anything_runs():
    from poot.ir import ops as O
    from poot.plan import plan

    def exp(b, x):
        return b.eqn(O.Unary(O.UnaryOp.Exp), x)

    with pytest.raises(UnsupportedOp, match="stride does not lower Unary.Exp"):
        plan(_graph(exp, (4,)), "stride")
