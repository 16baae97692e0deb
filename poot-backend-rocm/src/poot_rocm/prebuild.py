"""Build every kernel the conformance suite plans for a target, in a few large hiprtc
units, before the suite runs: `poot conformance rocm` plans case by case, one unit per
case (about a second each for hiprtc's fixed cost), and then finds them all cached.

    python3 -m poot_rocm.prebuild            # the first ROCm device's target
    python3 -m poot_rocm.prebuild gfx90a     # a named target, no device needed
"""
from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    from poot.conformance.compile_only import plan_cases

    from poot_rocm import compiler
    from poot_rocm.backend import RocmBackend

    args = sys.argv[1:] if argv is None else argv
    backend = RocmBackend()
    if args:
        device = backend.compile_only_device(args[0])
    else:
        devices = backend.probe()
        if not devices:
            print(f"{backend.unavailable_reason()}; name a target (e.g. gfx90a)",
                  file=sys.stderr)
            return 2
        device = devices[0]
    t0 = time.perf_counter()
    with compiler.batch():
        out = plan_cases(backend, device, compiler.CompileError)
    print(f"{device} ({backend.target(device)}): {out.cases} cases, {len(out.plans)} planned, "
          f"{out.refused} refused, built in {time.perf_counter() - t0:.1f} s")
    for p in out.problems:
        print(f"  {p}", file=sys.stderr)
    return 1 if out.problems else 0


if __name__ == "__main__":
    sys.exit(main())
