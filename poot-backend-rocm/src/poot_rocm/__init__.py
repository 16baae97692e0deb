"""poot-backend-rocm: HIP printing of poot kernel programs, hiprtc, HIP runtime, graphs."""
from poot_rocm.backend import RocmBackend
from poot_rocm.printer import HipPrinter
from poot_rocm.probe import probe

__all__ = ["RocmBackend", "HipPrinter", "probe"]
