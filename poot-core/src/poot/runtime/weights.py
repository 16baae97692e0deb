"""The weight cache: every weight a plan binds is uploaded once per device.

A cached weight is keyed by payload identity and storage representation:
- a const binder: its WeightRef's payload (a content key the loader computed), else a
  hash of its bytes; with its dtype, shape and format;
- a value folded at bind time (poot.plan WeightSpec with an op): the representation the
  backend named ("f32-decoded" for a decoded packed weight), the op, and the keys of its
  operands, so it is computed on the host only when no plan bound it before;
and the device. Different bytes never reuse a cached weight; the same bytes bound twice
(two binders, two plans, a prefill and a decode plan) upload once. `uploads` counts them.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from poot.contract import DeviceBuffer, Runtime, WeightSpec
from poot.digest import blake2b
from poot.ir.graph import Lit

Key = tuple


def bytes_key(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return "blake2b:" + blake2b(data, digest_size=16).hexdigest()


class WeightCache:
    """Weights bound on one runtime, shared by every Executor that is handed this cache."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.device = str(getattr(runtime, "device", ""))
        self.buffers: dict[Key, DeviceBuffer] = {}
        self.uploads = 0        # weights written to the device
        self.hits = 0           # binds served by an earlier upload
        self.folds = 0          # folded values computed on the host

    def __len__(self) -> int:
        return len(self.buffers)

    def bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    def bind(self, spec: WeightSpec, const_array: Callable[[WeightSpec], np.ndarray],
             label: str) -> DeviceBuffer:
        """The device buffer of `spec`, uploading it if no earlier bind did.

        `const_array(spec)` returns the host array of a const binder (checked by the
        caller); folded values are computed from their operands with the oracle.
        """
        memo: dict[int, np.ndarray] = {}
        key = self.key(spec, const_array)
        buf = self.buffers.get(key)
        if buf is not None:
            self.hits += 1
            return buf
        array = self._host_value(spec, const_array, memo)
        buf = self.runtime.alloc(max(array.nbytes, 1), label)
        self.runtime.write(buf, 0, np.ascontiguousarray(array))
        self.buffers[key] = buf
        self.uploads += 1
        return buf

    def key(self, spec: WeightSpec, const_array) -> Key:
        if not spec.folded:
            return ("const", self._payload(spec, const_array), str(spec.type),
                    spec.representation, self.device)
        ops = tuple(("lit", x.value, str(x.dtype)) if isinstance(x, Lit)
                    else self.key(x, const_array) for x in spec.operands)
        return ("folded", spec.representation, spec.op, ops, str(spec.type), self.device)

    @staticmethod
    def _payload(spec: WeightSpec, const_array) -> str:
        ref = getattr(spec, "ref", None)
        if ref is not None and ref.payload:
            return f"{ref.format}:{ref.payload}"
        return bytes_key(const_array(spec))

    def _host_value(self, spec: WeightSpec, const_array, memo) -> np.ndarray:
        got = memo.get(id(spec))
        if got is not None:
            return got
        if not spec.folded:
            value = const_array(spec)
        else:
            from poot.oracle import apply

            args = [np.asarray(x.value, x.dtype.numpy) if isinstance(x, Lit)
                    else self._host_value(x, const_array, memo) for x in spec.operands]
            types = [x.type for x in spec.operands]
            with np.errstate(all="ignore"):
                value = apply(spec.op, args, types, spec.type)
            self.folds += 1
        memo[id(spec)] = value
        return value
