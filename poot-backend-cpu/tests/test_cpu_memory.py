"""What a cpu run holds in memory, checked by structure (issue 49's peak RSS target):
the step's kernels stay out of line (inlining them all into poot_step made the C
compiler's own peak the run's, on a cold kernel cache), planning for the backend
leaves numpy.random unloaded (its extension modules stay resident once imported), and
`poot run` on SmolLM2 imports no other backend, no other subcommand, no package it does
not use (tokenizers, regex, gguf; packaging, for plain version ranges) and not OpenSSL
(hashlib's _hashlib)."""
from __future__ import annotations

import re
import subprocess
import sys

import poot
from poot import ops
from poot.plan import plan


def test_poot_step_calls_every_kernel_out_of_line(cpu_backend):
    from poot_cpu.step import build_step

    g = poot.trace(lambda a, b: ops.exp(ops.add(ops.mul(a, b), a)),
                   poot.spec((3, 40), name="a"), poot.spec((3, 40), name="b"))
    source = build_step(plan(g, (cpu_backend, cpu_backend.probe()[0]))).source
    body = source[source.index("void poot_step("):]
    called = set(re.findall(r"^\s+(poot_\w+)\(", body, re.M))
    assert "poot_barrier" in source and len(called - {"poot_barrier"}) >= 1
    for name in called:
        assert re.search(rf"^NOINLINE\nstatic void {name}\(", source, re.M), name


def test_planning_leaves_numpy_random_unloaded(cpu_backend):
    probe = ("import sys\n"
             "from poot_cpu import BACKEND\n"
             "BACKEND.capabilities(BACKEND.probe()[0])\n"
             "print('numpy.random' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"], \
        "numpy.random was imported: its extension modules stay resident for the run"


#: what a cpu run of a byte-level GGUF must leave unimported (top-level names, or modules)
UNWANTED = {"poot_cuda", "poot_rocm", "poot_vulkan", "poot_wgpu", "poot_stride", "poot_toy",
            "tokenizers", "regex", "gguf", "packaging", "_hashlib", "poot.cli.serve",
            "poot.cli.doctor"}


def test_a_cpu_run_imports_only_what_it_uses(smollm2_gguf):
    probe = ("import sys\n"
             "from poot.cli import build_parser\n"
             "build_parser('run')\n"
             "from poot.models.runner import load\n"
             f"model = load({str(smollm2_gguf)!r}, 'cpu', max_seq=64)\n"
             "assert model.tokenizer.encode('The capital of France is')\n"
             "from poot_cpu import compiler, runtime\n"
             "compiler.library_key('int x;')\n"
             "import poot.runtime.prefix_cache, poot.runtime.session\n"
             f"unwanted = {sorted(UNWANTED)!r}\n"
             "print(sorted(m for m in sys.modules if m in unwanted\n"
             "             or m.partition('.')[0] in unwanted))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]"], f"a cpu run imported {out.stdout.strip()}"
