"""CUDA C of the TMA and WGMMA statement families (sm_90a), as inline PTX: mbarriers,
bulk tensor copies from `__grid_constant__` tensor maps, warpgroup products whose shared
operands are addressed through matrix descriptors, and register budgets."""
from __future__ import annotations

from poot.codegen.program import (
    SWIZZLE_SPAN,
    Kernel,
    MbarArrive,
    MbarInit,
    MbarWait,
    RegisterBudget,
    SmemTile,
    Stmt,
    TmaLoad,
    Wgmma,
    WgmmaCommit,
    WgmmaWait,
)
from poot.dtypes import DType

#: the tensor map the host encodes (cuTensorMapEncodeTiled: 128 opaque bytes, 64-aligned),
#: and a shared tile's matrix descriptor: start address, leading and stride byte offsets
#: (16-byte units), 128-byte swizzle (mode 1 in bits 62-63)
HEADER = """\
struct __align__(64) poot_tensor_map { unsigned long long opaque[16]; };
static __device__ __forceinline__ unsigned long long poot_wgmma_desc(const void* p,
                                                                     unsigned lead,
                                                                     unsigned stride) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lead >> 4) << 16)
       | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
"""
#: leading byte offset of a K-major swizzled tile (unused by the hardware; 1 by custom)
K_MAJOR_LEAD = 16


def uses_tensor_async(kernel: Kernel) -> bool:
    return bool(kernel.tensor_maps) or any(
        isinstance(s, (Wgmma, RegisterBudget, MbarInit)) for s in kernel.statements())


class TensorAsyncPrinter:
    """Mixin of CudaPrinter: `tensor_async` prints one statement of the families."""

    def shared_address(self, array: str, index) -> str:
        return f"(unsigned)__cvta_generic_to_shared(&{array}[{self.expr(index)}])"

    def barrier_address(self, bars: str, index) -> str:
        return f"(unsigned)__cvta_generic_to_shared(&{bars}[2 * ({self.expr(index)})])"

    def tensor_async(self, s: Stmt, depth: int) -> list[str]:
        pad = self.indent_unit * depth
        if isinstance(s, MbarInit):
            return [f'{pad}asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n" :: '
                    f'"r"({self.barrier_address(s.bars, s.index)}), "r"({s.count}) : "memory");',
                    f'{pad}asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");']
        if isinstance(s, MbarArrive):
            bar = self.barrier_address(s.bars, s.index)
            if s.tx_bytes:
                return [f'{pad}asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], '
                        f'%1;\\n" :: "r"({bar}), "r"({s.tx_bytes}) : "memory");']
            return [f'{pad}asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: '
                    f'"r"({bar}) : "memory");']
        if isinstance(s, MbarWait):
            return [pad + "{", f"{pad}  const unsigned poot_bar = "
                    f"{self.barrier_address(s.bars, s.index)};",
                    f"{pad}  const unsigned poot_parity = {self.expr(s.parity)};",
                    f"{pad}  unsigned poot_done = 0;",
                    f'{pad}  do {{ asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity'
                    f'.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }}\\n" : '
                    f'"=r"(poot_done) : '
                    f'"r"(poot_bar), "r"(poot_parity) : "memory"); }} while (!poot_done);',
                    pad + "}"]
        if isinstance(s, TmaLoad):
            return [f'{pad}asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile'
                    f'.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], [%4];\\n" :: '
                    f'"r"({self.shared_address(s.dst, s.dst_index)}), '
                    f'"l"((unsigned long long)&{s.tensor_map}), "r"({self.expr(s.col)}), '
                    f'"r"({self.expr(s.row)}), "r"({self.barrier_address(s.bars, s.bar)}) '
                    f': "memory");']
        if isinstance(s, Wgmma):
            return self.wgmma(s, pad)
        if isinstance(s, WgmmaCommit):
            return [f'{pad}asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");']
        if isinstance(s, WgmmaWait):
            # the accumulators are operands, so no read of them moves above the wait
            regs = [f'"+f"({s.acc}[{r}])' for r in range(self.local_count(s.acc))] if s.acc else []
            return [f'{pad}asm volatile("wgmma.wait_group.sync.aligned {s.pending};\\n" : '
                    f'{", ".join(regs)} :: "memory");']
        if isinstance(s, RegisterBudget):
            way = "inc" if s.grow else "dec"
            return [f'{pad}asm volatile("setmaxnreg.{way}.sync.aligned.u32 {s.registers};\\n");']
        raise self.unsupported(f"{type(s).__name__} statement")

    def local_count(self, name: str) -> int:
        return next(a.count for a in self._kernel.locals if a.name == name)

    def descriptor(self, t: SmemTile) -> str:
        lead = K_MAJOR_LEAD if t.k_major else t.block_bytes
        return f"poot_wgmma_desc(&{t.array}[{self.expr(t.first)}], {lead}, {SWIZZLE_SPAN})"

    def wgmma(self, s: Wgmma, pad: str) -> list[str]:
        t = "bf16" if s.dtype is DType.BF16 else "f16"
        regs = s.n // 2
        outs = ", ".join(f'"+f"({s.acc}[{r}])' for r in range(regs))
        d = ", ".join(f"%{r}" for r in range(regs))
        trans_b = 0 if s.b.k_major else 1
        fence = [f'{pad}  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");'] \
            if s.fence else []
        return [pad + "{", *fence,
                f"{pad}  const unsigned long long poot_da = {self.descriptor(s.a)};",
                f"{pad}  const unsigned long long poot_db = {self.descriptor(s.b)};",
                f'{pad}  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{regs + 2}, 0; '
                f"wgmma.mma_async.sync.aligned.m64n{s.n}k16.f32.{t}.{t} {{{d}}}, %{regs}, "
                f'%{regs + 1}, p, 1, 1, 0, {trans_b}; }}\\n" : {outs} : "l"(poot_da), '
                f'"l"(poot_db), "r"(1));',
                pad + "}"]
