"""Ties the lives of a cluster's processes to the kernel's: nothing outlives a killed kernel.

`atexit` only runs at a normal exit. A kernel killed by a signal (SIGKILL, the OOM killer) would
orphan the ipyparallel controller and engines, so the kernel starts a tiny watchdog process
(`python -m jaxpar_magic.cluster.reaper`) in its own session and keeps the write end of a pipe to it. The
operating system closes that pipe whenever the kernel dies, however it dies; the watchdog reads
end-of-file (or sees that its parent changed, should a child the kernel forked hold the pipe open)
and kills every process it was told to watch, with all their descendants (controller children,
engines' nannies). It also removes the folders it was told to remove.

Protocol on the watchdog's stdin, one line each:
    watch PID CREATE_TIME     forget PID     dir PATH     undir PATH
The create time guards against killing a process that reused a watched pid.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil

KILL_WAIT_S = 3.0
POLL_S = 0.02
PARENT_POLL_S = 0.5


def processes_of(pids) -> list[psutil.Process]:
    """The live processes among `pids`, with all their descendants."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            family = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            found.setdefault(member.pid, member)
    return list(found.values())


def gone(proc: psutil.Process) -> bool:
    """Exited, or a zombie: a dead process whose parent has not collected it yet (orphans wait for
    init, which may take its time)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to `timeout` s for every process to be gone; returns those still alive."""
    until = time.monotonic() + timeout
    alive = [proc for proc in processes if not gone(proc)]
    while alive and time.monotonic() < until:
        time.sleep(POLL_S)
        alive = [proc for proc in alive if not gone(proc)]
    for proc in processes:
        if gone(proc):
            try:
                proc.wait(0)  # collect our own children's exit status, so no zombie stays behind
            except psutil.Error:
                pass
    return alive


def kill(processes: list[psutil.Process], sig: int = signal.SIGKILL, wait: float = KILL_WAIT_S) -> list[psutil.Process]:
    """Send `sig` to every process, wait up to `wait` s for them to go; returns the survivors."""
    for proc in processes:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass  # already gone: that is what we wanted
    return wait_gone(processes, wait)


class Reaper:
    """The kernel's handle on its watchdog. `watch` processes while a cluster runs, `forget` them
    once `stop` has ended them itself."""

    def __init__(self):
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the kernel's process group must not reach it
            cwd="/",
            text=True,
        )

    def _send(self, line: str) -> None:
        with self._lock:
            if self._process.poll() is not None:
                return  # the watchdog is gone (killed by hand): nothing to tell it
            try:
                self._process.stdin.write(line + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def watch(self, processes: list[psutil.Process]) -> None:
        for proc in processes:
            try:
                self._send(f"watch {proc.pid} {proc.create_time()!r}")
            except psutil.Error:
                pass

    def forget(self, pids) -> None:
        for pid in pids:
            self._send(f"forget {pid}")

    def remove_on_death(self, path: str) -> None:
        self._send(f"dir {path}")

    def keep(self, path: str) -> None:
        self._send(f"undir {path}")

    @property
    def pid(self) -> int:
        return self._process.pid


_reaper: Reaper | None = None


def reaper() -> Reaper:
    """This kernel's watchdog, started on first use."""
    global _reaper
    if _reaper is None or _reaper._process.poll() is not None:
        _reaper = Reaper()
    return _reaper


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the kernel's death ends us
    kernel = os.getppid()
    watched: dict[int, float] = {}
    folders: set[str] = set()
    pending = b""
    stdin = sys.stdin.fileno()
    # End of file says the kernel died; a new parent says the same when a child the kernel forked
    # (multiprocessing) still holds the pipe open.
    while os.getppid() == kernel:
        ready, _, _ = select.select([stdin], [], [], PARENT_POLL_S)
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            command, _, rest = line.decode().strip().partition(" ")
            if command == "watch":
                pid, created = rest.split()
                watched[int(pid)] = float(created)
            elif command == "forget":
                watched.pop(int(rest), None)
            elif command == "dir":
                folders.add(rest)
            elif command == "undir":
                folders.discard(rest)
    reap(watched, folders)


def reap(watched: dict[int, float], folders: set[str]) -> None:
    """Kill every watched process that is still the one we were told about, with its descendants."""
    same = []
    for pid, created in watched.items():
        try:
            if abs(psutil.Process(pid).create_time() - created) < 1e-3:
                same.append(pid)
        except psutil.Error:
            continue
    kill(processes_of(same))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
