"""poot-backend-stride: a third-party poot backend written from docs/backend-guide.md and
poot/contract.py alone. Host kernels over strided views of its buffers."""
from poot_stride.backend import StrideBackend

__all__ = ["StrideBackend"]
