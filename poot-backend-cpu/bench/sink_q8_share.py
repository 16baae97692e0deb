"""What a q8_0 KV cache's dequantization costs a gpt-oss decode step on the cpu backend:
SinkAttention has no q8_0 form, so each step dequantizes every layer's whole cache to f32
before attending. A random-weight gpt-oss folder (tests/test_gpt_oss.py's, its attention
widened by the flags) decodes after a long prompt; step_profile's Profiler sums each
call's time by kind, once per KV dtype.

    python poot-backend-cpu/bench/sink_q8_share.py [--context 1024] [--heads 8] [--kv 2]
        [--head-dim 64] [--window 128] [--steps 32]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from step_profile import Profiler  # noqa: E402


def folder(root, args):
    import test_gpt_oss as g

    g.HEADS, g.KV, g.HEAD_DIM, g.WINDOW = args.heads, args.kv, args.head_dim, args.window
    g.ORIGINAL = args.context // 4
    path, _, _ = g.make_folder(pathlib.Path(root))
    return path


def profile(path, kv_dtype: str, args) -> None:
    import numpy as np
    import poot

    model = poot.load(str(path), backend="cpu", max_seq=args.context, kv_dtype=kv_dtype)
    ids = np.random.default_rng(0).integers(3, 250, args.context - args.steps - 8).tolist()
    session = model.session()
    session.open("w")
    session.prefill("w", ids[:8])
    session.decode({"w": 5})
    key = next(k for k in session.executors if k[0] == 1)
    ex = session.executors[key]
    prof = Profiler(ex)
    t0 = time.perf_counter()
    session.close("w")
    session.open("a")
    session.prefill("a", ids)
    for _ in range(args.steps):       # a fixed token: the weights are random
        session.decode({"a": 5})
    wall = time.perf_counter() - t0
    rows = prof.table(ex.plan)
    total = sum(t for _, t, _ in rows)
    print(f"## kv {kv_dtype}: {prof.runs} decode steps after {len(ids)} prompt tokens, "
          f"{prof.wall / prof.runs * 1e3:.2f} ms a step ({wall:.1f} s with the prefill)")
    for k, t, n in rows[:8]:
        print(f"  {k:40s} {t / prof.runs * 1e3:8.3f} ms  {100 * t / total:5.1f}%  ({n} calls)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--kv-dtypes", default="f16,q8_0")
    args = ap.parse_args()
    print(f"# {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; gpt-oss random: dim 64, "
          f"{args.heads} q heads, {args.kv} kv heads, head dim {args.head_dim}, 3 layers "
          f"(sliding {args.window}, full, sliding), context {args.context}")
    with tempfile.TemporaryDirectory() as root:
        path = folder(root, args)
        for kv in args.kv_dtypes.split(","):
            profile(path, kv, args)


if __name__ == "__main__":
    main()
