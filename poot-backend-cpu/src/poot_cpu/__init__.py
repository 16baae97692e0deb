"""poot-backend-cpu: poot kernel programs printed as C, compiled by the system C compiler
with OpenMP, run from one compiled step function per plan."""
from poot_cpu.backend import BACKEND, CpuBackend

__all__ = ["BACKEND", "CpuBackend"]
