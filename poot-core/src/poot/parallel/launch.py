"""Start the ranks of a tensor-parallel run: `launch(ranks, backend, fn, *args)` calls
`fn(*args, rank=r, group=group)` on every rank.

The backend makes the group (`Backend.tensor_parallel_group`): on CUDA one process per GPU
(rank 0 is this process, ranks 1.. are spawned; the group, picklable, carries NCCL's unique
id to them), on the reference backend threads of this process. The processes inherit this
process's environment, with NVLink multicast kept off (NCCL_NVLS_ENABLE=0) for all of them.
"""
from __future__ import annotations

import multiprocessing
import os
import threading

from poot.errors import PootError

#: the environment every rank process starts with
RANK_ENV = {"NCCL_NVLS_ENABLE": "0"}


def launch(ranks: int, backend: str | None, fn, *args) -> int:
    """Run `fn` on every rank; the largest exit code (rank 0's result where all are 0)."""
    from poot.parallel.local import run_ranks
    from poot.plugin import select_backend

    os.environ.update(RANK_ENV)
    b, _ = select_backend(backend)
    group = b.tensor_parallel_group(ranks)
    if not group.processes:
        codes = run_ranks(group, [lambda r=r: fn(*args, rank=r, group=group)
                                  for r in range(ranks)])
        return max(codes)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(fn, args, r, group), name=f"poot-rank{r}")
             for r in range(1, ranks)]
    for p in procs:
        p.start()
    done = threading.Event()
    threading.Thread(target=_watch, args=(procs, done), daemon=True).start()
    try:
        code = fn(*args, rank=0, group=group)
    finally:
        done.set()
        for p in procs:
            p.join()
    failed = [p.name for p in procs if p.exitcode]
    if failed:
        raise PootError(f"tensor-parallel ranks {', '.join(failed)} failed (exit codes "
                        f"{[p.exitcode for p in procs if p.exitcode]})")
    return code


def _watch(procs, done: threading.Event) -> None:
    """A rank that dies leaves the others waiting in a collective for ever: end this process
    (rank 0) then, saying which rank failed."""
    import sys

    while not done.wait(0.5):
        for p in procs:
            if p.exitcode not in (None, 0):
                print(f"[poot] tensor-parallel {p.name} failed (exit code {p.exitcode}); "
                      f"stopping", file=sys.stderr, flush=True)
                for q in procs:
                    if q.exitcode is None:
                        q.terminate()
                os._exit(1)


def _rank_main(fn, args, rank, group) -> None:
    raise SystemExit(fn(*args, rank=rank, group=group))
