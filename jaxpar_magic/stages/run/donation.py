"""--donate's guards around a run: what must hold before a program that reuses its inputs' buffers is
called, and what an interrupt means once it has them.

XLA aborts the process when one buffer is donated twice (or donated and also read), and it cannot
stop a program that has started: a donated buffer is then the program's. So a donating call is
checked leaf by leaf before XLA sees it, and an interrupt that arrives once the program is called
waits for it, so that its results can be bound (a name is never left on a deleted array).

Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from ...cell.inputs import jax_array_type
from ...errors import UsageError


def _buffers(leaf) -> tuple:
    """Where a placed array's data lives: (device id, buffer address) of each of its shards."""
    return tuple((shard.device.id, shard.data.unsafe_buffer_pointer()) for shard in leaf.addressable_shards)


def check_donation(inputs, args, donated: tuple) -> None:
    """Before a donating program is called: a buffer that a donated leaf shares with any other leaf
    (two names for one array, one array in two leaves of a pytree) is our UsageError, since XLA would
    abort the process. Deleted leaves never reach here: every caller asks Rerun.deleted_error first."""
    array = jax_array_type()
    owners: dict = {}  # (device id, address) -> (label, donated?)
    for position, (tree, arrays) in enumerate(zip(inputs, args)):
        gives = position in donated
        for index, leaf in enumerate(arrays):
            if not isinstance(leaf, array):
                continue
            label = tree.label(index)
            for buffer in _buffers(leaf):
                other = owners.setdefault(buffer, (label, gives))
                if other[0] != label and (gives or other[1]):
                    raise _alias_error(other[0] if other[1] else label, label if other[1] else other[0])


def _alias_error(given: str, also: str) -> UsageError:
    bare = "[" not in also and "." not in also
    fix = f"`{also} = jnp.copy({given})`" if bare else "`jnp.copy` in one of the two leaves"
    return UsageError(
        f"--donate: `{given}` and `{also}` are one array (the same device buffers under two names or in two "
        f"leaves). Donating `{given}` gives those buffers to the program while `{also}` still reads them, "
        f"which XLA refuses by ending the process. Donate neither, or make one of them a copy first ({fix})."
    )


class _Deferred:
    """An interrupt (SIGINT, Kernel -> Interrupt) recorded instead of raised while a donating
    program runs; the main thread only (Python delivers signals there)."""

    def __init__(self):
        self.arrived = False

    def __call__(self, signum, frame):
        self.arrived = True


@contextlib.contextmanager
def interrupts_deferred():
    """Record, not raise, an interrupt for the block's duration; yields the record."""
    deferred = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return
    previous = signal.signal(signal.SIGINT, deferred)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


def call_donating(program, args, inputs, donated: tuple, wait: bool = True):
    """Call a donating program (and, with `wait`, wait for its result), an interrupt deferred;
    returns (results, note): the note (None without an interrupt) says that the interrupt came once
    the inputs were given away, so the cell finished and its results are bound."""
    import jax

    check_donation(inputs, args, donated)
    with interrupts_deferred() as deferred:
        results = program.jitted(*args)
        if wait:
            jax.block_until_ready(results)
    if not deferred.arrived:
        return results, None
    names = ", ".join(f"`{inputs[i].name}`" for i in donated)
    return results, (f"Interrupted after the program was given {names} (--donate): XLA cannot stop a program "
                     f"that has started, and those buffers were already its own, so the cell ran to the end and "
                     f"its results are bound.")


def failed_with_donated(exc: BaseException, inputs, donated: tuple) -> None:
    """A donating run failed (the cell's own error, or JAX's): say, after that error, that the
    donated inputs may be gone."""
    names = ", ".join(f"`{inputs[i].name}`" for i in donated)
    exc.add_note(f"(--donate: {names} went to the program before it failed; their buffers may be deleted now: "
                 f"give them new values before reading them again.)")
