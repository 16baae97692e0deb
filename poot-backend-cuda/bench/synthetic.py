"""Random weights for model-sized benchmarks, made on the GPU in milliseconds.

An 8B model's 16 GB cannot be drawn with numpy inside a short device call, so the weights
are declared (a WeightSource of specs, no arrays) and each buffer is filled on the device
by a hash of (seed, tensor, element): every matrix is distinct, nothing is zero, and a bind
costs an allocation and one kernel. `DeviceFilledWeights` is the weight cache an Executor
is handed; tensors it did not declare (RoPE tables) are uploaded the ordinary way.

Values: bf16/f32 projections uniform with the standard deviation 1/sqrt(K) (as
poot.models.llama.random_weights draws them), norms 1 +- 0.1, GGUF blocks random bytes
with their f16 scale fields set to finite values of the same spread.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
from poot.dtypes import DType
from poot.formats import PackedWeight
from poot.ir.types import TensorType, WeightRef
from poot.models.llama import LlamaConfig
from poot.models.weights import DenseSpec, PackedSpec, stacked
from poot.runtime.weights import WeightCache

#: per GGUF block type: (block bytes, f16 scale fields at its start, the spread of a
#: value over its f16 scale for random codes: Q4_0's centred 4-bit codes have 4.6, Q4_K's
#: 4-bit codes times 6-bit sub-block scales about 4.6 * 36, Q8_0's bytes 74)
BLOCKS = {"gguf:Q4_0": (18, 1, 4.6), "gguf:Q4_K": (144, 2, 4.6 * 36), "gguf:Q8_0": (34, 1, 74.0)}

FILL = r"""
#include <cuda_fp16.h>
__device__ __forceinline__ unsigned int mix(unsigned long long x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (unsigned int)x;
}
__device__ __forceinline__ float uniform(unsigned long long key) {   // in [-1, 1)
  return (float)(mix(key) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}
__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ unsigned short to_f16(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
// mode 0: bf16 a*u + b; 1: f32 a*u + b; 2: GGUF blocks of `block` u16 units whose first
// `fields` units are f16 scales a*(1 + 0.25u), the rest random bits
extern "C" __global__ void poot_bench_fill(unsigned char* __restrict__ dst,
    unsigned long long n, unsigned long long seed, int mode, float a, float b,
    int block, int fields) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const unsigned long long key = seed * 0x9e3779b97f4a7c15ull + i;
    if (mode == 0) {
      ((unsigned short*)dst)[i] = to_bf16(a * uniform(key) + b);
    } else if (mode == 1) {
      ((float*)dst)[i] = a * uniform(key) + b;
    } else {
      const int j = (int)(i % (unsigned long long)block);
      ((unsigned short*)dst)[i] = j < fields ? to_f16(a * (1.0f + 0.25f * uniform(key)))
                                             : (unsigned short)(mix(key) >> 7);
    }
  }
}
"""


def shape_config(name: str, layers: int | None = None, max_seq: int = 1024) -> LlamaConfig:
    """The Llama-3-8B, Llama-3.2-1B or SmolLM2-135M shape (`layers` overrides the depth)."""
    shapes = {
        "8b": dict(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                   ffn=14336, tied=False),
        "1b": dict(vocab=128256, dim=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                   ffn=8192, tied=True),
        "smollm2": dict(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                        ffn=1536, tied=True),
    }
    kw = dict(shapes[name])
    if layers is not None:
        kw["layers"] = layers
    return LlamaConfig(**kw, norm_eps=1e-5, rope_base=500000.0, max_seq=max_seq,
                       arch="llama")


def matrix_names(c: LlamaConfig, stack: bool = True,
                 stack_ffn: bool = True) -> list[tuple[str, int, int]]:
    """(GGUF name, N, K) of every projection, the embedding and the head; with `stack`,
    q, k and v as the one matrix stacked by rows that the builder reads
    (poot.models.weights.stacked), else as three; with `stack_ffn` gate and up likewise."""
    qd, kd = c.heads * c.head_dim, c.kv_heads * c.head_dim
    out = [("token_embd.weight", c.vocab, c.dim)]
    for i in range(c.layers):
        p = f"blk.{i}."
        names = [p + f"attn_{x}.weight" for x in "qkv"]
        out += [(stacked(names), qd + 2 * kd, c.dim)] if stack else list(
            zip(names, (qd, kd, kd), (c.dim,) * 3))
        ffn = [p + "ffn_gate.weight", p + "ffn_up.weight"]
        out += [(p + "attn_output.weight", c.dim, qd)]
        out += [(stacked(ffn), 2 * c.ffn, c.dim)] if stack_ffn else [(x, c.ffn, c.dim)
                                                                     for x in ffn]
        out += [(p + "ffn_down.weight", c.dim, c.ffn)]
    if not c.tied:
        out.append(("output.weight", c.vocab, c.dim))
    return out


class SyntheticWeights:
    """A WeightSource of declared tensors: matrices `dtype` ("bf16", "f32") or packed in
    `packed` (a GGUF format name), norms f32. `fills` maps each const label to how
    DeviceFilledWeights makes it."""

    def __init__(self, config: LlamaConfig, dtype: str = "bf16", packed: str | None = None,
                 seed: int = 0, stack: bool = True, stack_ffn: bool = True):
        self.checkpoint = f"synthetic-{seed}-{packed or dtype}"
        self.stack = stack                        # q|k|v declared as one stacked matrix
        self.stack_ffn = stack_ffn                # gate|up likewise
        self.specs: dict = {}
        self.fills: dict[str, tuple] = {}         # label -> (seed, mode, a, b, block, fields)
        self.arrays: dict = {}                    # none: nothing lives on the host
        self.packed, self.dtype = packed, DType.parse(dtype)
        c = config
        norms = [f"blk.{i}.{n}" for i in range(c.layers)
                 for n in ("attn_norm.weight", "ffn_norm.weight")] + ["output_norm.weight"]
        for name in norms:
            self._dense(name, TensorType((c.dim,), DType.F32), (1, 0.1 * math.sqrt(3), 1.0))
        for name, n, k in matrix_names(c, stack, stack_ffn):
            std = 1.0 if name == "token_embd.weight" else 1.0 / math.sqrt(k)
            if packed:
                self._packed(name, n, k, std)
            else:
                mode = 0 if self.dtype is DType.BF16 else 1
                self._dense(name, TensorType((n, k), self.dtype), (mode, std * math.sqrt(3), 0))

    def _ref(self, label: str) -> WeightRef:
        seed = int.from_bytes(hashlib.blake2b(f"{self.checkpoint}/{label}".encode(),
                                              digest_size=8).digest(), "little")
        return WeightRef(self.checkpoint, label, payload=f"{self.checkpoint}:{seed:016x}",
                         format=self.packed or str(self.dtype)), seed

    def _dense(self, name: str, t: TensorType, fill: tuple) -> None:
        ref, seed = self._ref(name)
        mode, a, b = fill
        self.specs[name] = DenseSpec(t, ref)
        self.fills[name] = (seed, mode, a, b, 1, 0)

    def _packed(self, name: str, n: int, k: int, std: float) -> None:
        if self.packed not in BLOCKS:
            raise ValueError(f"synthetic weights know the GGUF blocks {sorted(BLOCKS)}, "
                             f"not {self.packed!r}")
        nbytes, fields, spread = BLOCKS[self.packed]
        weight = PackedWeight(self.packed, (n, k))
        if len(weight.sources()) != 1:
            raise ValueError(f"{self.packed}: one source of blocks expected")
        ref, seed = self._ref(name)
        self.specs[name] = PackedSpec(weight, (ref,))
        self.fills[name] = (seed, 2, std / spread, 0.0, nbytes // 2, fields)

    def has(self, name: str) -> bool:
        return name in self.specs

    def spec(self, name: str):
        return self.specs[name]

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of each declared tensor on the device."""
        out = {}
        for name, s in self.specs.items():
            if isinstance(s, PackedSpec):
                out[name] = sum(r.type.nbytes for r in s.weight.sources())
            else:
                out[name] = s.type.nbytes
        return out

    def bytes_per_token(self, config: LlamaConfig) -> int:
        """Weight bytes one decode step must read: every tensor once, except that the
        embedding lookup reads one row (unless the tied head reads the whole table)."""
        sizes = self.weight_bytes()
        total = sum(sizes.values())
        if not config.tied:
            emb = sizes["token_embd.weight"]
            total -= emb - emb // config.vocab
        return total


