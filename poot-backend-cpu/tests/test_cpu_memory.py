"""What a cpu run holds in memory, checked by structure (issue 49's peak RSS target):
the step's kernels stay out of line (inlining them all into poot_step made the C
compiler's own peak the run's, on a cold kernel cache), and planning for the backend
leaves numpy.random unloaded (its extension modules stay resident once imported)."""
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
