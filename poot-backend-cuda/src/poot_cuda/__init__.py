"""poot-backend-cuda: CUDA C printing of poot kernel programs, NVRTC, driver runtime, graphs."""
from poot_cuda.backend import CudaBackend
from poot_cuda.printer import CudaPrinter
from poot_cuda.probe import probe

__all__ = ["CudaBackend", "CudaPrinter", "probe"]
