"""Compatibility names: the Backend contract moved to `poot.contract` and the backend
registry to `poot.plugin`. Kept because about forty modules and the backend packages
import these names from here; new code imports from `poot.contract`."""
from poot.contract import Backend, Device, Lowering
from poot.plugin import backends, get_backend, select_backend

__all__ = ["Backend", "Device", "Lowering", "backends", "get_backend", "select_backend"]
