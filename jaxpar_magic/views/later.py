"""Values that come after the cell: a result view shown while its program still runs, filled in when
the values are there (issue 39: a shown cell returns once its program is dispatched, as `jax.jit` does).

One background thread takes the views in the order they were shown. For each it reads the values
(views/values.PendingValues, which waits for the cell's program and the small programs that gather
them), then sets the widget's state (a comm message: a front end that draws widgets redraws the view
whenever it comes) and, in a kernel, rewrites the view's static twin under its display id
(`update_display`), so that a saved notebook and its exported HTML hold the values too. It runs in the
context of the cell that showed the view (contextvars), so the kernel addresses those messages to it.

The thread fills a view in a pause of the magics: not while one runs, nor within QUIET_S of one
ending (its Python would take turns with the cell's for the GIL; on the TPU host a loop of shown cells
paid ~0.2 ms a cell for it, bench section 15), and at the latest DEFER_MAX_S after the view was shown.
In a notebook, where cells come milliseconds apart, that is right after its cell.

An error the cell's program raised on the devices stops its values: the view says "values
unavailable" with the error, and reading any of the cell's results raises it, as `jax.jit`'s would.
"""
from __future__ import annotations

import atexit
import contextvars
import queue
import sys
import threading
import time

#: At exit, how long the interpreter waits for views still filling: a daemon thread stopped inside a
#: JAX call while the runtime shuts down aborts the process ("terminate called ...").
EXIT_WAIT_S = 60.0
_jobs: queue.SimpleQueue = queue.SimpleQueue()
_lock = threading.Lock()
_unfilled = threading.Condition(_lock)
_state = {"thread": None, "unfilled": 0}
#: A pause of the magics long enough to fill views in, and the longest a view waits for one.
QUIET_S = 0.002
DEFER_MAX_S = 0.25
_magics = {"running": 0, "ended": 0.0}  # written by the magics' thread only (magic_started/magic_ended)


def magic_started() -> None:
    _magics["running"] += 1


def magic_ended() -> None:
    _magics["running"] -= 1
    _magics["ended"] = time.monotonic()


def fill_later(view, pending, static: bool) -> None:
    """Fill `view` (a ResultView shown with its outputs pending) from `pending` once its values are
    there; with `static`, also rewrite its static twin (shown under `view.static_display_id`)."""
    context = contextvars.copy_context()  # the showing cell's parent header: messages go to its outputs
    with _lock:
        _state["unfilled"] += 1
        thread = _state["thread"]
        if thread is None or not thread.is_alive():
            thread = _state["thread"] = threading.Thread(target=_work, daemon=True, name="jaxpar-values")
            thread.start()
            if not _state.get("at_exit"):  # the interpreter must not end while the thread waits on JAX
                _state["at_exit"] = True
                atexit.register(wait_for_fills, EXIT_WAIT_S)
    _jobs.put((context, view, pending, static, time.monotonic()))


def wait_for_fills(timeout: float | None = None) -> bool:
    """Wait until every view shown so far has its values; False when `timeout` seconds passed first."""
    with _unfilled:
        return _unfilled.wait_for(lambda: _state["unfilled"] == 0, timeout)


def fill(view, pending, static: bool) -> None:
    """Read the values (waiting for them), then put them in the widget and, with `static`, its twin."""
    try:
        outputs = pending.outputs()
    except Exception as error:  # the program failed on the devices: the view says so, a read of a result raises it
        outputs = pending.failed(error)
    view.state = {**view.state, "outputs": outputs}
    if static:
        view.update_static()


def _work() -> None:
    while True:
        batch = _queued([_jobs.get()])
        # Not waiting for the values first: on the TPU host a thread waiting on the device while a cell
        # runs slows the cell's dispatches (~70 µs a wait; bench/thread_reads.py). A read in the fill
        # waits for them, without the GIL.
        _wait_for_a_pause(batch[0][4] + DEFER_MAX_S)
        batch = _queued(batch)  # and the views shown meanwhile
        for _, _, pending, _, _ in batch:
            # Their copies to the host start together, in the pause: one device-to-host read waits ~0.5 ms
            # on the TPU host, and a copy started while a cell runs slows its dispatches there (~60 µs a
            # copy; bench/thread_reads.py).
            pending.start_transfers()
        for context, view, pending, static, _ in batch:
            try:
                context.run(fill, view, pending, static)
            except Exception as error:  # the front end went away, say: the next view must still be filled
                print(f"jaxpar_magic: a view's values could not be shown: {type(error).__name__}: {error}",
                      file=sys.stderr)  # in the showing cell (its context)
            finally:
                with _unfilled:
                    _state["unfilled"] -= 1
                    _unfilled.notify_all()


def _queued(batch: list) -> list:
    """`batch` and every job queued since, in the order they were shown."""
    while True:
        try:
            batch.append(_jobs.get_nowait())
        except queue.Empty:
            return batch


def _wait_for_a_pause(deadline: float) -> None:
    """Return once no magic has run for QUIET_S, or at `deadline` (time.monotonic)."""
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        left = QUIET_S if _magics["running"] else QUIET_S - (now - _magics["ended"])
        if left <= 0:
            return
        time.sleep(min(left, deadline - now))
