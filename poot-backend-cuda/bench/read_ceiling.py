"""How fast can a kernel only read a decode step's weight matrices? (issue 16)

The ceilings the GEMVs are held to: each kernel here reads a [rows, row_words] uint32
matrix (the bytes of an 8B-shaped Q4_0 or bf16 weight) and folds the words into one
value, with the GEMV's partition (a warp per `width` rows, `trip` loads per lane and row
in flight, 4- or 16-byte loads) or a flat grid-stride walk. Timed as CUDA graphs of 32
launches, each over a distinct copy of the matrix (more bytes than L2 holds), so a launch
costs what it costs inside a recorded step: per launch = graph time / 32, the gaps
between kernels included. Occupancy is set by dynamic shared memory (blocks per SM).

    python read_ceiling.py            # on a GPU, with CuPy
"""
from __future__ import annotations

import argparse

import cupy as cp

SOURCE = r"""
template <int VEC>
__device__ __forceinline__ void load(const unsigned* p, int i, unsigned* v) {
  if (VEC == 4) {
    uint4 x = reinterpret_cast<const uint4*>(p)[i];
    v[0] = x.x; v[VEC > 1 ? 1 : 0] = x.y; v[VEC > 2 ? 2 : 0] = x.z; v[VEC > 3 ? 3 : 0] = x.w;
  } else if (VEC == 2) {
    uint2 x = reinterpret_cast<const uint2*>(p)[i];
    v[0] = x.x; v[VEC > 1 ? 1 : 0] = x.y;
  } else {
    v[0] = p[i];
  }
}

// A warp per WIDTH rows; per trip TRIP loads of VEC words per lane and row, the next
// trip's loads issued before this one's words are used (loop-carried registers, as the
// GEMV schedules hold them: one trip in flight while the lanes compute).
template <int WIDTH, int TRIP, int VEC>
__device__ void rows(const unsigned* __restrict__ w, unsigned* out, int nrows, int row_words) {
  int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  unsigned acc = 0;
  int units = row_words / VEC;                    // loads of VEC words per row
  const unsigned* p[WIDTH];
#pragma unroll
  for (int t = 0; t < WIDTH; t++) p[t] = w + (size_t)min(warp * WIDTH + t, nrows - 1) * row_words;
  unsigned v[WIDTH][TRIP][VEC], n[WIDTH][TRIP][VEC];
#pragma unroll
  for (int t = 0; t < WIDTH; t++)
#pragma unroll
    for (int u = 0; u < TRIP; u++) load<VEC>(p[t], min(lane + 32 * u, units - 1), v[t][u]);
  for (int k = lane; k < units; k += 32 * TRIP) {
    int next = k + 32 * TRIP;
    if (next - lane < units) {
#pragma unroll
      for (int t = 0; t < WIDTH; t++)
#pragma unroll
        for (int u = 0; u < TRIP; u++) load<VEC>(p[t], min(next + 32 * u, units - 1), n[t][u]);
    }
#pragma unroll
    for (int t = 0; t < WIDTH; t++)
#pragma unroll
      for (int u = 0; u < TRIP; u++)
#pragma unroll
        for (int e = 0; e < VEC; e++) {
          acc = acc * 3u + v[t][u][e];
          v[t][u][e] = n[t][u][e];
        }
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;   // never true for these data: no store
}

template <int VEC>
__device__ void flat(const unsigned* __restrict__ w, unsigned* out, size_t words) {
  unsigned acc = 0;
  size_t units = words / VEC, stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < units; i += 4 * stride) {
    unsigned v[4][VEC];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      size_t j = min(i + u * stride, units - 1);
      if (VEC == 4) {
        uint4 x = reinterpret_cast<const uint4*>(w)[j];
        v[u][0] = x.x; v[u][VEC > 1 ? 1 : 0] = x.y; v[u][VEC > 2 ? 2 : 0] = x.z;
        v[u][VEC > 3 ? 3 : 0] = x.w;
      } else {
        v[u][0] = w[j];
      }
    }
    asm volatile("" ::: "memory");
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
      for (int e = 0; e < VEC; e++) acc = acc * 3u + v[u][e];
  }
  if (acc == 0x9E3779B9u) out[blockIdx.x] = acc;
}

#define ROWS(W, T, V) extern "C" __global__ void rows_##W##_##T##_##V( \
    const unsigned* w, unsigned* out, int n, int rw) { \
  extern __shared__ unsigned pad[]; rows<W, T, V>(w, out, n, rw); }
ROWS(1, 9, 1) ROWS(2, 9, 1) ROWS(2, 18, 1) ROWS(1, 18, 1) ROWS(4, 9, 1)
ROWS(1, 5, 4) ROWS(2, 5, 4) ROWS(4, 5, 4) ROWS(2, 3, 4) ROWS(1, 2, 4) ROWS(1, 4, 4)
ROWS(1, 8, 1) ROWS(1, 16, 1) ROWS(2, 4, 4) ROWS(1, 8, 4)
extern "C" __global__ void flat_1(const unsigned* w, unsigned* out, unsigned long long n) {
  extern __shared__ unsigned pad[]; flat<1>(w, out, n); }
extern "C" __global__ void flat_4(const unsigned* w, unsigned* out, unsigned long long n) {
  extern __shared__ unsigned pad[]; flat<4>(w, out, n); }
"""

