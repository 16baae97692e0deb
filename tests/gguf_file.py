"""gguf-py's GGUFReader over a plain ndarray view of the file's memory map, for the
independent numpy forwards (tests/reference_llama.py, tests/reference_gemma3.py).

gguf-py slices its np.memmap once per part of every metadata field, and numpy's memmap
subclass runs two Python methods a slice: opening a GGUF whose vocabulary holds 262,144
tokens took most of a numpy forward's load. The same bytes read through a plain view parse
about four times faster; the fields and tensors are the same.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader


class PlainGGUFReader(GGUFReader):
    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:  # the view keeps the map open
        self._plain = mapped.view(np.ndarray)
