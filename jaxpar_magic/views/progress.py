"""A status line in the cell for waits over a second ("starting engines 1/2", "compiling… 3 s").

The line appears only once the wait has lasted `delay` seconds and is rewritten in place while it
goes on. When the wait ends, the cell's result takes its place (`kept_lines`); where there is no
result to show (`--no-show`, a function's first call), it becomes "done in N s": a front end
cannot remove one output, and a blanked line would stay behind as an empty output. It needs a
kernel (a notebook, JupyterLab, nbclient): a display with an id is what a front end can rewrite
in place. In a terminal or a bare InteractiveShell nothing is shown.
"""
from __future__ import annotations

import contextlib
import contextvars
import html
import threading
import time
from collections.abc import Callable

from .textwidth import in_kernel

DELAY_S = 1.0
INTERVAL_S = 0.5


class StatusLine:
    """What one update displays: the text, and the same text escaped as HTML."""

    def __init__(self, text: str):
        self.text = text

    def _repr_mimebundle_(self, **kwargs):
        if not self.text:
            return {"text/plain": ""}
        return {
            "text/plain": self.text,
            "text/html": f'<div class="jpm-status" style="font:12px monospace;opacity:.75">{html.escape(self.text)}</div>',
        }


# Per thread: how many `disabled()` blocks are open (a cluster process: the kernel shows one line; the layout
# explorer's worker plans without a line while the kernel's own cells keep theirs).
_off = threading.local()
# Per thread, a stack of Slots: finished lines are kept for the caller's result, not blanked. Per thread
# because a line belongs to the cell that opened it: the explorer's worker (or any other thread) inside
# its own kept_lines() must not take the main thread's line, which would then never say "done".
_kept = threading.local()


def _keeping() -> list:
    stack = getattr(_kept, "stack", None)
    if stack is None:
        stack = _kept.stack = []
    return stack


@contextlib.contextmanager
def disabled():
    """No status lines inside this block."""
    _off.depth = getattr(_off, "depth", 0) + 1
    try:
        yield
    finally:
        _off.depth -= 1


class Slots:
    """The status lines a block showed, kept in place once their waits end, so that the block's
    result takes their place in the cell (instead of leaving an empty output above it)."""

    def __init__(self):
        self.handles: list = []

    def fill(self, obj) -> bool:
        """Show `obj` where the first kept line is; False when no line was shown. A view shown as
        several outputs (views/base.py's display_parts: its static twin, then the widget) puts the
        first in the line's place and the others after it."""
        if not self.handles:
            return False
        handle = self.handles.pop(0)[0]
        parts = getattr(obj, "display_parts", None)
        if parts is None:
            handle.update(obj)
            return True
        from IPython.display import display

        (data, metadata), *rest = parts()
        handle.update(data, metadata=metadata, raw=True)
        if hasattr(obj, "update_static"):  # its static twin is rewritten in the line's place (views/later.py)
            obj.static_display_id = handle.display_id
        for data, metadata in rest:
            display(data, metadata=metadata, raw=True)
        return True

    def close(self) -> None:
        while self.handles:
            handle, started = self.handles.pop()
            handle.update(StatusLine(_done_text(started)))


@contextlib.contextmanager
def kept_lines():
    """`with kept_lines() as slots:` ... then `slots.fill(result)`; lines not filled say "done"."""
    slots = Slots()
    stack = _keeping()
    try:  # pushed inside the try: an interrupt right after the push must not leave it on the stack for good
        stack.append(slots)
        yield slots
    except BaseException:
        slots.close()
        raise
    finally:
        if slots in stack:
            stack.remove(slots)


def _done_text(started: float) -> str:
    return f"done in {time.monotonic() - started:.1f} s"


def _in_kernel() -> bool:
    return not getattr(_off, "depth", 0) and in_kernel()


class Progress:
    """`with Progress("compiling"):` shows "compiling… 3 s" in the cell while the block runs > 1 s.

    `label` is a string or a callable returning one (read at every refresh); `update(text)`
    replaces it, for waits made of steps ("starting engines 1/2").
    """

    def __init__(self, label: str | Callable[[], str], delay: float = DELAY_S, interval: float = INTERVAL_S,
                 enabled: bool | None = None):
        self._label = label
        self._delay = delay
        self._interval = interval
        self._enabled = _in_kernel() if enabled is None else enabled
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._handle = None
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def text(self) -> str:
        label = self._label() if callable(self._label) else self._label
        return f"{label}… {time.monotonic() - self._start:.0f} s"

    def update(self, label: str | Callable[[], str]) -> None:
        self._label = label
        if self._handle is not None:
            self._refresh()

    def _refresh(self) -> None:
        from IPython.display import display

        with self._lock:
            if self._done.is_set():
                return
            line = self.text()
            if self._handle is None:
                self._handle = display(StatusLine(line), display_id=True)
            else:
                self._handle.update(StatusLine(line))

    def _run(self) -> None:
        if self._done.wait(self._delay):
            return
        while not self._done.is_set():
            try:
                self._refresh()
            except Exception:  # a closed comm or a dead front end must not break the computation
                return
            self._done.wait(self._interval)

    def __enter__(self) -> "Progress":
        self._start = time.monotonic()
        if self._enabled:
            # The copied context carries the cell's parent header, so the kernel sends the line to this cell.
            context = contextvars.copy_context()
            self._thread = threading.Thread(target=context.run, args=(self._run,), daemon=True,
                                            name="jaxpar-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            if self._handle is not None:
                kept = _keeping()
                if kept:  # the caller shows its result in this line's place
                    kept[-1].handles.append((self._handle, self._start))
                else:
                    self._handle.update(StatusLine(_done_text(self._start)))