# name -> (rows, row words): the 8B step's matrices (Q4_0: 18 bytes per 32 weights)
SHAPES = {
    "q4 gate 14336x4096": (14336, 4096 // 32 * 18 // 4),
    "q4 qkv 6144x4096": (6144, 4096 // 32 * 18 // 4),
    "q4 O 4096x4096": (4096, 4096 // 32 * 18 // 4),
    "q4 down 4096x14336": (4096, 14336 // 32 * 18 // 4),
    "bf16 gate 14336x4096": (14336, 4096 // 2),
    "bf16 qkv 6144x4096": (6144, 4096 // 2),
    "bf16 down 4096x14336": (4096, 14336 // 2),
}
LAUNCHES = 32


def per_launch_us(kernel, grid, block, smem, mats, extra) -> float:
    """Median over 5 replays of a graph of LAUNCHES launches over distinct matrices."""
    stream = cp.cuda.Stream(non_blocking=True)
    out = cp.zeros(max(grid, 1), cp.uint32)
    with stream:
        stream.begin_capture()
        for i in range(LAUNCHES):
            kernel((grid,), (block,), (mats[i % len(mats)], out, *extra), shared_mem=smem)
        graph = stream.end_capture()
        graph.upload(stream)
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(5):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            graph.launch(stream)
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / LAUNCHES)
    return sorted(times)[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    smem_per_sm = dev.attributes["MaxSharedMemoryPerMultiprocessor"]
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90"))
    print(f"device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, "
          f"{sms} SMs, {smem_per_sm // 1024} KiB shared per SM")

    # the ceiling: a flat 16-byte read of 1 GiB (one launch, no gap to amortize)
    big = cp.random.randint(0, 2**31, size=(1 << 28,), dtype=cp.uint32)
    flat4 = mod.get_function("flat_4")
    us = per_launch_us(flat4, sms * 8, 256, 0, [big], (cp.uint64(big.size),))
    ceiling = big.nbytes / us / 1e3
    print(f"ceiling: flat 16-byte read of 1 GiB: {us:.1f} us, {ceiling:.0f} GB/s")
    del big

    def blocks_smem(per_sm: int | None) -> int:
        return 0 if per_sm is None else smem_per_sm // per_sm - 1024 - 1024

    variants = [  # (kernel, block, blocks per SM or None: no limit)
        ("rows_2_9_1", 256, 4), ("rows_2_9_1", 256, None), ("rows_2_18_1", 256, 4),
        ("rows_1_9_1", 256, 4), ("rows_1_18_1", 256, None), ("rows_4_9_1", 256, 4),
        ("rows_1_8_1", 256, None), ("rows_1_16_1", 256, None),
        ("rows_2_5_4", 256, 4), ("rows_2_5_4", 256, None), ("rows_1_5_4", 256, None),
        ("rows_4_5_4", 256, 4), ("rows_2_3_4", 256, None), ("rows_1_2_4", 256, None),
        ("rows_1_4_4", 256, None), ("rows_2_4_4", 256, None), ("rows_1_8_4", 256, None),
        ("flat_1", 256, None), ("flat_4", 256, None),
    ]
    for name in args.shapes.split(","):
        nrows, row_words = SHAPES[name]
        words = nrows * row_words
        copies = max(3, -(-(200 << 20) // (4 * words)))     # > 200 MB: past the L2
        mats = [cp.random.randint(0, 2**31, size=(words,), dtype=cp.uint32)
                for _ in range(copies)]
        print(f"== {name}: {4 * words / 1e6:.1f} MB, row {4 * row_words} bytes, "
              f"{copies} copies")
        best = None
        for kname, block, per_sm in variants:
            kernel = mod.get_function(kname)
            smem = blocks_smem(per_sm)
            if smem > 48 * 1024:
                kernel.max_dynamic_shared_size_bytes = smem
            if kname.startswith("flat"):
                grid, extra = sms * 8, (cp.uint64(words),)
            else:
                width, trip, vec = (int(x) for x in kname.split("_")[1:])
                if row_words % vec:
                    continue
                grid = -(-nrows // (width * block // 32))
                extra = (cp.int32(nrows), cp.int32(row_words))
            us = per_launch_us(kernel, grid, block, smem, mats, extra)
            gbs = 4 * words / us / 1e3
            best = max(best or 0, gbs)
            limit = f"{per_sm}/SM" if per_sm else "any"
            print(f"  {kname:12s} grid {grid:6d} {limit:5s} {us:8.2f} us {gbs:7.0f} GB/s "
                  f"{100 * gbs / ceiling:5.1f}% of ceiling")
        print(f"SUMMARY read ceiling {name} | best {best:.0f} GB/s = "
              f"{100 * best / ceiling:.1f}% of the 1 GiB read ({ceiling:.0f} GB/s)")
        del mats
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
