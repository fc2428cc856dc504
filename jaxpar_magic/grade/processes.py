"""Every process a submission's kernel started ends with it (issue 41: a child started with
``start_new_session=True`` outlived the kernel and rewrote the grades after the grader exited).

A kernel's processes are found three ways, since any one can be escaped: as its descendants; by a
mark in their environment (`MARK`, inherited by every process the kernel starts, also one that left
the kernel's session and was adopted by init); and, on Linux, by making the grader a *child
subreaper*, so that an orphan is adopted by the grader instead of init and stays its descendant
(`end_every_descendant` ends those before the grades are written). Each round stops every process
found before killing any (a process cannot fork past a stopped parent), and rounds repeat until
none is left.
"""
from __future__ import annotations

import os
import sys

MARK = "JAXPAR_MAGIC_GRADE_KERNEL"  # the environment variable each kernel (and all it starts) carries
_ROUNDS = 20


def become_subreaper() -> bool:
    """Let the grader adopt its descendants' orphans (Linux's PR_SET_CHILD_SUBREAPER); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def end_kernel_processes(kernel_pid: int | None, mark: str) -> int:
    """End the kernel (if it still runs) and every process it started; how many were ended."""
    import psutil

    ended = 0
    for _ in range(_ROUNDS):
        found = {p.pid: p for p in _marked(mark)}
        if kernel_pid is not None:
            try:
                kernel = psutil.Process(kernel_pid)
                found[kernel.pid] = kernel
                found.update({p.pid: p for p in kernel.children(recursive=True)})
            except psutil.Error:  # already gone
                pass
        found.pop(os.getpid(), None)
        living = _living(found.values())
        if not living:
            return ended
        ended += _end(living)
    return ended


def end_every_descendant() -> int:
    """End every process below the grader (with the subreaper, the kernels' orphans too)."""
    import psutil

    ended = 0
    for _ in range(_ROUNDS):
        found = _living(psutil.Process().children(recursive=True))
        if not found:
            return ended
        ended += _end(found)
    return ended


def _marked(mark: str) -> list:
    """This user's processes whose environment carries `mark`."""
    import psutil

    me = os.getuid() if hasattr(os, "getuid") else None
    found = []
    for process in psutil.process_iter(["uids"]):
        try:
            if me is not None and process.info["uids"] is not None and process.info["uids"].real != me:
                continue
            if process.environ().get(MARK) == mark:
                found.append(process)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


def _living(processes) -> list:
    """The processes that still run: a zombie is already dead (one of ours is reaped here)."""
    import psutil

    living = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
            elif process.ppid() == os.getpid():
                os.waitpid(process.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue
    return living


def _end(processes: list) -> int:
    import psutil

    for process in processes:
        try:
            process.suspend()
        except psutil.Error:
            pass
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    gone, alive = psutil.wait_procs(processes, timeout=10)
    return len(gone) + len(alive)
