"""The extra plans of `poot serve` (the decode plans only some requests need: host logits,
masked), prepared on a thread of their own while the scheduler serves.

Making a plan is seconds of Python (the step's graph, the compiler's passes, the kernels'
source) and, on a cold kernel cache, a compiler run. Made on the scheduler's thread, a
plain request that arrived meanwhile waited for the whole plan, though it needs none of
them. Here a helper thread prepares each one (Session.prepare: nothing of the session is
touched) and the scheduler binds it at an idle turn (Session.bind, a small part of the
time), so a plain request waits for neither; it only shares the interpreter with the
helper's Python between its steps.

A step that needs an extra plan not bound yet takes it from here (`need`): bound at once if
prepared, waited for if the helper is preparing it, else prepared on the scheduler's
thread (taken off the helper's list first), so none is prepared twice.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

from poot.runtime.session import plan_key


class ExtraPlans:
    """Prepares `keys` ((tokens, batch, sample) as Session.executor takes them, in order)
    for `session` on a helper thread; `cv` is the scheduler's condition, notified when one
    is prepared. `prepare` (default session.prepare) is what the helper calls per key."""

    def __init__(self, session, keys: list[tuple], cv: threading.Condition,
                 prepare: Callable | None = None):
        self.session, self._cv = session, cv
        self.prepare = prepare or session.prepare
        self._todo = list(keys)      # not taken by the helper nor by a step
        self._busy: tuple | None = None          # the helper's key now
        #: key -> (plan, seconds) prepared and not bound yet, or (exception, seconds)
        self._done: dict[tuple, tuple[object, float]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        """Start preparing (once; the plans `ready` waits for come first)."""
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(target=self._work, name="poot-serve-extra-plans",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop after the plan being prepared now."""
        with self._cv:
            self._stopping = True
        if self._thread is not None:
            self._thread.join()

    @property
    def waiting(self) -> int:
        """Extra plans not bound yet."""
        with self._cv:
            return len(self._todo) + (self._busy is not None) + len(self._done)

    @property
    def prepared(self) -> bool:
        """Whether one is prepared and waits for the scheduler to bind it."""
        return bool(self._done)

    def _work(self) -> None:
        while True:
            with self._cv:
                if self._stopping or not self._todo:
                    return
                key = self._busy = self._todo.pop(0)
            t0 = time.perf_counter()
            try:
                made = self.prepare(*key)
            except Exception as exc:    # the step that needs it prepares it again, and fails
                traceback.print_exc(file=sys.stderr)
                made = exc
            with self._cv:
                self._busy = None
                self._done[key] = (made, time.perf_counter() - t0)
                self._cv.notify_all()

    def bind_one(self) -> tuple[tuple, float] | None:
        """Bind one prepared plan (the scheduler's idle turn): its key and seconds, or None
        when none is prepared (or it failed)."""
        with self._cv:
            if not self._done:
                return None
            key = next(iter(self._done))
            made, took = self._done.pop(key)
        if isinstance(made, Exception):
            return None
        t0 = time.perf_counter()
        self.session.bind(plan_key(*key), made, took)
        return key, took + time.perf_counter() - t0

    def need(self, key: tuple) -> None:
        """Have the plan of `key` bound before a step runs it (the scheduler's thread)."""
        if plan_key(*key) in self.session.executors:
            return
        with self._cv:
            while self._busy == key:
                self._cv.wait()
            made, took = self._done.pop(key, (None, 0.0))
            if key in self._todo:
                self._todo.remove(key)
        if made is None or isinstance(made, Exception):
            t0 = time.perf_counter()
            made, took = self.session.prepare(*key), time.perf_counter() - t0
        self.session.bind(plan_key(*key), made, took)
