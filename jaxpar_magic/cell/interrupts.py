"""Holding Kernel -> Interrupt (SIGINT) over a few steps that must not be cut in the middle, and the
reads of a user's JAX arrays that need it (JAX builds an array's list of buffers on the first read).

Plain Python; no IPython, no JAX import.
"""
from __future__ import annotations

import signal
import threading


class HeldInterrupt:
    """Holds a Ctrl-C (SIGINT, or JupyterLab's Kernel -> Interrupt) that arrives inside the `with`
    block; `release()` stops holding and raises it, and leaving the block without `release()` only
    stops holding. Only the main thread receives signals; elsewhere nothing is held.
    (The cluster holds one while requests go out: cluster/runs.py.)
    """

    def __init__(self):
        self.arrived = False
        self._previous = None

    def __enter__(self) -> "HeldInterrupt":
        previous = signal.getsignal(signal.SIGINT)
        if callable(previous) and threading.current_thread() is threading.main_thread():
            self._previous = previous
            signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self.arrived = True

    def release(self) -> None:
        """Stop holding; raise KeyboardInterrupt if one arrived meanwhile."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
            if self.arrived:
                raise KeyboardInterrupt

    def __exit__(self, *error) -> None:
        if self._previous is not None:  # released by no one (an error left the block): restore only
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def addressable_shards(array) -> list:
    """`array.addressable_shards`, read with an interrupt held until JAX has built the list.

    JAX builds an array's list of per-device buffers on its first read, calling back into Python
    once per device, and keeps it: an interrupt raised in the middle leaves the list cut short for
    good, and the array, not deleted, can no longer be read (`np.asarray` raises IndexError). Seen
    with jax 0.10.2 in a loop of `%%shard --donate` cells, whose check reads a fresh result's shards
    each run; tests/test_donation.py reproduces it with plain JAX and shows it held here."""
    held = HeldInterrupt()
    with held:
        shards = array.addressable_shards
        held.release()
    return shards


def host_value(value):
    """`np.asarray(value)` of a value of the user's: a live jax.Array's list of buffers is built first,
    with the interrupt held (addressable_shards), since NumPy's read builds it too, and an interrupt
    there would leave the user's array unreadable. (A check, a snapshot, a push to a cluster.)"""
    import numpy as np

    is_deleted = getattr(value, "is_deleted", None)
    # (the type is asked: reading the property of `value` would build the list, unheld)
    if callable(is_deleted) and hasattr(type(value), "addressable_shards") and not is_deleted():
        addressable_shards(value)
    return np.asarray(value)
