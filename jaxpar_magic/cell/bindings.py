"""Binding a cell's results into the namespace in one step, and letting go of what they replace.

A hand-written training loop (`params = step(params)`) drops the old params while the next step is
still computing, so their device buffers are freed in the shadow of the device work. A cell binds
only once its run has finished (a failed cell leaves the namespace as it was), so the values it
replaces would be freed right there, on the cell's time: for a 64-leaf params dict on 8 devices that
is about 1 ms of buffer frees per step (bench section 13). Instead, replaced values made only of
JAX arrays are handed to one background thread, which drops them a moment later, while the kernel
goes on. A few arrays are dropped here: freeing them costs less than waking the thread (bench
sections 1, 4 and 9 re-run cells whose outputs are one or two arrays). Anything else (a user's
object may have a finalizer that expects the main thread) is dropped here, as before.
"""
from __future__ import annotations

import atexit
import queue
import threading

from .inputs import jax_array_type

# Fewer replaced arrays than this are freed in place: each costs a few microseconds per device
# (bench section 13: ~1.3 ms for 128 arrays on 8 devices), about what handing them over costs.
RELEASE_MIN_ARRAYS = 8
_releases: list = []  # [the queue the release thread drains], once started
_start_lock = threading.Lock()


def bind_results(namespace: dict, bindings: dict) -> None:
    """`namespace.update(bindings)` in one step (an interrupt leaves all or nothing); the replaced
    values that are arrays, or plain containers of arrays, are released on the background thread."""
    # Plain loops, not comprehensions: this runs on every re-run of a cell (bench sections 1, 4, 9).
    replaced, only_arrays = [], True
    array = jax_array_type()
    for name, new in bindings.items():
        old = namespace.get(name, new)
        if old is not new:
            replaced.append(old)
            only_arrays = only_arrays and isinstance(old, array)
    namespace.update(bindings)
    if replaced and not (only_arrays and len(replaced) < RELEASE_MIN_ARRAYS):
        _release(replaced)
    # else: a few arrays, freed here as `replaced` goes (the re-run of a cell with one or two outputs)


def _release(values: list) -> None:
    import jax

    arrays, count = [], 0
    for value in values:
        leaves = _array_leaves(jax, value)
        if leaves:
            arrays.append(value)
            count += leaves
    values.clear()  # the rest is dropped here, on this thread
    if count >= RELEASE_MIN_ARRAYS:
        _queue().put(arrays)


def _array_leaves(jax, value) -> int:
    """How many arrays `value` holds if it is an array or a plain container of arrays only, else 0."""
    if isinstance(value, jax.Array):
        return 1
    if type(value) not in (dict, list, tuple) and not _is_namedtuple(value):
        return 0
    leaves = jax.tree.leaves(value)
    return len(leaves) if leaves and all(isinstance(leaf, jax.Array) for leaf in leaves) else 0


def _is_namedtuple(value) -> bool:
    """optax's states are NamedTuples of arrays: tuples with fields and no finalizer of their own."""
    return isinstance(value, tuple) and hasattr(type(value), "_fields") and "__del__" not in vars(type(value))


def _queue() -> queue.SimpleQueue:
    if not _releases:
        with _start_lock:
            if not _releases:
                releases = queue.SimpleQueue()
                thread = threading.Thread(target=_drain, args=(releases,), daemon=True, name="jaxpar-release")
                thread.start()
                atexit.register(_stop, releases, thread)
                _releases.append(releases)
    return _releases[0]


def _drain(releases: queue.SimpleQueue) -> None:
    while (values := releases.get()) is not None:
        values.clear()  # the last references: the arrays' buffers are freed here, off the cell's time


def _stop(releases: queue.SimpleQueue, thread: threading.Thread) -> None:
    """At exit, before the interpreter tears threads down: a daemon thread freeing JAX buffers while
    Python finalizes aborts the process ("FATAL: exception not rethrown")."""
    releases.put(None)
    thread.join(timeout=10)
