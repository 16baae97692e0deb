"""NCCL collectives for tensor parallelism: one process per GPU, one communicator per rank.

The bindings are CuPy's `cupy.cuda.nccl` (cupy-cuda13x, pinned in this package's `tp` extra;
the NCCL library itself comes from nvidia-nccl-cu13). They take raw device pointers and a
raw stream handle, so a collective runs on the runtime's own stream, from memory the
runtime allocated through the driver API, and is captured into the step's CUDA graph with
the kernels around it (stream capture records NCCL's kernels like any other).

Rank 0's launcher makes the group's unique id (`NcclGroup.create`), hands it to every rank
process, and each process joins as its rank on the GPU of that index (`member`). NVLink
multicast (NVLS) is kept off: `NCCL_NVLS_ENABLE=0` is set in the environment before any
process initializes NCCL (the machines these run on ask for it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from poot.dtypes import DType
from poot.errors import DeviceUnavailable, DtypeLowering

from poot_cuda.driver import CudaError

NVLS_ENV = {"NCCL_NVLS_ENABLE": "0"}


def nccl():
    try:
        from cupy.cuda import nccl as module
    except ImportError as e:
        raise DeviceUnavailable(f"tensor parallelism on CUDA needs NCCL through CuPy "
                                f"(pip install 'poot-backend-cuda[tp]'): {e}") from None
    if not getattr(module, "available", True):
        raise DeviceUnavailable("CuPy was built without NCCL")
    return module


def keep_nvls_off() -> None:
    """NCCL reads its environment when it first initializes: set it before that."""
    os.environ.update(NVLS_ENV)


@dataclass(frozen=True)
class NcclGroup:
    """A tensor-parallel group of `ranks` processes, one GPU each (picklable: the launcher
    sends it to every rank process)."""

    unique_id: object
    ranks: int
    processes = True                 # each rank runs in a process of its own

    @classmethod
    def create(cls, ranks: int) -> NcclGroup:
        keep_nvls_off()
        return cls(nccl().get_unique_id(), ranks)

    def member(self, rank: int, device) -> NcclCommunicator:
        return NcclCommunicator(self, rank, device.index)


class NcclCommunicator:
    """One rank of an NcclGroup (poot.contract.Communicator over device pointers)."""

    dtypes = frozenset({DType.F32, DType.F16, DType.BF16, DType.I32})

    def __init__(self, group: NcclGroup, rank: int, device_index: int):
        keep_nvls_off()
        module = nccl()
        from cupy.cuda import runtime

        self.rank, self.ranks = rank, group.ranks
        runtime.setDevice(device_index)      # NCCL binds the communicator to this device
        try:
            self.comm = module.NcclCommunicator(group.ranks, group.unique_id, rank)
        except module.NcclError as e:
            raise CudaError(f"ncclCommInitRank (rank {rank} of {group.ranks}, GPU "
                            f"{device_index}) failed: {e}") from None
        self._types = {DType.F32: module.NCCL_FLOAT32, DType.F16: module.NCCL_FLOAT16,
                       DType.BF16: module.NCCL_BFLOAT16, DType.I32: module.NCCL_INT32}
        self._sum = module.NCCL_SUM
        self._error = module.NcclError

    def _type(self, dtype: DType) -> int:
        got = self._types.get(dtype)
        if got is None:
            raise DtypeLowering(f"NCCL collectives move {sorted(map(str, self._types))}, not "
                                f"{dtype}", op="AllReduce", dtype=str(dtype), backend="cuda")
        return got

    def all_reduce(self, src: int, dst: int, count: int, dtype: DType, stream) -> None:
        try:
            self.comm.allReduce(src, dst, count, self._type(dtype), self._sum, int(stream))
        except self._error as e:
            raise CudaError(f"ncclAllReduce of {count} {dtype} failed: {e}") from None

    def all_gather(self, src: int, dst: int, count: int, dtype: DType, stream) -> None:
        try:
            self.comm.allGather(src, dst, count, self._type(dtype), int(stream))
        except self._error as e:
            raise CudaError(f"ncclAllGather of {count} {dtype} per rank failed: {e}") from None

    def close(self) -> None:
        self.comm.destroy()
