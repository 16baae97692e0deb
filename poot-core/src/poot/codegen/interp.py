"""A numpy interpreter of kernel programs: their meaning without a GPU.

All threads of a batch of workgroups run in lockstep, one statement at a time,
vectorized over the threads; branches and loops narrow the set of active
threads. Lockstep is a legal schedule for every barrier-correct program, and
the interpreter checks the rules that make it so instead of trusting them:

* a Barrier or CoopReduce must be reached by every thread of a workgroup;
* a thread may not read a shared element another thread wrote since the last
  barrier, nor write one another thread wrote (shared-memory races);
* two threads may not store to the same element in one statement;
* a shared element an async copy writes may not be read until its thread's
  CopyWait has covered the copy's committed batch (copies land at once, but
  stay "pending" until then, as they may on the device);
* every load and store must be inside its array.

A broken rule raises `KernelFault` naming the kernel. Arithmetic goes through
`poot.codegen.expr.evaluate`, i.e. the oracle's own scalar rules.

`subgroup` is the target's subgroup (warp, wavefront) width, 32 or 64. A
CoopReduce folds in the order the C-style printers print it for that width: an
xor butterfly within aligned runs of min(width, subgroup) lanes, then one
subgroup partial after another (a whole workgroup not made of whole subgroups
folds thread by thread), so F32 sums round as they do on the device. MmaTile
is defined for 32-lane warps only.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from poot.codegen.expr import Load, evaluate
from poot.codegen.program import (
    BUILTINS,
    OUT,
    TENSOR_ASYNC,
    Assign,
    AwaitInputs,
    Barrier,
    BufferParam,
    CoopReduce,
    CoopReduceScatter,
    CopyAsync,
    CopyCommit,
    CopyWait,
    For,
    GroupBarrier,
    If,
    Kernel,
    KernelProgram,
    Let,
    LoadWide,
    LocalArray,
    MmaTile,
    Stmt,
    Store,
    StoreWide,
    scatter_order,
)
from poot.errors import PootError
from poot.ir.ops.reduce import ReduceOp
from poot.ir.types import TensorType


class KernelFault(PootError):
    """A kernel program broke a rule of the execution model (race, bounds, divergence)."""

SUBGROUP = 32   # simulated subgroup width unless a target names its own


def run(kernel: Kernel, buffers: Mapping[str, np.ndarray], max_threads: int = 1 << 16,
        subgroup: int = SUBGROUP) -> None:
    """Execute `kernel` over its whole grid on a target of `subgroup`-lane subgroups.
    `buffers` maps each buffer parameter to a 1-D numpy array of its dtype and count;
    written buffers are updated in place."""
    if subgroup < 1 or subgroup & (subgroup - 1):
        raise KernelFault(f"kernel {kernel.name}: subgroup width {subgroup} is not a power "
                          "of two")
    for b in kernel.buffers:
        arr = buffers.get(b.name)
        if arr is None:
            raise KernelFault(f"kernel {kernel.name}: no array bound to buffer {b.name!r}")
        if arr.ndim != 1 or arr.size != b.count or arr.dtype != b.dtype.numpy:
            raise KernelFault(f"kernel {kernel.name}: buffer {b.name!r} wants {b.count} x "
                              f"{b.dtype}, got {arr.shape} {arr.dtype}")
    tpg = kernel.threads_per_group
    per_batch = max(1, max_threads // tpg)
    for first in range(0, kernel.groups, per_batch):
        _Batch(kernel, buffers, first, min(per_batch, kernel.groups - first), subgroup).run()


class _Env(Mapping):
    """Variables seen by the active threads (indexed lazily)."""

    def __init__(self, vars_: dict[str, np.ndarray], act: np.ndarray):
        self.vars, self.act = vars_, act

    def __getitem__(self, name):
        return self.vars[name][self.act]

    def __iter__(self):
        return iter(self.vars)

    def __len__(self):
        return len(self.vars)


class _Batch:
    def __init__(self, kernel: Kernel, buffers, first_group: int, n_groups: int,
                 subgroup: int = SUBGROUP):
        self.k, self.buffers, self.subgroup = kernel, buffers, subgroup
        self.tpg = kernel.threads_per_group
        self.n_groups = n_groups
        t = np.arange(n_groups * self.tpg, dtype=np.int64)
        self.group = t // self.tpg                      # group index within the batch
        self.lane = t % self.tpg                        # local_index
        self.vars: dict[str, np.ndarray] = self._builtins(first_group)
        self.shared = {a.name: np.zeros((n_groups, a.count), a.dtype.numpy)
                       for a in kernel.shared}
        self.writer = {a.name: np.full((n_groups, a.count), -1, np.int64)
                       for a in kernel.shared}
        # async copies not yet waited for: the copying thread and its batch, per element
        self.pending = {a.name: np.full((n_groups, a.count), -1, np.int64)
                        for a in kernel.shared}
        self.pending_batch = {a.name: np.zeros((n_groups, a.count), np.int64)
                              for a in kernel.shared}
        self.batches = np.zeros(t.size, np.int64)     # each thread's committed batches
        self.locals = {a.name: np.zeros((t.size, a.count), a.dtype.numpy)
                       for a in kernel.locals}
        self.arrays = kernel.arrays()

    def _builtins(self, first_group: int) -> dict[str, np.ndarray]:
        wx, wy, wz = self.k.workgroup3()
        gx, gy, _ = self.k.grid3()
        g = self.group + first_group
        lid = (self.lane % wx, self.lane // wx % wy, self.lane // (wx * wy))
        gid = (g % gx, g // gx % gy, g // (gx * gy))
        out = {}
        for name, (kind, axis) in BUILTINS.items():
            size = (wx, wy, wz)[axis]
            v = {"local": lid[axis], "group": gid[axis], "index": self.lane,
                 "global": gid[axis] * size + lid[axis]}[kind]
            out[name] = v.astype(np.int32)
        return out

    def fault(self, msg: str):
        raise KernelFault(f"kernel {self.k.name}: {msg}")

    def run(self):
        self.block(self.k.body, np.arange(self.group.size))

    # -- expressions ---------------------------------------------------------------
    def ev(self, e, act: np.ndarray) -> np.ndarray:
        r = evaluate(e, _Env(self.vars, act), {}, load=lambda n, idx: self.load(n, idx, act))
        return np.broadcast_to(np.asarray(r), act.shape)

    def bounds(self, name: str, idx: np.ndarray, count: int, what: str):
        if idx.size and (idx.min() < 0 or idx.max() >= count):
            self.fault(f"{what} {name!r} index out of range [{idx.min()}, {idx.max()}] "
                       f"of {count}")

    def load(self, n: Load, idx: np.ndarray, act: np.ndarray) -> np.ndarray:
        idx = np.broadcast_to(idx, act.shape)
        arr = self.arrays[n.buffer]
        self.bounds(n.buffer, idx, arr.count, "load from")
        if isinstance(arr, BufferParam):
            return self.buffers[n.buffer][idx]
        if isinstance(arr, LocalArray):
            return self.locals[n.buffer][act, idx]
        g, lane = self.group[act], self.lane[act]
        w = self.writer[n.buffer][g, idx]
        if np.any((w != -1) & (w != lane)):
            self.fault(f"shared {n.buffer!r} read of an element another thread wrote "
                       "since the last barrier (missing Barrier)")
        self.check_landed(n.buffer, g, idx)
        return self.shared[n.buffer][g, idx]

    def check_landed(self, name: str, g, idx):
        if np.any(self.pending[name][g, idx] != -1):
            self.fault(f"shared {name!r} read of an element whose async copy no CopyWait "
                       "has covered yet")

    # -- statements ------------------------------------------------------------------
    def block(self, body: tuple[Stmt, ...], act: np.ndarray):
        for s in body:
            if act.size:
                self.stmt(s, act)

    def set_var(self, name: str, dtype, value: np.ndarray, act: np.ndarray):
        arr = self.vars.get(name)
        if arr is None:
            arr = self.vars[name] = np.zeros(self.group.size, dtype.numpy)
        arr[act] = value

    def stmt(self, s: Stmt, act: np.ndarray):
        if isinstance(s, Let):
            self.set_var(s.name, s.value.dtype, self.ev(s.value, act), act)
        elif isinstance(s, LoadWide):
            first = self.ev(s.load.index, act).astype(np.int64)
            if np.any(first % len(s.names)):
                self.fault(f"LoadWide from {s.load.buffer!r} at an index not a multiple of "
                           f"{len(s.names)} (misaligned)")
            for j, name in enumerate(s.names):
                self.set_var(name, s.load.dtype, self.load(s.load, first + j, act), act)
        elif isinstance(s, Assign):
            self.vars[s.name][act] = self.ev(s.value, act)
        elif isinstance(s, Store):
            self.store(s, act)
        elif isinstance(s, StoreWide):
            first = self.ev(s.index, act).astype(np.int64)
            if np.any(first % len(s.values)):
                self.fault(f"StoreWide to {s.array!r} at an index not a multiple of "
                           f"{len(s.values)} (misaligned)")
            for j, value in enumerate(s.values):
                self.store(Store(s.array, s.index + j, value), act)
        elif isinstance(s, If):
            c = self.ev(s.cond, act) != 0
            self.block(s.then, act[c])
            self.block(s.orelse, act[~c])
        elif isinstance(s, For):
            self.loop(s, act)
        elif isinstance(s, AwaitInputs):
            pass        # the interpreter runs one kernel at a time
        elif isinstance(s, Barrier):
            self.uniform(act, "Barrier")
            for w in self.writer.values():
                w.fill(-1)
        elif isinstance(s, GroupBarrier):
            self.group_barrier(s.width, act)
        elif isinstance(s, CoopReduce):
            self.coop_reduce(s, act)
        elif isinstance(s, CoopReduceScatter):
            self.reduce_scatter(s, act)
        elif isinstance(s, CopyAsync):
            self.copy_async(s, act)
        elif isinstance(s, CopyCommit):
            self.batches[act] += 1
        elif isinstance(s, CopyWait):
            self.copy_wait(s, act)
        elif isinstance(s, MmaTile):
            self.mma_tile(s, act)
        elif isinstance(s, TENSOR_ASYNC):
            self.fault(f"{type(s).__name__} (bulk tensor copies, warpgroup products) is not "
                       f"interpreted; only targets with the TMA and WGMMA features run it")
        else:  # pragma: no cover - validate() refuses unknown statements
            self.fault(f"unknown statement {s!r}")

    def store(self, s: Store, act: np.ndarray):
        idx = self.ev(s.index, act).astype(np.int64)
        val = self.ev(s.value, act)
        arr = self.arrays[s.array]
        self.bounds(s.array, idx, arr.count, "store to")
        if isinstance(arr, LocalArray):
            self.locals[s.array][act, idx] = val
            return
        key = idx if isinstance(arr, BufferParam) else self.group[act] * arr.count + idx
        if np.unique(key).size != key.size:
            self.fault(f"two threads store to one element of {s.array!r} in one statement")
        if isinstance(arr, BufferParam):
            self.buffers[s.array][idx] = val
            return
        g, lane = self.group[act], self.lane[act]
        w = self.writer[s.array][g, idx]
        if np.any((w != -1) & (w != lane)):
            self.fault(f"shared {s.array!r} written by two threads between barriers")
        self.shared[s.array][g, idx] = val
        self.writer[s.array][g, idx] = lane

    def loop(self, s: For, act: np.ndarray):
        start = self.ev(s.start, act).astype(np.int32)
        self.set_var(s.var, s.start.dtype, start, act)
        stop = np.zeros(self.group.size, np.int64)
        step = np.zeros(self.group.size, np.int64)
        stop[act] = self.ev(s.stop, act)
        step[act] = self.ev(s.step, act)
        if np.any(step[act] <= 0):
            self.fault(f"loop {s.var!r} has a non-positive step")
        counter = self.vars[s.var]
        cur = act[counter[act] < stop[act]]
        while cur.size:
            self.block(s.body, cur)
            counter[cur] += step[cur].astype(np.int32)
            cur = cur[counter[cur] < stop[cur]]

    def group_barrier(self, width: int, act: np.ndarray):
        """Every thread of each aligned group of `width` reaches it or none does; writes
        to shared arrays by the groups that did become visible to the rest of their group."""
        sets = self.tpg // width
        key = self.group[act] * sets + self.lane[act] // width
        counts = np.bincount(key, minlength=self.n_groups * sets).reshape(self.n_groups, sets)
        if np.any((counts != 0) & (counts != width)):
            self.fault(f"GroupBarrier reached by only part of a group of {width} threads")
        synced = counts == width
        rows = np.arange(self.n_groups)[:, None]
        for w in self.writer.values():
            written = w != -1
            w[written & synced[rows, np.where(written, w, 0) // width]] = -1

    def uniform(self, act: np.ndarray, what: str):
        counts = np.bincount(self.group[act], minlength=self.n_groups)
        if np.any((counts != 0) & (counts != self.tpg)):
            self.fault(f"{what} reached by only part of a workgroup (divergent control flow)")

    def coop_reduce(self, s: CoopReduce, act: np.ndarray):
        self.uniform(act, "CoopReduce")
        width = s.width or self.tpg
        vals = self.ev(s.value, act).astype(s.value.dtype.numpy)
        vals = vals.reshape(-1, width)                   # act is sorted: whole groups
        combine = np.add if s.op is ReduceOp.Sum else np.maximum
        with np.errstate(over="ignore", invalid="ignore"):
            if self.tpg % self.subgroup == 0:
                # butterfly within runs of `lanes`: every lane ends with the same value
                lanes = min(width, self.subgroup)
                runs = vals.reshape(-1, lanes)
                off = lanes // 2
                while off >= 1:
                    runs = combine(runs, runs[:, np.arange(lanes) ^ off])
                    off //= 2
                vals = runs[:, 0].reshape(-1, width // lanes)   # one partial per subgroup
            red = vals[:, 0]
            for j in range(1, vals.shape[1]):                   # partials in order
                red = combine(red, vals[:, j])
        self.set_var(s.name, s.value.dtype, np.repeat(red, width), act)

    def reduce_scatter(self, s: CoopReduceScatter, act: np.ndarray):
        """The printers' shuffles (program.scatter_order), one after another."""
        self.uniform(act, "CoopReduceScatter")
        if s.width > self.subgroup:
            self.fault(f"reduce-scatter over {s.width} threads, wider than the "
                       f"{self.subgroup}-lane subgroup")
        dt = s.values[0].dtype.numpy
        vals = np.stack([self.ev(v, act).astype(dt) for v in s.values])   # [V, threads]
        lane = self.lane[act] % s.width
        combine = np.add if s.op is ReduceOp.Sum else np.maximum
        with np.errstate(over="ignore", invalid="ignore"):
            for off, keep in scatter_order(len(vals), s.width):
                partner = np.arange(act.size) ^ off    # act: whole workgroups, in order
                if keep < len(vals):
                    up = (lane & off) != 0
                    lo, hi = vals[:keep], vals[keep:]
                    kept, sent = np.where(up, hi, lo), np.where(up, lo, hi)
                    vals = combine(kept, sent[:, partner])
                else:
                    vals = combine(vals, vals[:, partner])
        self.set_var(s.name, s.values[0].dtype, vals[0], act)

    # -- matrix-unit statements ------------------------------------------------------
    def copy_async(self, s: CopyAsync, act: np.ndarray):
        """16 bytes per active thread, recorded as that thread's writes (race rules)."""
        dst, src = self.arrays[s.dst], self.arrays[s.src]
        d_size, s_size = dst.dtype.itemsize, src.dtype.itemsize
        d_idx = self.ev(s.dst_index, act).astype(np.int64)
        s_idx = self.ev(s.src_index, act).astype(np.int64)
        valid = self.ev(s.valid, act) != 0
        if np.any((d_idx * d_size) % 16) or np.any((s_idx[valid] * s_size) % 16):
            self.fault(f"CopyAsync {s.src!r} -> {s.dst!r} is not 16-byte aligned")
        span = 16 // d_size
        for t in range(span):
            self.bounds(s.dst, d_idx + t, dst.count, "copy to")
        raw_src = self.buffers[s.src].view(np.uint8)
        for j, thread in enumerate(act):
            if valid[j]:
                b0 = s_idx[j] * s_size
                if b0 < 0 or b0 + 16 > raw_src.size:
                    self.fault(f"copy from {s.src!r} out of range at byte {b0}")
                chunk = raw_src[b0:b0 + 16]
            else:
                chunk = np.zeros(16, np.uint8)
            g, lane = self.group[thread], self.lane[thread]
            cells = slice(d_idx[j], d_idx[j] + span)
            w = self.writer[s.dst][g, cells]
            if np.any((w != -1) & (w != lane)):
                self.fault(f"shared {s.dst!r} written by two threads between barriers")
            self.shared[s.dst][g, cells] = chunk.view(dst.dtype.numpy)
            self.writer[s.dst][g, cells] = lane
            self.pending[s.dst][g, cells] = lane
            self.pending_batch[s.dst][g, cells] = self.batches[thread]

    def copy_wait(self, s: CopyWait, act: np.ndarray):
        """Each acting thread's copies in batches it committed before its last
        `s.pending` ones have landed (its open batch has not)."""
        acting = np.zeros(self.group.size, bool)
        acting[act] = True
        for name, owner in self.pending.items():
            g, cell = np.nonzero(owner != -1)
            if not g.size:
                continue
            thread = g * self.tpg + owner[g, cell]
            done = acting[thread] & (self.pending_batch[name][g, cell]
                                     < self.batches[thread] - s.pending)
            owner[g[done], cell[done]] = -1

    def mma_tile(self, s: MmaTile, act: np.ndarray):
        """The warp's product from shared words, written to its lanes' accumulators in
        the documented layout; operands must be warp-uniform and every lane present."""
        lanes, u = self.lane[act], s.unit
        n = u.lanes
        if self.subgroup != n:
            self.fault(f"MmaTile of {u.feature} is a {n}-lane statement; this target's "
                       f"subgroups have {self.subgroup} lanes")
        if act.size % n or np.any(lanes.reshape(-1, n) % n != np.arange(n)):
            self.fault("MmaTile reached by part of a lane group")
        half = np.dtype(s.dtype.numpy)
        for warp in act.reshape(-1, n):
            vals = [self.ev(e, warp) for e in (s.a_row, s.a_word, s.b_col, s.b_word)]
            if any(np.any(v != v[0]) for v in vals):
                self.fault("MmaTile operands differ across a warp")
            a_row, a_word, b_col, b_word = (int(v[0]) for v in vals)
            g = self.group[warp[0]]
            rows, cols = u.m * s.tiles_m, u.n * s.tiles_n
            a = self._halves(s.a, g, [a_row + r for r in range(rows)], s.a_pitch, a_word, u.k)
            if s.b_trans:
                b = self._halves(s.b, g, list(range(u.k)), s.b_pitch, 0, cols, b_word, b_col)
            else:
                b = self._halves(s.b, g, [b_col + c for c in range(cols)], s.b_pitch,
                                 b_word, u.k).T
            prod = (a.view(half).astype(np.float32) @ b.view(half).astype(np.float32))
            lane, i, j, r = np.ix_(range(n), range(s.tiles_m), range(s.tiles_n), range(4))
            row, col = u.coords(lane, r)
            vals = prod[u.m * i + row, u.n * j + col].reshape(n, -1)
            first = s.acc_first
            self.locals[s.acc][warp, first:first + vals.shape[1]] += vals

    def _halves(self, name, g, rows, pitch, word, count, row_word=0, first=0):
        """16-bit values [len(rows), count]: row r starts at word r * pitch + word
        (+ `row_word` words of row offset, then `first` values in)."""
        words = self.shared[name][g]
        out = np.empty((len(rows), count), np.uint16)
        for i, r in enumerate(rows):
            start = (r * pitch + word + row_word) * 2 + first
            idx = np.arange(start, start + count)
            self.bounds(name, idx // 2, words.size, "MmaTile read of")
            w = self.writer[name][g, idx // 2]
            if np.any(w != -1):
                self.fault(f"MmaTile reads {name!r} written since the last barrier")
            self.check_landed(name, g, idx // 2)
            out[i] = words.view(np.uint16)[idx]
        return out


__all__ = ["KernelFault", "run", "run_lowering", "operand_words"]


def operand_words(array: np.ndarray, buffer: BufferParam) -> np.ndarray:
    """An operand's bytes viewed as the buffer's element type (padded to whole words)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    size = buffer.dtype.itemsize
    pad = (-raw.size) % size
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    words = raw.view(buffer.dtype.numpy)
    if words.size != buffer.count:
        raise KernelFault(f"buffer {buffer.name!r} wants {buffer.count} x {buffer.dtype}, "
                          f"the operand gives {words.size}")
    return words.copy()


def run_lowering(lowering: KernelProgram, operands, out: TensorType,
                 subgroup: int = SUBGROUP) -> np.ndarray:
    """Run every kernel of a lowering on numpy operands (None for literals) on a target
    of `subgroup`-lane subgroups and return the output. Unwritten output elements keep a
    poison pattern (all bits set: NaN for floats, -1 for integers), so a kernel that
    skips elements fails comparisons."""
    if lowering.alias is not None:
        result = np.array(operands[lowering.alias], dtype=out.dtype.numpy).reshape(-1)
    else:
        result = np.full(out.size * out.dtype.itemsize, 0xFF, np.uint8).view(out.dtype.numpy)
    arrays: dict[str, np.ndarray] = {}
    for kernel in lowering.kernels:
        for b in kernel.buffers:
            if b.name in arrays:
                continue
            if b.operand == OUT:
                arrays[b.name] = result
            elif b.operand is None:
                arrays[b.name] = np.zeros(b.count, b.dtype.numpy)
            else:
                arrays[b.name] = operand_words(operands[b.operand], b)
        run(kernel, {b.name: arrays[b.name] for b in kernel.buffers}, subgroup=subgroup)
    return result.reshape(out.shape)
