"""Tensor parallelism on CUDA through NCCL (issue 19): the collectives' conformance and the
decode benchmark over N GPUs, one process per GPU (poot.parallel.launch).

    python tp_check.py collectives --ranks N   # AllReduce/AllGather between two kernels
                                               # of a recorded step, f32/bf16/f16, N GPUs
    python tp_check.py bench --ranks N --shape 8b|smollm2 [--steps 48]
                                               # decode tok/s of one step sharded over N
                                               # GPUs, and its collectives' time per step

`collectives` with --ranks 1 checks a one-rank NCCL communicator inside a recorded CUDA
graph (a single H200 can run it). Each rank makes every rank's input from the rank's seed,
so each checks its result against the numpy sum or concatenation of all of them. The step
runs three times: unrecorded first (NCCL sets up its connections on its first calls), then
recorded into a CUDA graph (the collective captured between the kernels before and after
it), then replayed; every run must be right, and the executable must say it recorded.
Lines starting with "SUMMARY " are what tp_session.sh collects.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

F32, BF16, F16 = "f32", "bf16", "f16"
SHAPES = ((3, 5), (1, 576), (7, 4096))


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


def rank_input(rank: int, shape, dtype):
    from poot.dtypes import DType

    rng = np.random.default_rng(1000 + rank)
    return rng.standard_normal(shape).astype(DType.parse(dtype).numpy)


def case_graph(kind: str, dtype: str, shape, ranks: int):
    """x * 2 -> the collective -> + 1: the collective between two kernels of one step."""
    from poot.ir import ops as O
    from poot.ir.builder import Builder
    from poot.ir.graph import Lit
    from poot.ir.types import TensorType

    b = Builder(f"{kind}-{dtype}-{'x'.join(map(str, shape))}", compiler=True)
    x = b.const(TensorType(shape, dtype), "x")
    y = b.eqn(O.Binary(O.BinaryOp.Mul), x, Lit(2.0, dtype))
    op = O.AllReduce(ranks) if kind == "AllReduce" else O.AllGather(ranks, 0)
    b.result(b.eqn(O.Binary(O.BinaryOp.Add), b.eqn(op, y), Lit(1.0, dtype)))
    return b.finish()


def expected(kind: str, dtype: str, shape, ranks: int) -> np.ndarray:
    from poot.dtypes import DType

    parts = [rank_input(r, shape, dtype).astype(np.float64) * 2 for r in range(ranks)]
    whole = np.sum(parts, axis=0) if kind == "AllReduce" else np.concatenate(parts, axis=0)
    return (whole.astype(DType.parse(dtype).numpy).astype(np.float64) + 1)


def collectives(rank: int = 0, group=None) -> int:
    import poot
    from poot.parallel.model import rank_device
    from poot.plan import plan
    from poot.plugin import get_backend
    from poot.runtime.executor import Executor

    backend = get_backend("cuda")
    device = rank_device(backend, group, rank)
    comm = group.member(rank, device)
    rt = backend.runtime(device)
    rt.communicator = comm
    failed = 0
    cases = 0
    for kind in ("AllReduce", "AllGather"):
        for dtype in (F32, BF16, F16):
            for shape in SHAPES:
                g = case_graph(kind, dtype, shape, group.ranks)
                compiled = poot.compile(g, (backend, device), communicator=comm)
                ex = Executor(plan(compiled, (backend, device)),
                              {"x": rank_input(rank, shape, dtype)}, runtime=rt)
                want = expected(kind, dtype, shape, group.ranks)
                tol = 1e-5 if dtype == F32 else 1e-2   # of the largest magnitude
                for run in ("unrecorded (NCCL's first calls)", "recorded", "replayed"):
                    got = ex.step({}).result.astype(np.float64)
                    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                    ok = got.shape == want.shape and err <= tol and \
                        ex.executable.recorded == (run != "unrecorded (NCCL's first calls)")
                    cases += 1
                    if not ok:
                        failed += 1
                        print(f"rank {rank}: FAILED {g.name} ({run}): error {err:.3g}, "
                              f"recorded {ex.executable.recorded}", flush=True)
    if rank == 0:
        summary(f"collectives conformance, {group.ranks} rank(s), NCCL in a recorded step",
                f"{cases - failed}/{cases} passed on rank 0")
    return 1 if failed else 0


# -- the decode benchmark ---------------------------------------------------------------
def shape_config(shape: str):
    from poot.models.llama import LlamaConfig

    if shape == "8b":   # Llama 3 8B's shape
        return LlamaConfig(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8,
                           head_dim=128, ffn=14336, rope_base=500000.0, max_seq=1024,
                           tied=False)
    return LlamaConfig(vocab=49152, dim=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                       ffn=1536, rope_base=100000.0, max_seq=1024)


def tiled_weights(config, seed: int = 0):
    """Random bf16 weights of the GGUF names, each matrix a distinct random block of 64 rows
    tiled to full height (a full 8B of normal samples takes numpy minutes)."""
    import ml_dtypes
    from poot.models.llama import ArrayWeights

    rng = np.random.default_rng(seed)
    w = ArrayWeights(f"tiled-{seed}")
    bf16 = ml_dtypes.bfloat16

    def mat(name, n, k, scale=None):
        block = (rng.standard_normal((64, k)) * (scale or k ** -0.5)).astype(bf16)
        w.add_dense(name, np.tile(block, (-(-n // 64), 1))[:n])

    def norm(name, d):
        w.add_dense(name, (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))

    c = config
    mat("token_embd.weight", c.vocab, c.dim, 1.0)
    qd, kd = c.heads * c.head_dim, c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", c.dim)
        norm(p + "ffn_norm.weight", c.dim)
        for name, n, k in (("attn_q", qd, c.dim), ("attn_k", kd, c.dim), ("attn_v", kd, c.dim),
                           ("attn_output", c.dim, qd), ("ffn_gate", c.ffn, c.dim),
                           ("ffn_up", c.ffn, c.dim), ("ffn_down", c.dim, c.ffn)):
            mat(p + name + ".weight", n, k)
    norm("output_norm.weight", c.dim)
    if not c.tied:
        mat("output.weight", c.vocab, c.dim)
    return w


def bench(shape: str, steps: int, rank: int = 0, group=None) -> int:
    import poot
    from poot.models.llama import build_decoder, const_inputs
    from poot.parallel import shard_step
    from poot.parallel.model import rank_device
    from poot.plan import plan
    from poot.plugin import get_backend
    from poot.runtime.executor import Executor

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_gpu import Timer

    backend = get_backend("cuda")
    device = rank_device(backend, group, rank)
    ranks = group.ranks if group is not None else 1
    comm = group.member(rank, device) if group is not None else None
    rt = backend.runtime(device)
    rt.communicator = comm
    config = shape_config(shape)
    t0 = time.time()
    w = tiled_weights(config)
    step = build_decoder(config, w, tokens=1, kv="dense", stack_qkv=False, stack_ffn=False)
    consts = const_inputs(step, w)
    graph = step.graph
    if ranks > 1:
        (rg,) = shard_step(step, ranks, only=rank)
        graph, consts = rg.graph, rg.consts(consts)
    compiled = poot.compile(graph, (backend, device), communicator=comm)
    p = plan(compiled, (backend, device))
    ex = Executor(p, consts, runtime=rt)
    built = time.time() - t0
    times = []
    for pos in range(steps):
        t = time.perf_counter()
        ex.step({"tokens": np.array([pos % config.vocab], np.int32),
                 "pos": np.array([pos], np.int32)})
        times.append(time.perf_counter() - t)
    ms = statistics.median(times[4:]) * 1e3
    coll = [s for s in p.steps if s.lowering.extra.get("collective")]
    coll_ms = collectives_ms(rt, comm, coll, Timer(rt.ctx)) if coll else 0.0
    if rank == 0:
        tag = f"{shape}-shape decode, bf16, {ranks} GPU(s)"
        summary(tag, f"{1e3 / ms:.1f} tok/s ({ms:.3f} ms/step, {len(p.steps)} steps planned, "
                     f"built in {built:.0f} s)")
        if coll:
            summary(f"{tag}: {len(coll)} collectives per step",
                    f"{coll_ms * 1e3:.1f} us per step ({coll_ms / ms * 100:.1f}% of the step)")
    return 0


def collectives_ms(rt, comm, steps, timer) -> float:
    """Device time of one step's collectives alone: the same calls, sizes and order,
    captured into one graph over scratch buffers."""
    nbytes = max(s.out.type.nbytes for s in steps)
    src, dst = rt.alloc(nbytes, "tp:src"), rt.alloc(nbytes, "tp:dst")

    def enqueue():
        for s in steps:
            t = s.inputs[0].type
            count = int(np.prod(t.shape))
            run = comm.all_reduce if s.eqn.op.name == "AllReduce" else comm.all_gather
            run(src.ptr, dst.ptr, count, t.dtype, rt.ctx.stream)
    return timer.graph_ms(enqueue, reps=4, trials=5)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("collectives", "bench"))
    ap.add_argument("--ranks", type=int, default=0, help="GPUs (default: every one)")
    ap.add_argument("--shape", choices=("8b", "smollm2"), default="8b")
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    from poot.parallel.launch import launch
    from poot.plugin import get_backend

    ranks = args.ranks or len(get_backend("cuda").probe())
    if args.what == "collectives":
        return launch(ranks, "cuda", collectives)
    if ranks == 1:
        return bench(args.shape, args.steps)
    return launch(ranks, "cuda", bench, args.shape, args.steps)


if __name__ == "__main__":
    raise SystemExit(main())
