"""Where a stuck cluster process waits: the cell line, and the collective if it can be told.

A process stuck in a collective sits inside native code, where a SIGINT is never seen, so its
traceback cannot be had by interrupting it. Instead each engine registers `faulthandler` for
SIGUSR1 (it dumps every thread's Python stack from the signal handler itself, whatever the main
thread is doing) into a pipe, and a small thread turns the main thread's part of the dump into one
marked line on the engine's stderr, which ipyparallel brings to the kernel with the request's
output. The kernel (`cluster/lifecycle.py`) sends the signal when a cell times out, reads the marked line
(`read_report`), and says where the process waits (`describe`).
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading

SIGNAL = signal.SIGUSR1
MARK = "\x1b[jaxpar-doctor]"  # starts the report's line; never shown to the user
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
# What a user's line may call that waits for every process (lax's collectives, multihost helpers).
COLLECTIVES = ("psum_scatter", "psum", "pmean", "pmax", "pmin", "all_gather", "all_to_all", "ppermute",
               "pshuffle", "process_allgather", "sync_global_devices", "broadcast_one_to_all")
_COLLECTIVE = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")\s*\(")

_installed = False


def install() -> None:
    """In an engine: answer SIGUSR1 with a report of where the main thread is. Idempotent."""
    global _installed
    import faulthandler

    if _installed:
        return
    read_end, write_end = os.pipe()
    # The reader first, and only then the handler: faulthandler reads every thread's frames without
    # the GIL, so a thread still starting up (its frames half built) when the signal comes can
    # crash the dump. install() returns once the reader waits in os.read, its frames settled.
    ready = threading.Event()
    threading.Thread(target=_answer, args=(read_end, ready), daemon=True, name="jaxpar-doctor").start()
    ready.wait(5)
    faulthandler.register(SIGNAL, file=write_end, all_threads=True, chain=False)
    _installed = True


def _answer(read_end: int, ready: threading.Event) -> None:
    import select

    main = f"0x{threading.main_thread().ident:016x}"
    ready.set()
    while True:
        text = os.read(read_end, 65536)
        if not text:
            return
        while select.select([read_end], [], [], 0.1)[0]:  # the rest of the same dump
            more = os.read(read_end, 65536)
            if not more:
                break
            text += more
        frames = main_frames(text.decode(errors="replace"), main)
        sys.stderr.write(MARK + json.dumps(frames) + "\n")
        sys.stderr.flush()


def main_frames(dump: str, main_thread: str) -> list[dict]:
    """The main thread's frames from a faulthandler dump, innermost first, each with its source line
    (cells are in linecache, so their lines are found too) and whether it is a file on disk."""
    import linecache

    frames, inside = [], False
    for line in dump.splitlines():
        thread = _THREAD.match(line)
        if thread:
            inside = thread.group(1) == main_thread
            continue
        frame = _FRAME.match(line)
        if inside and frame:
            path, number = frame.group("file"), int(frame.group("line"))
            frames.append({"file": path, "line": number, "name": frame.group("name"),
                           "text": linecache.getline(path, number).strip(), "on_disk": os.path.exists(path)})
    return frames


def read_report(stderr_text: str) -> list[dict] | None:
    """The frames of the last report in a request's stderr, or None."""
    found = None
    for line in stderr_text.splitlines():
        if line.startswith(MARK):
            try:
                found = json.loads(line[len(MARK):])
            except ValueError:
                continue
    return found


def describe(frames: list[dict]) -> str | None:
    """Where the main thread waits, from its frames (innermost first): "at line 5 of the cell
    (`total = psum(x).block_until_ready()`); that line calls `psum`, a collective every process
    must reach", or for a request that is no cell, the function the engine was asked to run
    ("in `probe` (cluster/engine.py, line 193), waiting in `..._allgather`; it is inside
    `sync_global_devices`, ...")."""
    if not frames:
        return None
    innermost = frames[0]
    # A cell is compiled from text that linecache knows; ipyparallel's own apply code has none.
    cell = next((f for f in frames if not f["on_disk"] and f["text"]), None)
    if cell is not None:
        where = f"at line {cell['line']} of the cell (`{cell['text']}`)"
        entry = cell
    else:
        outside = next((k for k, f in enumerate(frames) if not f["on_disk"]), len(frames))
        entry = frames[max(outside - 1, 0)]  # the function the engine was asked to run
        where = f"in `{entry['name']}` ({os.path.basename(entry['file'])}, line {entry['line']})"
    if innermost is not entry:
        where += f", waiting in `{innermost['name']}`"
    called = _COLLECTIVE.search(cell["text"]) if cell is not None else None
    inside = next((f["name"] for f in frames if f["name"] in COLLECTIVES), None)
    if called:
        where += f"; that line calls `{called.group(1)}`, a collective every process must reach"
    elif inside:
        where += f"; it is inside `{inside}`, a collective every process must reach"
    return where
