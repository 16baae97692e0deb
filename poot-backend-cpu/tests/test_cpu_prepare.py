"""CpuRuntime.prepare (what Session.prepare calls, on any thread) builds a plan's library
into the kernel cache before any buffer is bound, and `load` then takes the step source
it printed instead of printing it again."""
from __future__ import annotations

import numpy as np

import poot
from poot import ops
from poot.plan import plan
from poot.runtime.executor import Executor


def test_load_takes_the_prepared_step_and_its_built_library(cpu_backend, tmp_path,
                                                            monkeypatch):
    from poot_cpu import compiler, runtime

    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    device = cpu_backend.probe()[0]
    g = poot.trace(lambda a: ops.exp(ops.add(a, a)), poot.spec((3, 40), name="a"))
    planned = plan(g, (cpu_backend, device))
    rt = cpu_backend.runtime(device)
    rt.prepare(planned)
    (entry,) = rt._prepared.values()
    assert entry[0] is planned
    assert (compiler.cache_dir() / f"{compiler.library_key(entry[1].source)}.so").exists()

    def refuse(_):
        raise AssertionError("load printed the prepared plan again")
    monkeypatch.setattr(runtime, "build_step", refuse)
    a = np.linspace(-1, 1, 120, dtype=np.float32).reshape(3, 40)
    ex = Executor(planned, {"a": a}, runtime=rt)
    assert ex.executable.step is entry[1] and not rt._prepared
    out = ex.step({})
    np.testing.assert_allclose(out.result, np.exp(a + a), rtol=1e-6)