class DeviceFilledWeights(WeightCache):
    """A WeightCache that makes SyntheticWeights' tensors on the device (by label)."""

    def __init__(self, runtime, source: SyntheticWeights, graph):
        super().__init__(runtime)
        self.source, self.graph = source, graph
        self._fn = None
        self.filled = 0

    def bind(self, spec, const_array, label):
        name = None if spec.folded else self.graph.meta(spec.binder).identity.label
        if name not in self.source.fills:
            return super().bind(spec, const_array, label)
        key = self.key(spec, const_array)
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.runtime.alloc(spec.type.nbytes, label)
            self._fill(buf, spec.type, *self.source.fills[name])
            self.buffers[key] = buf
            self.filled += 1
        else:
            self.hits += 1
        return buf

    def _function(self):
        if self._fn is None:
            from poot_cuda.compiler import compile_cubin

            ctx = self.runtime.ctx
            self._fn = ctx.function(ctx.load_module(compile_cubin(FILL, "poot_bench_fill",
                                                                  "sm_90")),
                                    "poot_bench_fill")
        return self._fn

    def _fill(self, buf, t: TensorType, seed, mode, a, b, block, fields) -> None:
        from poot_cuda.driver import check, cu

        unit = 4 if mode == 1 else 2
        n = t.nbytes // unit
        if t.nbytes % unit:
            raise ValueError(f"{buf.label}: {t.nbytes} bytes are not whole {unit}-byte units")
        args = [np.array([buf.ptr], np.uint64), np.array([n], np.uint64),
                np.array([seed], np.uint64), np.array([mode], np.int32),
                np.array([a], np.float32), np.array([b], np.float32),
                np.array([block], np.int32), np.array([fields], np.int32)]
        addrs = np.array([x.ctypes.data for x in args], np.uint64)
        ctx = self.runtime.ctx
        grid = max(1, min(132 * 16, -(-n // 256)))
        check(cu().cuLaunchKernel(self._function(), grid, 1, 1, 256, 1, 1, 0, ctx.stream,
                                  addrs.ctypes.data, 0), f"fill {buf.label}")
        ctx.sync()   # the argument arrays die with this call


def host_arrays(runtime, cache: DeviceFilledWeights) -> dict[str, np.ndarray]:
    """Every filled tensor read back to the host by label (for the reference backend on a
    reduced shape: the same bytes on both sides)."""
    out = {}
    for name, s in cache.source.specs.items():
        for key, buf in cache.buffers.items():
            ref = s.refs[0] if isinstance(s, PackedSpec) else s.ref
            if key[0] == "const" and key[1] == f"{ref.format}:{ref.payload}":
                raw = runtime.read(buf, 0, buf.nbytes)
                if isinstance(s, PackedSpec):
                    (src,) = s.weight.sources()
                    out[name] = raw.view(src.type.dtype.numpy).reshape(src.type.shape)
                else:
                    out[name] = raw.view(s.type.dtype.numpy).reshape(s.type.shape)
                break
    return out
