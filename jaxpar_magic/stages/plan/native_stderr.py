"""What XLA's and libtpu's C++ code writes to the process's stderr while a plan compiles, read by the plan
instead of shown.

Native code logs to file descriptor 2 itself (absl's LOG(WARNING)): Python's `sys.stderr` never sees
it, and in a notebook ipykernel forwards it into the cell, above the plan's own output. Two kinds
matter here: libtpu's start-up warnings when it loads without a TPU (stages/plan/target.py drops them)
and XLA's SPMD partitioner's warnings ("[SPMD] Involuntary full rematerialization ... cannot go from
sharding ... to ..."), which the plan turns into rows of its own (stages/plan/why.py).

`heard(take)` sends descriptor 2 to a temporary file for a block; afterwards every line `take` matches
is the caller's (`said()`), and every other line goes on to where descriptor 2 pointed before. The
descriptor is the process's, so one lock serialises such blocks; a block inside another (same thread)
writes what it does not take into the outer block's file, which then reads it.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading

_redirecting = threading.RLock()


class heard:
    """`with heard(re.compile(...)) as said:` ... `said()` -> the lines taken (after the block)."""

    def __init__(self, take: re.Pattern):
        self._take = take
        self._taken: list[str] = []

    def __enter__(self):
        _redirecting.acquire()
        try:
            sys.stderr.flush()
            self._file = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._file.fileno(), 2)
        except BaseException:
            _redirecting.release()
            raise
        return lambda: list(self._taken)

    def __exit__(self, *exc):
        try:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._file.seek(0)
            text = self._file.read().decode("utf-8", "replace")
            self._file.close()
            kept = []
            for line in text.splitlines():
                (self._taken if self._take.search(line) else kept).append(line)
            if kept:
                os.write(2, ("\n".join(kept) + "\n").encode())
        finally:
            _redirecting.release()
        return False
