"""WGSL's gaps closed by rewriting the kernel program before printing: F16 arithmetic
computes in F32 and rounds once, constant subtrees fold, shared subtrees stay shared."""
import numpy as np
from poot.codegen.expr import Bin, Cast, Const, Load, Un, Var
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, UnaryOp
from poot_wgpu.wgsl.rewrite import rewrite_expr

F32, F16 = DType.F32, DType.F16


def test_wgsl_rewrite_widens_f16_and_folds_constants():
    h = Load("in0", Var("i"), F16)
    e = rewrite_expr(Bin(BinaryOp.Add, h, h))
    assert isinstance(e, Cast) and e.dtype is F16
    assert isinstance(e.x, Bin) and e.x.dtype is F32 and e.x.a.dtype is F32
    assert rewrite_expr(Un(UnaryOp.Neg, h)).dtype is F16        # exact in F16: unchanged
    folded = rewrite_expr(Bin(BinaryOp.Div, Const(1.0, F32), Const(0.0, F32)))
    assert isinstance(folded, Const) and folded.value == np.inf
    shared = Bin(BinaryOp.Mul, h, h)
    both = rewrite_expr(Bin(BinaryOp.Max, shared, shared))
    assert both.x.a.x is both.x.b.x                               # sharing kept
