"""Every format's scalar decode program equals its numpy decode, bit for bit, on random bytes."""
from __future__ import annotations

import numpy as np
import poot_quant
import pytest
from poot.codegen.expr import Bin, Bitcast, Cast, Const, Load, Sel, Un, Var, walk
from poot.dtypes import DType
from poot.errors import FormatError

# (format, shape, attrs): every format, and every attribute that changes the program
CASES = [(name, (6, 512), {}) for name in poot_quant.formats() if name.startswith("gguf:")] + [
    ("gptq:int4", (16, 96), {"group_size": 32}),
    ("gptq:int4", (16, 96), {"group_size": 32, "act_order": True, "version": "v2"}),
    ("gptq:int4", (8, 64), {"group_size": -1, "sym": False}),
    ("gptq:int8", (8, 72), {"group_size": 24}),
    ("gptq:int8", (12, 64), {"group_size": 16, "act_order": True}),
    ("awq:int4", (16, 96), {"group_size": 32}),
    ("awq:int4", (24, 40), {"group_size": 20}),
    ("fp8:e4m3", (5, 33), {"scale": "tensor"}),
    ("fp8:e4m3", (7, 16), {"scale": "channel"}),
    ("fp8:e4m3", (130, 260), {"scale": "block"}),
    ("fp8:e5m2", (9, 20), {"scale": "block", "block": (4, 8)}),
    ("fp8:e5m2", (3, 16), {"scale": "channel"}),
    ("nvfp4", (5, 64), {}),
    ("mxfp4", (5, 96), {}),
]


@pytest.mark.parametrize("name,shape,attrs", CASES, ids=lambda c: str(c))
def test_program_matches_numpy_decode(name, shape, attrs, rng, bitwise, decode_program,
                                      random_packed):
    fmt = poot_quant.get(name)
    for _ in range(2):
        sources = random_packed(fmt, shape, attrs, rng)
        reference = fmt.dequantize(sources, shape, **attrs)
        assert reference.dtype == np.float32 and reference.shape == shape
        assert bitwise(decode_program(fmt, sources, shape, attrs), reference), name


@pytest.mark.parametrize("name", poot_quant.formats())
def test_program_uses_only_word_loads_and_scalar_ops(name):
    fmt = poot_quant.get(name)
    shape, attrs = next((s, a) for n, s, a in CASES if n == name)
    expr = fmt.decode_expr(lambda role, i: Load(role, i, DType.U32), Var("n"), Var("k"), shape,
                           attrs)
    for node in walk(expr):
        assert isinstance(node, (Const, Var, Load, Un, Bin, Sel, Cast, Bitcast)), node
        if isinstance(node, Load):
            assert node.dtype is DType.U32 and node.index.dtype is DType.I32
        if isinstance(node, Bitcast):
            assert node.dtype.itemsize == node.x.dtype.itemsize == 4


def test_program_refuses_sources_past_u32_byte_offsets():
    fmt = poot_quant.get("fp8:e4m3")
    with pytest.raises(FormatError, match="u32"):
        fmt.decode_expr(lambda r, i: Load(r, i, DType.U32), Var("n"), Var("k"),
                        (1 << 17, 1 << 16), {"scale": "tensor"})
