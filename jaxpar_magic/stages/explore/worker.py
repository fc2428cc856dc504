"""The explorer's worker thread: what the view submits is planned here, off the kernel's main thread,
so the kernel keeps answering (widget messages, other cells) while XLA compiles.

Coalescing: each submitted change is applied at once to the layout the previous change asked for
(`Explorer.intended`), so the changes add up; only the resulting layout waits. While one compile runs,
a newer submit replaces the waiting layout: when the compile ends, only the latest is planned. A
compile that ends never moves `intended` back to its own layout: a change made while the next one
compiles still adds to the latest asked for (issue 40: w's cut was lost). A layout tried before is
taken from the explorer's cache at once, even from the caller's thread.

`Explorer.holding()` holds the worker before each plan (tests and demonstrations of coalescing: what
is submitted meanwhile waits, the view says "planning ..."). An observer that raises is reported in
the view (explorer.py's `_notify`); nothing a plan or an observer does ends this thread early.

Planning from this thread is what `plan_cell` does on the main thread (it already compiles in a
worker thread of its own, compiled_plans.in_worker): the cell's mesh is entered inside the traced
program and around the lowering as a context (thread-local in JAX), never set globally, so nothing
here depends on the main thread. Status lines in the cell are off for these plans (the view shows
the status instead).
"""
from __future__ import annotations

import threading
import time

from ...errors import UsageError

TICK_S = 1.0  # how often the status line's seconds are updated while a compile runs


class Worker:
    def __init__(self, explorer):
        self._explorer = explorer
        self._cond = threading.Condition()
        self._pending = None  # the layout to plan next (the latest asked for)
        self._thread: threading.Thread | None = None
        self.busy: str | None = None  # what is planning now: the explorer's describe(layout)
        self.started = 0.0
        self.idle = threading.Event()
        self.idle.set()
        self._holds = 0  # Explorer.holding(): plans wait while this is above 0

    def hold(self) -> None:
        with self._cond:
            self._holds += 1

    def release(self) -> None:
        with self._cond:  # each Hold releases once
            self._holds -= 1
            self._cond.notify_all()

    def submit(self, change: dict) -> None:
        ex = self._explorer
        try:
            with ex._lock:
                layout = _layout_of(ex, change)
                if layout not in ex._cache:
                    ex.check(layout)
        except UsageError as err:  # a wrong choice: said in the view at once, nothing queued
            ex._say(str(err))
            return
        with ex._lock:
            ex.intended = layout
            kept = layout in ex._cache
        with self._cond:
            if self._thread is None and kept:  # at once, on the caller's thread
                ex._make_current(ex._cache[layout])
                return
            self._pending = layout
            self.idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="jaxpar-explorer", daemon=True)
                self._thread.start()

    def status(self) -> dict:
        busy = self.busy
        if busy is None:
            return {"busy": False, "text": ""}
        return {"busy": True, "text": f"planning {busy}… {time.monotonic() - self.started:.0f} s"}

    def _loop(self) -> None:
        ex = self._explorer
        try:
            while True:
                with self._cond:
                    layout, self._pending = self._pending, None
                    if layout is None:  # done, in the same hold of the lock as a submit's check of _thread
                        self._thread, self.busy = None, None
                        self.idle.set()
                        return
                    self.busy, self.started = ex.describe(layout), time.monotonic()
                done = threading.Event()
                ticker = threading.Thread(target=self._tick, args=(done,), name="jaxpar-explorer-status", daemon=True)
                ticker.start()
                try:
                    self._plan(layout)
                finally:
                    done.set()
                    ticker.join()
        except BaseException:  # nothing should get here; if it does, the next submit starts a thread again
            with self._cond:
                self._thread, self.busy, self._pending = None, None, None
                self.idle.set()
            raise

    def _plan(self, layout) -> None:
        ex = self._explorer
        with self._cond:
            while self._holds:  # Explorer.holding(): the status line ticks meanwhile
                self._cond.wait()
        try:
            with ex._planning:
                row = ex._plan(layout)
        except Exception as exc:  # never a traceback from a thread: one line in the view
            said = str(exc) if isinstance(exc, UsageError) else \
                f"{ex.describe(layout)}: could not be planned ({type(exc).__name__}: {exc})"
            with self._cond:
                last = self._pending is None
                if last:
                    self.busy = None
            ex._say(said, back=last)
            return
        with self._cond:
            if self._pending is None:
                self.busy = None
        ex._make_current(row, aim=False)  # `intended` is the latest change's, planned next if newer

    def _tick(self, done: threading.Event) -> None:
        ex = self._explorer
        ex._notify()  # "planning ..." at once
        while not done.wait(TICK_S):
            ex._notify()


def _layout_of(ex, change: dict):
    """The layout `change` (one of the view's messages) asks for, from the last one asked for."""
    if not isinstance(change, dict):
        raise UsageError(f"submit({change!r}): a change is a dict with a \"kind\": choose, reshape, retarget or restore.")
    kind = change.get("kind")
    base = ex.intended
    if kind == "choose":
        return ex.choosing(base, str(change.get("name")), change.get("spec"), group=True)
    if kind == "reshape":
        return ex.reshaping(base, change.get("mesh"), change.get("axis_types", change.get("types")))
    if kind == "retarget":
        return ex.retargeting(base, change.get("hardware"), change.get("topology"))
    if kind == "restore":
        return ex.restoring(str(change.get("line")))
    raise UsageError(f"submit: unknown change kind {kind!r}; use choose, reshape, retarget or restore.")
