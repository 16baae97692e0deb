"""poot_quant.ggml_types, the GGML type ids and block geometry a GGUF is read with, agree
with the `gguf` package's own tables; and reading a GGUF leaves that package unimported."""
from __future__ import annotations

import subprocess
import sys

import gguf
from poot_quant.ggml_types import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType


def test_type_ids_and_block_geometry_are_the_gguf_packages():
    ours = {t.name: (int(t), GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}
    theirs = {t.name: (int(t), gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType
              if t.name in ours}
    assert ours == theirs
    assert GGUF_DEFAULT_ALIGNMENT == gguf.GGUF_DEFAULT_ALIGNMENT
    # a member keys the gguf package's tables (its quantizers look types up there)
    assert gguf.GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K] == (256, 144)


def test_opening_a_gguf_leaves_the_gguf_package_unimported(smollm2_gguf):
    probe = ("import sys\n"
             "from poot_quant.gguf_file import open_gguf\n"
             f"ckpt = open_gguf({str(smollm2_gguf)!r})\n"
             "assert ckpt.tensors\n"
             "print(sorted(m for m in sys.modules if m == 'gguf' or m.startswith('gguf.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"]
