"""Known low zero bits and literal offsets of index expressions (poot.codegen.index), what
a lowering checks before it reads four words in one aligned load."""
from __future__ import annotations

import numpy as np
from poot.codegen import index as ix
from poot.codegen.expr import Bin, Bitcast, Const, Var, evaluate
from poot.dtypes import DType
from poot.ir.ops.elementwise import BinaryOp as B

I32, U32 = DType.I32, DType.U32


def u(v: int) -> Const:
    return Const(v, U32)


def test_low_zeros_follow_products_and_shifts():
    k = Bitcast(U32, Var("k0", I32))                        # nothing known about k
    block = Bin(B.Shr, Bin(B.Mul, Bin(B.Shr, k, u(8)), u(144)), u(2))     # (k >> 8) * 36
    part = Bin(B.Shr, Bin(B.Shl, Bin(B.Shr, Bin(B.And, k, u(255)), u(6)), u(5)), u(2))
    assert ix.low_zeros(k) == 0
    assert ix.low_zeros(block) == 2 and ix.low_zeros(part) == 3
    assert ix.low_zeros(Bin(B.Add, block, part)) == 2
    assert ix.low_zeros(Bin(B.Add, block, u(1))) == 0
    assert ix.low_zeros(Bin(B.And, k, u(0xFFF0))) == 4
    assert ix.low_zeros(u(0)) == 32 and ix.low_zeros(Const(-8, I32)) == 3
    assert ix.low_zeros(Bin(B.Shr, Bin(B.Mul, k, u(8)), u(5))) == 0   # shifted out
    assert ix.low_zeros(Bin(B.Div, Bin(B.Mul, k, u(8)), u(2))) == 0   # not followed


def test_split_offset_gathers_the_literals():
    x, y = Var("x", U32), Var("y", U32)
    e = Bitcast(I32, Bin(B.Add, Bin(B.Add, x, u(4)), Bin(B.Add, y, u(3))))
    rest, c = ix.split_offset(e)
    assert c == 7
    env = {"x": np.array([40], np.uint32), "y": np.array([12], np.uint32)}
    assert int(evaluate(rest, env, {})[0]) + c == int(evaluate(e, env, {})[0]) == 59
    assert ix.split_offset(u(9)) == (None, 9)
    assert ix.split_offset(x) == (x, 0)
