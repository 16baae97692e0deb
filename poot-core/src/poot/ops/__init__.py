"""poot.ops: the tracer's library. Primitives record one eqn; compositions record
the primitive chains the spec shows (rms_norm, softmax, rope_partial, attention_masked, ...)."""
from poot.ops.core import *  # noqa: F401,F403
from poot.ops.core import __dict__ as _core
from poot.ops.kv import (  # noqa: F401
    KV_DTYPES,
    kv_decode,
    kv_encode,
    kv_read_paged,
    kv_state,
    kv_write_dense,
    kv_write_paged,
)
from poot.ops.nn import *  # noqa: F401,F403
from poot.ops.quant import PackedTensor, packed_const  # noqa: F401

__all__ = [n for n in dir() if not n.startswith("_")]
del _core
