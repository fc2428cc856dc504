"""The cluster's status and errors: what `%cluster status` shows, the exceptions a cluster raises,
and the sentences that tell the user what went wrong and how to recover.

Plain data and text, no processes: `cluster.Cluster` and its waits build these from what they see.
"""
from __future__ import annotations

import html
import os
import re
import signal
from dataclasses import asdict, dataclass

from ..errors import UsageError

SUBCOMMAND_HINT = "%cluster start -n 2 --simulate 4"


# --- errors -----------------------------------------------------------------------------------------
class ClusterError(UsageError):
    """The cluster failed (a process died, a wait timed out, the cluster is broken).

    A UsageError that says what to do (`%cluster restart`, or for a connected cluster how to get
    fresh engines), distinguishable by its type. IPython shows only an exact UsageError without a
    traceback, so `_render_traceback_` gives the one paragraph, not our own code's frames.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class ClusterCellError(Exception):
    """A user's own exception, raised in some of the cluster's processes.

    `str()` names the processes and the user's error (`ZeroDivisionError: division by zero`);
    IPython renders `_render_traceback_`: the first failing process's traceback, as the engine
    formatted it (the user's own error text, unchanged), under one line naming every failing process.
    """

    def __init__(self, processes: list[int], ename: str, evalue: str, traceback: str, notes: tuple[str, ...] = ()):
        self.processes = list(processes)
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback
        self.notes = tuple(notes)
        super().__init__(f"in {processes_text(processes)}: {ename}: {evalue}" + "".join(f"\n{n}" for n in notes))

    def _render_traceback_(self) -> list[str]:
        header = f"Error in {processes_text(self.processes)} of the cluster; the traceback of process {self.processes[0]}:"
        lines = (self.traceback or f"{self.ename}: {self.evalue}").splitlines()
        return [header, *lines, *self.notes]


def processes_text(ranks) -> str:
    """"process 1" or "processes 0, 2": the ranks as a sentence names them, in order."""
    ranks = sorted(ranks)
    return f"process {ranks[0]}" if len(ranks) == 1 else "processes " + ", ".join(map(str, ranks))


_NOT_DEFINED = re.compile(r"name '([^']+)' is not defined")


def explain_missing_name(message_or_name, kernel_namespace: dict) -> UsageError | None:
    """A UsageError for a name the cluster lacks but the kernel has, or None.

    Takes a NameError's message (`name 'x' is not defined`), a bare name, or a ClusterCellError
    (whose processes the error then names). Returns None when the name is unknown to the kernel
    too: that is the user's own NameError, which should propagate unchanged.
    """
    where = ""
    if isinstance(message_or_name, ClusterCellError):
        if message_or_name.ename != "NameError":
            return None
        where = f"in {processes_text(message_or_name.processes)}: "
        message_or_name = message_or_name.evalue
    text = str(message_or_name)
    found = _NOT_DEFINED.search(text)
    name = found.group(1) if found else (text if text.isidentifier() else None)
    if name is None or name not in kernel_namespace:
        return None
    return UsageError(
        f"{where}{name!r} is defined in the kernel but not on the cluster: cluster code runs in the cluster's "
        f"processes, which have names of their own. Send it with `%cluster push {name}` (a copy in every process, "
        f"as it is) or `%cluster scatter {name}` (an array split over all global devices by its leading axis)."
    )


def remote_error(errors: dict, notes: tuple) -> Exception:
    """One kernel-side error for failures in several processes (the first failing rank speaks)."""
    own = {rank: e for rank, e in errors.items() if e.ename != "KeyboardInterrupt"} or errors
    ranks = sorted(own)
    first = own[ranks[0]]
    if first.ename == "UsageError":
        return UsageError(f"in {processes_text(ranks)}: {first.evalue}" + "".join(f" {n}" for n in notes))
    return ClusterCellError(ranks, first.ename, first.evalue, first.traceback, notes)


# --- status --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessInfo:
    rank: int
    engine_id: int
    host: str
    pid: int
    platform: str
    local_devices: tuple[str, ...]
    local_device_ids: tuple[int, ...]


@dataclass(frozen=True)
class ClusterStatus:
    """What `%cluster status` shows; `_repr_pretty_` in a terminal, `_repr_html_` in a notebook."""

    state: str  # "running", "broken", "stopped", or "none" (no cluster in this kernel yet)
    why: str | None
    coordinator: str | None
    processes: tuple[ProcessInfo, ...]
    started_here: bool

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def device_count(self) -> int:
        return sum(len(p.local_device_ids) for p in self.processes)

    def headline(self) -> str:
        if self.state == "none":
            return f"no cluster in this kernel; start one with `{SUBCOMMAND_HINT}`"
        origin = "started here" if self.started_here else "connected"
        state = f"broken ({self.why})" if self.state == "broken" else self.state
        return (f"cluster {state}: {len(self.processes)} processes, {self.device_count} devices, "
                f"coordinator {self.coordinator}, {origin}")

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [(str(p.rank), p.host, str(p.pid), _devices_text(p)) for p in self.processes]

    def text(self) -> str:
        lines = [self.headline()]
        if self.processes and self.state != "stopped":
            table = [("rank", "host", "pid", "local devices"), *self.rows()]
            widths = [max(len(row[i]) for row in table) for i in range(3)]
            lines += ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3] for row in table]
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text())

    def _repr_html_(self) -> str:
        head = f"<div><b>{html.escape(self.headline())}</b></div>"
        if not self.processes or self.state == "stopped":
            return head
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in self.rows()
        )
        return (f'{head}<table class="jpm-cluster-status"><thead><tr><th>rank</th><th>host</th><th>pid</th>'
                f"<th>local devices</th></tr></thead><tbody>{cells}</tbody></table>")

    def __repr__(self) -> str:
        return self.text()


def _devices_text(process: ProcessInfo) -> str:
    ids = process.local_device_ids
    span = f"{ids[0]}-{ids[-1]}" if ids and list(ids) == list(range(ids[0], ids[-1] + 1)) else ", ".join(map(str, ids))
    return f"{len(ids)} {process.platform} (ids {span})"


# --- how to recover ---------------------------------------------------------------------------------
def recovery_advice(owned: bool, options: dict) -> str:
    """What brings a broken cluster back: a restart here (`owned`: started by this kernel), or
    fresh engines and a new connect with the same `options`."""
    if owned:
        return "Run `%cluster restart` (names defined on the cluster are lost)."
    return (f"This kernel did not start the engines, so `%cluster restart` cannot help: restart them "
            f"(`ipcluster stop`, then `ipcluster start`, or your scheduler's job), then run "
            f"`{connect_line(options)}` again in this kernel (names defined on the cluster are lost).")


def connect_line(options: dict) -> str:
    """The `%cluster connect ...` line that joins the same engines again."""
    words = ["%cluster connect"]
    for option, flag in (("profile", "--profile"), ("cluster_id", "--cluster-id"), ("n", "-n"),
                         ("coordinator", "--coordinator")):
        if options.get(option) is not None:
            words.append(f"{flag} {options[option]}")
    return " ".join(words)


def exit_reason(code: int | None) -> str:
    """How an engine ended, from its exit code (negative: the signal), as a sentence's predicate."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        cause = " (by hand, or by the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{cause}"
    return f"exited with status {code}" if code is not None else "died"


def engine_log_tail(profile_dir: str | None) -> str:
    """The last lines of the first two engine logs in a cluster's profile folder ("" without one)."""
    if profile_dir is None:
        return ""
    logs = os.path.join(profile_dir, "log")
    tails = []
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else ():
        if "engine" in name:
            with open(os.path.join(logs, name), errors="replace") as f:
                lines = [line.rstrip() for line in f.readlines()[-6:] if line.strip()]
            if lines:
                tails.append(f"\n{name}:\n  " + "\n  ".join(lines))
    return "".join(tails[:2])
