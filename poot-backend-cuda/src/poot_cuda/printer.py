"""CUDA C: the C-like printer with CUDA's types, indices, barrier and warp shuffles."""
from __future__ import annotations

from poot.codegen.cstyle import CPrinter
from poot.codegen.expr import Bin, Const
from poot.codegen.program import (
    CoopReduce,
    CopyAsync,
    CopyCommit,
    CopyWait,
    Kernel,
    MmaTile,
    Stmt,
)
from poot.dtypes import DType
from poot.ir.ops import BinaryOp, ReduceOp

from poot_cuda.capability import parse_arch

F32, F16, BF16, I32, U32 = DType.F32, DType.F16, DType.BF16, DType.I32, DType.U32
WARP = 32
STATIC_SHARED_LIMIT = 48 * 1024     # more needs dynamic shared memory, opted in per kernel


def _shared_layout(kernel: Kernel) -> list[tuple[str, DType, int, int]]:
    """(name, dtype, count, byte offset) of each shared array, 16-byte aligned."""
    out, offset = [], 0
    for a in kernel.shared:
        out.append((a.name, a.dtype, a.count, offset))
        offset += -(-a.count * a.dtype.itemsize // 16) * 16
    return out


def dynamic_shared_bytes(kernel: Kernel) -> int:
    """Bytes of dynamic shared memory the kernel is launched with: its shared arrays when
    they pass the static limit (deep GEMM pipelines), else 0."""
    layout = _shared_layout(kernel)
    total = layout[-1][3] + layout[-1][2] * layout[-1][1].itemsize if layout else 0
    return total if total > STATIC_SHARED_LIMIT else 0

HEADER = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
static __device__ __forceinline__ unsigned int poot_and_or(unsigned int x, unsigned int m,
                                                           unsigned int o) {
  unsigned int r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "r"(m), "r"(o));
  return r;
}
"""


class CudaPrinter(CPrinter):
    backend = "cuda"
    qualifier = "static __device__ __forceinline__"

    def __init__(self, device: str = "sm_90", supported=None):
        self.device = device
        base = {F32, I32, U32, DType.I16, DType.U16, DType.I8, DType.U8, F16, BF16}
        self.supported = frozenset(supported if supported is not None else base)

    def type_name(self, dtype: DType) -> str:
        if dtype is F16:
            return "__half"
        if dtype is BF16:
            return "__nv_bfloat16"
        return super().type_name(dtype)

    def header(self, kernel: Kernel) -> str:
        return HEADER

    def signature(self, kernel: Kernel) -> str:
        params = []
        for b in kernel.buffers:
            const = "const " if not b.access.writable else ""
            params.append(f"{const}{self.type_name(b.dtype)}* __restrict__ {b.name}")
        return (f'extern "C" __global__ void __launch_bounds__({kernel.threads_per_group}) '
                f"{kernel.name}({', '.join(params)})")

    def builtin(self, kind: str, axis: int, kernel: Kernel) -> str:
        a = "xyz"[axis]
        if kind == "local":
            return f"((int)threadIdx.{a})"
        if kind == "group":
            return f"((int)blockIdx.{a})"
        if kind == "global":
            return f"((int)(blockIdx.{a} * {kernel.workgroup3()[axis]}u + threadIdx.{a}))"
        wx, wy, wz = kernel.workgroup3()
        if wy == wz == 1:
            return "((int)threadIdx.x)"
        return f"((int)(threadIdx.x + {wx}u * (threadIdx.y + {wy}u * threadIdx.z)))"

    def barrier(self) -> str:
        return "__syncthreads();"

    def entry(self) -> list[str]:
        """sm_90: programmatic dependent launch. Wait until the kernels this one depends
        on have finished and their writes are visible (a no-op when it was launched the
        ordinary way), then let the next kernel of the stream start launching, so its
        launch overlaps this kernel's work instead of following it."""
        if parse_arch(self.device)[0] < 9:
            return []
        return ['asm volatile("griddepcontrol.wait;\\n" ::: "memory");',
                'asm volatile("griddepcontrol.launch_dependents;\\n" ::: "memory");']

    def unit(self, kernel: Kernel) -> str:
        # decided once per kernel: where its shared arrays live (one dynamic block past
        # 48 KiB), and whether async copies and matrix loads address them in 16-byte units
        self._offsets = ({n: o for n, _, _, o in _shared_layout(kernel)}
                         if dynamic_shared_bytes(kernel) else None)
        self._align = any(isinstance(s, (CopyAsync, MmaTile)) for s in kernel.statements())
        return super().unit(kernel)

    def shared_decl(self, name: str, dtype: DType, count: int) -> str:
        t = self.type_name(dtype)
        if self._offsets is not None:
            offset = self._offsets[name]
            first = ("extern __shared__ __align__(16) unsigned char poot_smem[]; "
                     if offset == 0 else "")
            return f"{first}{t}* const {name} = ({t}*)(poot_smem + {offset});"
        align = "__align__(16) " if self._align else ""
        return f"__shared__ {align}{t} {name}[{count}];"

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
        t = "bf16" if s.dtype is BF16 else "f16"
        lane = f"({self.builtin('index', 0, self.kernel)} & 31)"
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

    def bitcast(self, src: DType, dst: DType, text: str) -> str:
        fn = {(I32, F32): "__int_as_float", (U32, F32): "__uint_as_float",
              (F32, I32): "__float_as_int", (F32, U32): "__float_as_uint"}.get((src, dst))
        if fn is not None:
            return f"{fn}({text})"
        if {src, dst} == {I32, U32}:
            return f"(({self.type_name(dst)})({text}))"
        raise self.refuse(src, f"bitcast to {dst}")

    def clz(self, text: str) -> str:
        return f"__clz({text})"

    def binary(self, e: Bin) -> str:
        """(x & m) | o on words as one lop3: packed decoders build floats that way per
        element, and ptxas splits the two constants into two instructions."""
        if (e.op is BinaryOp.Or and e.a.dtype is U32 and isinstance(e.a, Bin)
                and e.a.op is BinaryOp.And and isinstance(e.b, Const)):
            return f"poot_and_or({self.expr(e.a.a)}, {self.expr(e.a.b)}, {self.expr(e.b)})"
        return super().binary(e)

    # -- cooperative reductions -----------------------------------------------------
    def _combine(self, op: ReduceOp, dtype: DType, a: str, b: str) -> str:
        if op is ReduceOp.Sum:
            return f"({a} + {b})" if dtype is F32 else f"poot_iadd({a}, {b})"
        return f"poot_fmax({a}, {b})" if dtype is F32 else f"poot_imax({a}, {b})"

    def needs_scratch(self, s: CoopReduce, kernel: Kernel) -> bool:
        width = s.width or kernel.threads_per_group
        return width > WARP or kernel.threads_per_group % WARP != 0

    def reduction_scratch_decl(self, s: CoopReduce, i: int) -> str:
        count = max(1, -(-self.kernel.threads_per_group // WARP))
        return self.shared_decl(f"poot_red_{s.name}", s.value.dtype, count if
                                self.kernel.threads_per_group % WARP == 0
                                else self.kernel.threads_per_group)

    def coop_reduce(self, s: CoopReduce, depth: int) -> list[str]:
        pad, kernel = self.pad(depth), self.kernel
        t = self.type_name(s.value.dtype)
        tpg = kernel.threads_per_group
        width = s.width or tpg
        lane = self.builtin("index", 0, kernel)
        v, scratch = f"{s.name}_v", f"poot_red_{s.name}"

        def fold(other: str) -> str:
            return f"{pad}{v} = {self._combine(s.op, s.value.dtype, v, other)};"

        out = [f"{pad}{t} {v} = {self.expr(s.value)};"]
        if tpg % WARP != 0:
            # ragged workgroups: every thread publishes, each folds its group sequentially
            first = f"({lane} / {width}) * {width}"
            return out + [f"{pad}{scratch}[{lane}] = {v};", f"{pad}__syncthreads();",
                          f"{pad}{v} = {scratch}[{first}];",
                          f"{pad}for (int o = 1; o < {width}; ++o)",
                          self.indent_unit + fold(f"{scratch}[{first} + o]"),
                          f"{pad}__syncthreads();", f"{pad}const {t} {s.name} = {v};"]
        off = min(width, WARP) // 2
        while off >= 1:  # butterfly within aligned groups of min(width, 32) lanes
            out.append(fold(f"__shfl_xor_sync(0xffffffffu, {v}, {off}, 32)"))
            off //= 2
        if width <= WARP:
            return out + [f"{pad}const {t} {s.name} = {v};"]
        # across warps: lane 0 of each warp publishes, every thread folds its group's warps
        per_group = width // WARP
        first = f"({lane} / {width}) * {per_group}"
        return out + [f"{pad}if (({lane} & {WARP - 1}) == 0) {scratch}[{lane} / {WARP}] = {v};",
                      f"{pad}__syncthreads();", f"{pad}{v} = {scratch}[{first}];",
                      f"{pad}for (int o = 1; o < {per_group}; ++o)",
                      self.indent_unit + fold(f"{scratch}[{first} + o]"),
                      f"{pad}__syncthreads();", f"{pad}const {t} {s.name} = {v};"]
