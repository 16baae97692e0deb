"""CUDA C: the CUDA-style dialect (poot.codegen.simt) with CUDA's types, 32-lane warp
shuffles, dynamic shared memory, async copies and tensor cores (mma.sync; on sm_90a also
bulk tensor copies and warpgroup products, poot_cuda.tensor_async)."""
from __future__ import annotations

from poot.codegen.expr import Bin, Const, Dot2, Dot4
from poot.codegen.program import (
    AwaitInputs,
    CopyAsync,
    CopyCommit,
    CopyWait,
    GroupBarrier,
    Kernel,
    LoadWide,
    MmaTile,
    RegisterBudget,
    Stmt,
    StoreWide,
)
from poot.codegen.simt import SimtPrinter
from poot.codegen.target import MMA_M16N8K16
from poot.dtypes import DType
from poot.ir.ops import BinaryOp

from poot_cuda.capability import parse_arch
from poot_cuda.tensor_async import HEADER as TENSOR_ASYNC_HEADER
from poot_cuda.tensor_async import TensorAsyncPrinter, uses_tensor_async

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
STATIC_SHARED_LIMIT = 48 * 1024     # more needs dynamic shared memory, opted in per kernel


def _shared_layout(kernel: Kernel) -> list[tuple[str, DType, int, int]]:
    """(name, dtype, count, byte offset) of each shared array, each on its alignment (at
    least 16 bytes)."""
    out, offset = [], 0
    for a in kernel.shared:
        align = max(16, a.align)
        offset = -(-offset // align) * align
        out.append((a.name, a.dtype, a.count, offset))
        offset += a.count * a.dtype.itemsize
    return out


def _shared_align(kernel: Kernel) -> int:
    return max([16, *(a.align for a in kernel.shared)])


def dynamic_shared_bytes(kernel: Kernel) -> int:
    """Bytes of dynamic shared memory the kernel is launched with: its shared arrays when
    they pass the static limit (deep GEMM pipelines), else 0; with room to move the block
    up to the strictest alignment of its arrays."""
    layout = _shared_layout(kernel)
    total = layout[-1][3] + layout[-1][2] * layout[-1][1].itemsize if layout else 0
    return total + _shared_align(kernel) - 16 if total > STATIC_SHARED_LIMIT else 0


#: the unsigned vector type of a 4-, 8- or 16-byte load or store
_VECTORS = {4: "unsigned", 8: "uint2", 16: "uint4"}
#: programmatic dependent launch: wait for the kernels this one depends on
GRID_WAIT = 'asm volatile("griddepcontrol.wait;\\n" ::: "memory");'

HEADER = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
static __device__ __forceinline__ unsigned int poot_and_or(unsigned int x, unsigned int m,
                                                           unsigned int o) {
  unsigned int r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "r"(m), "r"(o));
  return r;
}
static __device__ __forceinline__ int poot_dp2a_lo(int a, unsigned int b, int c) {
  int r;
  asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
static __device__ __forceinline__ int poot_dp2a_hi(int a, unsigned int b, int c) {
  int r;
  asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
static __device__ __forceinline__ int poot_dp4a(int a, unsigned int b, int c) {
  int r;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
"""


class CudaPrinter(TensorAsyncPrinter, SimtPrinter):
    backend = "cuda"
    qualifier = "static __device__ __forceinline__"
    warp = 32
    f16_type, bf16_type = "__half", "__nv_bfloat16"

    def __init__(self, device: str = "sm_90", supported=None):
        self.device = device
        base = {F32, I32, U32, DType.I16, DType.U16, DType.I8, DType.U8, F16, BF16}
        self.supported = frozenset(supported if supported is not None else base)

    def header(self, kernel: Kernel) -> str:
        return HEADER + (TENSOR_ASYNC_HEADER if uses_tensor_async(kernel) else "")

    def value_params(self, kernel: Kernel) -> list[str]:
        return [f"const __grid_constant__ poot_tensor_map {t.name}" for t in kernel.tensor_maps]

    def launch_bounds(self, kernel: Kernel) -> str:
        """With one workgroup per multiprocessor when warpgroups trade registers
        (setmaxnreg takes effect only under that cap)."""
        budget = any(isinstance(s, RegisterBudget) for s in kernel.statements())
        return f"{kernel.threads_per_group}{', 1' if budget else ''}"

    def entry(self) -> list[str]:
        """sm_90: programmatic dependent launch. Wait until the kernels this one depends
        on have finished and their writes are visible (a no-op when it was launched the
        ordinary way; a kernel with AwaitInputs waits there instead), then let the next
        kernel of the stream start launching, so its launch overlaps this kernel's work
        instead of following it."""
        if parse_arch(self.device)[0] < 9:
            return []
        return ([] if self._awaits else [GRID_WAIT]) + \
            ['asm volatile("griddepcontrol.launch_dependents;\\n" ::: "memory");']

    def await_inputs(self, s: AwaitInputs, depth: int) -> list[str]:
        return [self.pad(depth) + GRID_WAIT] if parse_arch(self.device)[0] >= 9 else []

    def unit(self, kernel: Kernel) -> str:
        # decided once per kernel: where its shared arrays live (one dynamic block past
        # 48 KiB), and whether async copies and matrix loads address them in 16-byte units
        self._offsets = ({n: o for n, _, _, o in _shared_layout(kernel)}
                         if dynamic_shared_bytes(kernel) else None)
        self._align = any(isinstance(s, (CopyAsync, MmaTile, LoadWide, StoreWide))
                          for s in kernel.statements())
        self._aligns = {a.name: a.align for a in kernel.shared}
        self._block_align = _shared_align(kernel)
        self._awaits = kernel.early_reads() is not None
        return super().unit(kernel)

    def shared_decl(self, name: str, dtype: DType, count: int) -> str:
        t = self.type_name(dtype)
        if self._offsets is not None:
            offset = self._offsets[name]
            first = ""
            if offset == 0:
                first = "extern __shared__ __align__(16) unsigned char poot_smem_raw[]; "
                a = self._block_align      # the block moved up to its strictest alignment
                first += ("unsigned char* const poot_smem = poot_smem_raw + "
                          f"(({a}u - ((unsigned)__cvta_generic_to_shared(poot_smem_raw) & "
                          f"{a - 1}u)) & {a - 1}u); " if a > 16 else
                          "unsigned char* const poot_smem = poot_smem_raw; ")
            return f"{first}{t}* const {name} = ({t}*)(poot_smem + {offset});"
        own = self._aligns.get(name, 16)      # reduction scratch is the printer's own
        align = max(own if own > 16 else 0, 16 if self._align else 0)
        return f"__shared__ {f'__align__({align}) ' if align else ''}{t} {name}[{count}];"

    def load_wide(self, s: LoadWide, depth: int) -> list[str]:
        """One vector load (ld.global.nc.v4 or ld.shared.v4): 32-bit elements as the
        fields of a uint2/uint4 or float2/float4, narrower ones read out of it."""
        pad, count, dtype = self.pad(depth), len(s.names), s.load.dtype
        t, first = self.type_name(dtype), self.name(s.names[0]) + "_wide"
        size = count * dtype.itemsize
        vec = f"{'float' if dtype is F32 else 'uint'}{count}" if dtype.itemsize == 4 else \
            _VECTORS[size]
        lines = [f"{pad}const {vec} {first} = *reinterpret_cast<const {vec}*>"
                 f"(&{s.load.buffer}[{self.expr(s.load.index)}]);"]
        if dtype.itemsize == 4:
            return lines + [f"{pad}const {t} {self.name(n)} = {first}.{c};"
                            for n, c in zip(s.names, "xyzw", strict=False)]
        return lines + [f"{pad}const {t} {self.name(n)} = reinterpret_cast<const {t}*>"
                        f"(&{first})[{i}];" for i, n in enumerate(s.names)]

    def store_wide(self, s: StoreWide, depth: int) -> list[str]:
        """One 4-, 8- or 16-byte store of the values packed in an aligned temporary (the
        compiler keeps it in registers)."""
        pad, dtype = self.pad(depth), self.kernel.arrays()[s.array].dtype
        t, size = self.type_name(dtype), len(s.values) * dtype.itemsize
        vec = _VECTORS[size]
        values = ", ".join(self.expr(v) for v in s.values)
        return [f"{pad}{{ alignas({size}) {t} poot_w[{len(s.values)}] = {{{values}}};",
                f"{pad}  *reinterpret_cast<{vec}*>(&{s.array}[{self.expr(s.index)}]) = "
                f"*reinterpret_cast<const {vec}*>(poot_w); }}"]

    def group_barrier(self, s: GroupBarrier, depth: int) -> list[str]:
        if s.width != self.warp:
            raise self.unsupported(f"GroupBarrier of {s.width} threads (a warp is {self.warp})")
        return [self.pad(depth) + "__syncwarp();"]

    # -- async copies and tensor cores (sm_80+) -------------------------------------------
    def matrix(self, s: Stmt, depth: int) -> list[str]:
        pad = self.indent_unit * depth
        if isinstance(s, CopyCommit):
            return [f'{pad}asm volatile("cp.async.commit_group;\\n" ::: "memory");']
        if isinstance(s, CopyWait):
            return [f'{pad}asm volatile("cp.async.wait_group {s.pending};\\n" ::: "memory");']
        if isinstance(s, CopyAsync):
            dst = f"&{s.dst}[{self.expr(s.dst_index)}]"
            src = f"&{s.src}[{self.expr(s.src_index)}]"
            return [f"{pad}asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" "
                    f":: \"r\"((unsigned)__cvta_generic_to_shared({dst})), \"l\"({src}), "
                    f"\"r\"({self.expr(s.valid)} != 0 ? 16 : 0) : \"memory\");"]
        return self.mma_tile(s, pad)

    def mma_tile(self, s: MmaTile, pad: str) -> list[str]:
        """ldmatrix loads the fragments (x4: four 8x8 matrices, one row address per
        lane), then one mma.sync per 16 x 8 tile; see MmaTile for the layouts."""
        if s.unit is not MMA_M16N8K16:
            raise self.unsupported(f"MmaTile of matrix unit {s.unit.feature}")
        t = "bf16" if s.dtype is BF16 else "f16"
        lane = f"({self.builtin('index', 0, self.kernel)} & {self.warp - 1})"
        a_row, a_word = self.expr(s.a_row), self.expr(s.a_word)
        b_col, b_word = self.expr(s.b_col), self.expr(s.b_word)
        out = [pad + "{", f"{pad}  const int ln = {lane};",
               f"{pad}  unsigned fa[{s.tiles_m}][4], fb[{s.tiles_n}][2];"]

        def ldmatrix(regs: list[str], array: str, word: str, trans: bool) -> str:
            outs = ", ".join(f'"=r"({r})' for r in regs)
            return (f'{pad}  asm volatile("ldmatrix.sync.aligned.m8n8.x4{".trans" if trans else ""}'
                    f'.shared.b16 {{%0, %1, %2, %3}}, [%4];\\n" : {outs} : '
                    f'"r"((unsigned)__cvta_generic_to_shared(&{array}[{word}])));')

        for i in range(s.tiles_m):       # rows ln % 16, K half ln / 16
            word = (f"({a_row} + {16 * i} + (ln & 15)) * {s.a_pitch} + {a_word} + "
                    f"(ln >> 4) * 4")
            out.append(ldmatrix([f"fa[{i}][{r}]" for r in range(4)], s.a, word, False))
        for jj in range(s.tiles_n // 2):  # two 8-column tiles per load
            regs = [f"fb[{2 * jj}][0]", f"fb[{2 * jj}][1]", f"fb[{2 * jj + 1}][0]",
                    f"fb[{2 * jj + 1}][1]"]
            if s.b_trans:                 # [k][n]: rows k = ln % 16, columns + 8 (ln / 16)
                word = (f"(ln & 15) * {s.b_pitch} + {b_word} + ({b_col} + {16 * jj} + "
                        f"(ln >> 4) * 8) / 2")
            else:                         # [n][k]: rows n, K half (ln / 8) % 2
                word = (f"({b_col} + {16 * jj} + (ln & 7) + (ln >> 4) * 8) * {s.b_pitch} + "
                        f"{b_word} + ((ln >> 3) & 1) * 4")
            out.append(ldmatrix(regs, s.b, word, s.b_trans))
        for i in range(s.tiles_m):
            for j in range(s.tiles_n):
                c = [f"{s.acc}[{s.acc_first + 4 * (i * s.tiles_n + j) + r}]" for r in range(4)]
                out.append(
                    f'{pad}  asm("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 '
                    f'{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};'
                    f'\\n" : ' + ", ".join(f'"+f"({x})' for x in c) + " : "
                    + ", ".join(f'"r"(fa[{i}][{r}])' for r in range(4)) + ", "
                    + f'"r"(fb[{j}][0]), "r"(fb[{j}][1]));')
        return out + [pad + "}"]

    def to_f32(self, dtype: DType, text: str) -> str:
        return f"__half2float({text})" if dtype is F16 else f"__bfloat162float({text})"

    def from_f32(self, dtype: DType, text: str) -> str:
        return f"__float2half_rn({text})" if dtype is F16 else f"__float2bfloat16_rn({text})"

    def binary(self, e: Bin) -> str:
        """(x & m) | o on words as one lop3: packed decoders build floats that way per
        element, and ptxas splits the two constants into two instructions."""
        if (e.op is BinaryOp.Or and e.a.dtype is U32 and isinstance(e.a, Bin)
                and e.a.op is BinaryOp.And and isinstance(e.b, Const)):
            return f"poot_and_or({self.expr(e.a.a)}, {self.expr(e.a.b)}, {self.expr(e.b)})"
        return super().binary(e)

    @property
    def native_dot2(self) -> bool:
        return parse_arch(self.device) >= (6, 1)

    def dot2(self, e: Dot2) -> str:
        return (f"poot_dp2a_{'hi' if e.high else 'lo'}({self.expr(e.a)}, {self.expr(e.b)}, "
                f"{self.expr(e.c)})")

    def dot4(self, e: Dot4) -> str:
        return f"poot_dp4a({self.expr(e.a)}, {self.expr(e.b)}, {self.expr(e.c)})"

    def shuffle_xor(self, value: str, offset: int, lanes: int) -> str:
        return f"__shfl_xor_sync(0xffffffffu, {value}, {offset}, 32)"
