"""--donate's guards around a run: what must hold before a program that reuses its inputs' buffers is
called, and what an interrupt means once it has them.

XLA aborts the process when one buffer is donated twice (or donated and also read), and it cannot
stop a program that has started: a donated buffer is then the program's. So a donating call is
checked leaf by leaf before XLA sees it, and an interrupt that arrives once the program is called
waits until its results are bound (a name is never left on a deleted array), then stops the cell.

Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import signal
import sys
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
    """An interrupt (SIGINT, Kernel -> Interrupt) recorded instead of raised; the main thread only
    (Python delivers signals there)."""

    def __init__(self):
        self.arrived = False

    def __call__(self, signum, frame):
        self.arrived = True


_MAIN = threading.main_thread().ident


class _Held:
    """The one deferral of this process: from a donating program's call until its results are bound."""

    scopes: list = []  # the frames that opened the open `results_bound` scopes, outermost first
    deferred: _Deferred | None = None  # installed as SIGINT's handler, while results wait to be bound
    previous = None  # the handler it replaced
    given = ""  # the donated names, for the note


class results_bound:
    """The scope within which a donating run's results are bound (the magic's whole cell, the
    twin's run and bind, a replay): once its program has been called, an interrupt waits for the
    outermost scope's end, where SIGINT's handler is put back and the interrupt raised. So a name is
    never left on a deleted array (the donated input is gone the moment the program is called, its
    results not yet bound), and the interrupt still stops the cell, and a loop of cells, as it stops
    a loop of jax.jit calls. Nests; a plain class, not contextlib's: it is on a replay's path.

    Scopes are kept by the frame that opened them, not counted: an interrupt on the first line of a
    `with` block skips the scope's exit (Python's own gap), and a count left one too high would
    keep the deferral forever. A frame no longer running is a scope that has ended."""

    __slots__ = ()

    def __enter__(self):
        if threading.get_ident() != _MAIN:  # signals reach the main thread only; a worker's scope is none
            return
        if _Held.scopes and _Held.deferred is None:
            _prune(sys._getframe(1))
        _Held.scopes.append(sys._getframe(1))

    def __exit__(self, kind, exc, tb):
        __tracebackhide__ = True
        if threading.get_ident() != _MAIN:
            return False
        here, scopes = sys._getframe(1), _Held.scopes
        if scopes and scopes[-1] is here:
            scopes.pop()
        else:  # an inner scope's exit was skipped
            _prune(here)
            if here in scopes:
                scopes.remove(here)
        if _Held.deferred is not None and not (scopes and _prune(here)):
            _release(raise_it=kind is None)  # with an error in flight, that error is what the cell raises
        return False


def _prune(frame) -> bool:
    """Forget the scopes whose frames are not on `frame`'s stack; whether any scope is left open."""
    live = set()
    while frame is not None:
        live.add(id(frame))
        frame = frame.f_back
    _Held.scopes[:] = [f for f in _Held.scopes if id(f) in live]
    return bool(_Held.scopes)


def _defer(names: str) -> bool:
    """Install the deferral (once per scope); whether this call installed it."""
    if _Held.deferred is not None or threading.get_ident() != _MAIN:
        return False
    deferred = _Deferred()
    # A pending interrupt is handled here, by the handler being replaced: nothing is given away yet.
    _Held.previous = signal.signal(signal.SIGINT, deferred)
    _Held.deferred, _Held.given = deferred, names
    return True


def _release(raise_it: bool = True) -> None:
    """Put SIGINT's handler back and raise the interrupt that waited, if one came. Once the handler is
    back an interrupt may land anywhere, so this runs after the results are bound."""
    __tracebackhide__ = True  # IPython shows the interrupt at the user's line, not in here
    deferred, previous, names = _Held.deferred, _Held.previous, _Held.given
    _Held.deferred = _Held.previous = None
    signal.signal(signal.SIGINT, previous)
    if deferred.arrived and raise_it:
        print(f"Interrupted after the program was given {names} (--donate): XLA cannot stop a program that has "
              f"started, and those buffers were already its own, so the cell ran to the end and its results are "
              f"bound; then the interrupt stopped it.")
        raise KeyboardInterrupt


def call_donating(program, args, inputs, donated: tuple, wait: bool = True):
    """Call a donating program (and, with `wait`, wait for its result), its inputs checked, with the
    interrupts deferred from the call until the caller's `results_bound` scope ends (one of its own
    where the caller opened none: then an interrupt is raised before the results are returned).
    An interrupt that came before the call is raised before it: nothing is given away."""
    import jax

    with results_bound():
        installed = _defer(", ".join(f"`{inputs[i].name}`" for i in donated))
        # Checked under the deferral: the check reads each input's shards, a list JAX builds on its first
        # read and that an interrupt in the middle leaves cut short for good (cell/interrupts.py).
        check_donation(inputs, args, donated)
        if installed and _Held.deferred.arrived:
            _release()  # raises: the inputs are still whole
        results = program.jitted(*args)
        if wait:
            jax.block_until_ready(results)
    return results


def failed_with_donated(exc: BaseException, inputs, donated: tuple) -> None:
    """A donating run failed (the cell's own error, or JAX's): say, after that error, that the
    donated inputs may be gone."""
    names = ", ".join(f"`{inputs[i].name}`" for i in donated)
    exc.add_note(f"(--donate: {names} went to the program before it failed; their buffers may be deleted now: "
                 f"give them new values before reading them again.)")
