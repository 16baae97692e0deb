"""SmolLM2-135M on the reference backend: prefill and decode tokens/s, peak memory.

Prints, from one run on this machine:
- prefill tokens/s (one 32-token chunk) and decode tokens/s (greedy, dense KV);
- the peer measured in the same run: a plain numpy decode step's floor, i.e. one
  matrix-vector product per weight matrix on the same decoded f32 weights (what any
  numpy implementation must at least do), and the machine's copy bandwidth;
- peak resident memory.

    python poot-core/benchmarks/smollm2_reference.py [--tokens 32]
"""
from __future__ import annotations

import argparse
import resource
import time

import numpy as np


def copy_bandwidth(nbytes: int = 256 << 20) -> float:
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best  # read + write


def gemv_floor(model) -> tuple[float, int]:
    """Seconds for one GEMV per projection and the LM head on f32 weights (best of 3)."""
    from poot.runtime.blas import single_thread

    mats = []
    for name, info in model.weights.infos.items():
        if len(info.shape) == 2 and (name.endswith(".weight") and "norm" not in name):
            mats.append(np.ascontiguousarray(info.dequantize()))
    x = {m.shape[1]: np.random.default_rng(0).standard_normal(m.shape[1]).astype(np.float32)
         for m in mats}
    best = float("inf")
    with single_thread():
        for _ in range(3):
            t0 = time.perf_counter()
            for m in mats:
                m @ x[m.shape[1]]
            best = min(best, time.perf_counter() - t0)
    return best, sum(m.nbytes for m in mats)


def main() -> None:
    import poot

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    t0 = time.perf_counter()
    model = poot.load("smollm2", backend="reference", max_seq=256)
    session = model.session()
    prompt = model.tokenize("The capital of France is a city that")
    model.prepare(session, len(prompt))
    setup = time.perf_counter() - t0
    list(model.generate(prompt, max_tokens=args.tokens))
    s = model.stats
    floor_s, weight_bytes = gemv_floor(model)
    bw = copy_bandwidth()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"setup (open, compile, plan, decode weights once): {setup:.2f} s")
    print(f"prefill: {s.prompt_tokens} tokens at {s.prefill_tps:.1f} tok/s")
    print(f"decode:  {s.generated_tokens} tokens at {s.decode_tps:.1f} tok/s "
          f"({1e3 / s.decode_tps:.1f} ms/step)")
    print(f"peer, numpy GEMV floor on the same f32 weights ({weight_bytes / 2**20:.0f} MiB): "
          f"{floor_s * 1e3:.1f} ms/step = {1 / floor_s:.1f} tok/s; poot reaches "
          f"{(1 / s.decode_tps) and floor_s * s.decode_tps:.0%} of it")
    print(f"copy bandwidth {bw / 1e9:.1f} GB/s: weight streaming bound "
          f"{weight_bytes / bw * 1e3:.1f} ms/step")
    print(f"peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
