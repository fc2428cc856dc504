"""What a cluster engine's native code writes to its file descriptors, minus Gloo's chatter.

XLA's CPU collectives (Gloo) print "[Gloo] Rank R is connected to N peer ranks. Expected number of
connected peer ranks is : N" once per device, from several threads at once, the first time a
program with collectives runs. The threads write piece by piece, so the pieces interleave
("[Gloo] Rank [Gloo] Rank 03[Gloo] Rank  is connected to 7 ..."), and a filter over lines misses
them. `quiet(fd)` therefore puts a pipe in front of the descriptor, before anything is written,
and a thread drops whole runs made only of those pieces (`GlooFilter`); everything else goes on
to where the descriptor pointed before (in an engine: ipykernel's capture, hence the notebook).
"""
from __future__ import annotations

import os
import re
import threading
import time

_START = b"[Gloo] Rank "
# Every piece the message is written in; a run of them that starts with _START is noise.
_PIECES = (_START, b" is connected to ", b" peer ranks. ", b"Expected number of connected peer ranks is : ")
_TOKEN = re.compile(b"|".join(re.escape(p) for p in _PIECES) + rb"|\d+|\n")
HOLD_S = 1.0  # an unfinished run is let through as it is after this long (never lose real output)


class GlooFilter:
    """`feed(bytes) -> bytes` keeps what is not Gloo's connection message; `flush()` the rest.

    A run starts at "[Gloo] Rank " and takes only the message's pieces, numbers and newlines; it
    is dropped once it holds as many of each fixed piece and newline as it holds starts (every
    message it began is complete). Numbers are not counted exactly: two threads' digits can
    touch ("03"), but a run never takes more than three per message.
    """

    def __init__(self):
        self._held = b""
        self._since: float | None = None

    def feed(self, data: bytes) -> bytes:
        self._held += data
        out = []
        while self._held:
            start = self._held.find(_START)
            if start < 0:
                keep = _partial_start(self._held)  # "[Gl" at the very end may begin a run
                out.append(self._held[:len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
                break
            out.append(self._held[:start])
            self._held = self._held[start:]
            end = _run_end(self._held)
            if end is None:  # the run goes on past what has arrived
                break
            self._held = self._held[end:]
        self._since = (self._since or time.monotonic()) if self._held else None
        return b"".join(out)

    def overdue(self) -> bool:
        return self._since is not None and time.monotonic() - self._since > HOLD_S

    def flush(self) -> bytes:
        held, self._held, self._since = self._held, b"", None
        return held


def _partial_start(data: bytes) -> int:
    for size in range(min(len(_START) - 1, len(data)), 0, -1):
        if data.endswith(_START[:size]):
            return size
    return 0


def _run_end(data: bytes) -> int | None:
    """Where the run that starts at 0 ends (all of it Gloo's), or None when more data must come."""
    counts = dict.fromkeys(_PIECES, 0)
    numbers = newlines = 0
    at = 0
    while True:
        starts = counts[_START]
        complete = newlines == starts and all(n == starts for n in counts.values())
        match = _TOKEN.match(data, at)
        if match is None:
            rest = data[at:]
            if _START.startswith(rest) or (not complete and any(p.startswith(rest) for p in _PIECES)):
                return None  # a piece cut in two by the pipe: wait for the rest
            return at  # foreign text: the run so far was only Gloo's pieces
        token = match.group()
        if complete and token != _START:
            return at
        if token in counts:
            counts[token] += 1
        elif token == b"\n":
            newlines += 1
        elif numbers == 3 * starts:
            return at  # more numbers than messages have: they are someone else's
        else:
            numbers += 1
        at = match.end()
        if at == len(data):
            starts = counts[_START]
            if newlines == starts and all(n == starts for n in counts.values()):
                return at
            return None


_installed: dict[int, tuple[int, threading.Thread]] = {}  # fd -> (what it pointed to before, its pump)


def quiet(fd: int) -> None:
    """From now on, Gloo's connection messages written to `fd` are dropped; the rest passes.
    Idempotent; the reading thread is a daemon and ends when the process does."""
    if fd in _installed:
        return
    onward = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, onward), daemon=True, name=f"jaxpar-fd{fd}")
    _installed[fd] = (onward, pump)
    pump.start()


def release(fd: int, timeout: float = 2.0) -> None:
    """Point `fd` back where it pointed before `quiet`, once what was written has gone through."""
    if fd not in _installed:
        return
    onward, pump = _installed.pop(fd)
    os.dup2(onward, fd)  # closes our pipe's last write end: the pump reads to its end, then stops
    pump.join(timeout)
    os.close(onward)


def _pump(read_end: int, onward: int) -> None:
    import select

    noise = GlooFilter()
    while True:
        ready, _, _ = select.select([read_end], [], [], HOLD_S / 2)
        if not ready:
            if noise.overdue():
                _write(onward, noise.flush())
            continue
        chunk = os.read(read_end, 65536)
        if not chunk:
            _write(onward, noise.flush())
            os.close(read_end)
            return
        _write(onward, noise.feed(chunk))


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:  # whoever read it is gone: nothing more can be shown
            return
