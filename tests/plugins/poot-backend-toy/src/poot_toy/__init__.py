"""poot-backend-toy: a deliberately partial third-party poot backend (see docs/backend-guide.md)."""
from poot_toy.backend import ToyBackend

__all__ = ["ToyBackend"]
