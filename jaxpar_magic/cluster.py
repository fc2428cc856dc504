"""A multi-process JAX cluster driven from the kernel: ipyparallel engines joined by jax.distributed.

    cluster = Cluster.start(2, simulate=4)      # 2 local processes x 4 CPU devices: 8 global devices
    cluster.execute("import jax; print(jax.process_index())")
    cluster.scatter({"x": np.arange(8.0)})      # a global jax.Array, each process holding its rows
    cluster.gather(["x"])["x"]                  # back as one numpy array
    cluster.stop()

Lifecycle: `start` (local engines, owned) or `connect` (existing engines) -> running -> broken(why)
-> `restart` / `stop`. One cluster per kernel; `current()` returns it.

Faults never hang the kernel: every wait has a timeout, local engines' pids are polled while waiting
(a killed engine is named within a poll), a timed-out cell interrupts the engines and marks the
cluster broken (JAX collectives do not recover from an interrupt). A KeyboardInterrupt in the kernel
interrupts the engines too; the cluster then checks itself with a tiny collective over every
process (`cluster_engine.probe`): it stays usable when the interrupted code was plain Python and is
marked broken when a collective was cut. `stop` ends the engines with a hard exit (JAX swallows
SIGTERM), kills what is left by pid, and a watchdog (`reaper.py`) does the same if the kernel dies
by a signal. The kernel's normal exit stops the cluster it started, never one it connected to.
"""
from __future__ import annotations

import atexit
import html
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass

from . import cluster_engine, hang_doctor, trees
from .errors import UsageError
from .progress import Progress

DEFAULT_TIMEOUT = 120.0  # a cell's limit when the caller gives none (%config JaxparMagics.cluster_timeout)
START_TIMEOUT = 60.0  # starting engines and joining jax.distributed
CLEANUP_TIMEOUT = 10.0  # commit/discard/restore after a cell
POLL_S = 0.05  # how often a wait looks at the engines' pids
FAIL_GRACE_S = 2.0  # once a process failed, how long the others may still run before they are interrupted
INTERRUPT_GRACE_S = 3.0  # how long interrupted engines get to answer
PROBE_TIMEOUT_S = 4.0  # the health check after an interrupt
HEARTBEAT_S = 10  # jax.distributed: a lost peer is noticed in seconds, not JAX's default minutes
SHUTDOWN_S = 3
STOP_WAIT_S = 1.0  # how long stop waits for a hard exit before it kills
SILENT_S = 3.0  # after a death on a cluster over several hosts: how long the other hosts get to answer
DOCTOR_S = 2.0  # how long a stuck process gets to say where it waits
REACH_S = 3.0  # connect: how long a host gets to reach the coordinator's port
ANSWER_S = 5.0  # connect: how long a registered engine gets to answer (a dead one never does)
AXIS_NAME = "i"  # the mesh axis of scattered arrays

SUBCOMMAND_HINT = "%cluster start -n 2 --simulate 4"

_current: Cluster | None = None
_last: Cluster | None = None  # the latest cluster, stopped or not: `%cluster status` / `restart` after a stop


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
        super().__init__(f"in {_processes(processes)}: {ename}: {evalue}" + "".join(f"\n{n}" for n in notes))

    def _render_traceback_(self) -> list[str]:
        header = f"Error in {_processes(self.processes)} of the cluster; the traceback of process {self.processes[0]}:"
        lines = (self.traceback or f"{self.ename}: {self.evalue}").splitlines()
        return [header, *lines, *self.notes]


def _processes(ranks) -> str:
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
        where = f"in {_processes(message_or_name.processes)}: "
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


# --- the cluster ------------------------------------------------------------------------------------
def current() -> Cluster | None:
    """The running or broken cluster of this kernel, or None."""
    return _current if _current is not None and _current.state != "stopped" else None


def last() -> Cluster | None:
    """The latest cluster of this kernel, even a stopped one (for status and restart)."""
    return _last


class Cluster:
    """A JAX multi-controller cluster of ipyparallel engines. Make one with `Cluster.start(...)`
    (local engines this kernel owns) or `Cluster.connect(...)` (engines started elsewhere)."""

    def __init__(self, *, owned: bool, options: dict):
        self._owned = owned
        self._options = dict(options)
        self._reset()

    def _reset(self) -> None:
        self.state = "stopped"
        self.why: str | None = None
        self.coordinator: str | None = None
        self.processes: tuple[ProcessInfo, ...] = ()
        self._global_devices: list[tuple[int, int]] = []
        self._ipp = None  # ipyparallel.Cluster, for clusters started here
        self._client = None
        self._views: dict[int, object] = {}
        self._engine_ids: list[int] = []  # rank -> engine id
        self._watched: list[tuple[int | None, object]] = []  # (rank or None while starting, psutil.Process)
        self._controller = None  # psutil.Process of the controller, for clusters started here
        self._profile_dir: str | None = None
        self._asking = False

    # --- making one -----------------------------------------------------------------------------
    @classmethod
    def start(cls, n: int, simulate: int | None = None, timeout: float | None = None) -> Cluster:
        """Start `n` local engines, each joining jax.distributed as its first act (coordinator on
        127.0.0.1), with `simulate` CPU devices each when given. `timeout`: the limit for the start
        itself (default 60 s). Shows progress in a notebook. The kernel owns these processes."""
        _refuse_second("start")
        _check_positive(n, "-n", "the number of processes")
        if simulate is not None:
            _check_positive(simulate, "--simulate", "CPU devices per process")
        cluster = cls(owned=True, options={"n": int(n), "simulate": simulate, "timeout": timeout})
        cluster._launch()
        return cluster

    @classmethod
    def connect(cls, profile: str | None = None, cluster_id: str | None = None, coordinator: str | None = None,
                timeout: float | None = None, n: int | None = None) -> Cluster:
        """Join the engines of an existing ipyparallel cluster (`ipcluster start ...`) into one JAX
        cluster. `coordinator` is HOST:PORT (or HOST) where rank 0's host is reachable from every
        other host; default: 127.0.0.1 when every engine runs on this host, else rank 0's hostname.
        Waits (up to `timeout`, default 60 s) for `n` engines, by default as many as ipcluster's
        cluster file says it launched. `stop` only disconnects: the engines keep running."""
        _refuse_second("connect")
        if coordinator is not None:
            _split_address(coordinator)
        if n is not None:
            _check_positive(n, "-n", "the number of engines to wait for")
        cluster = cls(owned=False, options={"profile": profile, "cluster_id": cluster_id, "n": n,
                                            "coordinator": coordinator, "timeout": timeout})
        cluster._join_existing()
        return cluster

    def _become_current(self) -> None:
        global _current, _last
        _current = _last = self
        self.state = "running"
        self.why = None

    def _launch(self) -> None:
        import ipyparallel as ipp
        import psutil

        from .reaper import processes_of, reaper

        n, simulate = self._options["n"], self._options["simulate"]
        timeout = self._options["timeout"] or START_TIMEOUT
        deadline = time.monotonic() + timeout
        keeper = reaper()
        # A private profile: no user ipcontroller/ipengine config changes what a local start does,
        # and the logs and connection files go away with the cluster.
        self._profile_dir = tempfile.mkdtemp(prefix="jaxpar-cluster-")
        keeper.remove_on_death(self._profile_dir)
        with Progress(f"starting engines 0/{n}") as progress:
            try:
                self._ipp = ipp.Cluster(n=n, profile_dir=self._profile_dir, controller_ip="127.0.0.1",
                                        shutdown_atexit=False, log_level=logging.ERROR, load_profile=False)
                self._ipp.start_controller_sync()
                self._controller = psutil.Process(self._ipp.controller.process.pid)
                keeper.watch(processes_of([self._controller.pid]))
                self._ipp.start_engines_sync(n)
                launchers = self._engine_launchers()
                self._watched = [(None, launcher.process) for launcher in launchers]
                keeper.watch([launcher.process for launcher in launchers])
                self._client = self._ipp.connect_client_sync()
                self._await_engines(n, deadline, progress)
                progress.update("joining jax.distributed")
                address = f"127.0.0.1:{_free_local_port()}"
                self._join(sorted(self._client.ids)[:n], address, address, simulate, deadline)
                # The nannies exist now: the watchdog must end them too.
                keeper.watch(processes_of([proc.pid for _, proc in self._watched]))
            except BaseException:
                self._teardown(graceful=False)
                raise

    def _engine_launchers(self) -> list:
        return [launcher for engine_set in self._ipp.engines.values() for launcher in engine_set.launchers.values()]

    def _await_engines(self, n: int, deadline: float, progress: Progress) -> None:
        shown = 0
        while True:
            have = len(self._client.ids)
            if have != shown:  # each update is a message to the front end: only when it changes
                progress.update(f"starting engines {have}/{n}")
                shown = have
            if have >= n:
                return
            self._check_alive("while starting")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"only {have} of {n} engines registered within {self._start_timeout():g} s. The machine may be "
                    f"busy: try again with a longer `--timeout`, or fewer processes.{self._log_tail()}"
                )
            time.sleep(0.1)  # library code polling a registration count, not a test

    def _start_timeout(self) -> float:
        return self._options.get("timeout") or START_TIMEOUT

    def _join(self, engine_ids: list[int], coordinator: str, bind: str | None, simulate: int | None,
              deadline: float) -> None:
        """Every engine joins jax.distributed at once (initialize blocks until all have)."""
        self._engine_ids = list(engine_ids)
        n = len(engine_ids)
        init_timeout = max(5, int(deadline - time.monotonic()))
        # Several local processes without --simulate: one GPU each, not every GPU in every process.
        split_gpus = self._owned and simulate is None and n > 1
        ars = self._submit(range(n), cluster_engine.join, per_rank=lambda rank: (
            rank, n, coordinator, bind, simulate, init_timeout, HEARTBEAT_S, SHUTDOWN_S,
            [rank] if split_gpus else None))
        outcome, _ = self._wait(ars, max(1.0, deadline - time.monotonic()) + 2, "joining jax.distributed")
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        if errors:
            first = min(errors)
            if errors[first].ename == "UsageError":
                raise UsageError(f"in {_processes(errors)}: {errors[first].evalue}")
            raise ClusterError(
                f"joining jax.distributed failed in {_processes(errors)}: {errors[first].ename}: "
                f"{errors[first].evalue}{self._log_tail()}"
            )
        facts = [outcome[rank][1] for rank in range(n)]
        platforms = {f["platform"] for f in facts}
        if len(platforms) > 1:
            each = ", ".join(f"process {f['rank']}: {f['platform']}" for f in facts)
            raise ClusterError(
                f"the processes run on different platforms ({each}): a host has fewer accelerators than processes "
                "on it, or some lack the drivers. Start no more processes per host than it has GPUs, or use "
                "`--simulate D` for CPU devices."
            )
        self.coordinator = facts[0]["coordinator"] or "unknown (joined before this kernel connected)"
        self.processes = tuple(
            ProcessInfo(rank=f["rank"], engine_id=eid, host=f["host"], pid=f["pid"], platform=f["platform"],
                        local_devices=tuple(f["local_devices"]), local_device_ids=tuple(f["local_device_ids"]))
            for f, eid in zip(facts, engine_ids)
        )
        self._global_devices = [tuple(d) for d in facts[0]["global_devices"]]
        self._watched = [(p.rank, proc) for p in self.processes if (proc := _local_process(p))]
        self._become_current()

    def _join_existing(self) -> None:
        import ipyparallel as ipp

        timeout = self._options["timeout"] or START_TIMEOUT
        deadline = time.monotonic() + timeout
        profile, cluster_id = self._options["profile"], self._options["cluster_id"]
        with Progress("connecting to the engines") as progress:
            try:
                self._client = ipp.Client(profile=profile or "default", cluster_id=cluster_id or "",
                                          timeout=min(timeout, 10))
            except (OSError, TimeoutError):
                which = f"profile {profile or 'default'!r}" + (f", cluster id {cluster_id!r}" if cluster_id else "")
                raise UsageError(
                    f"%cluster connect: no running ipyparallel cluster found for {which}. Start its "
                    "engines first, e.g. `ipcluster start -n 4 --engines=SSH --profile NAME`, then "
                    "`%cluster connect --profile NAME`."
                ) from None
            try:
                expected = self._expected_engines()
                engine_ids, places = self._answering(self._await_registration(expected, deadline, progress),
                                                     expected, deadline)
                self._engine_ids = engine_ids
                coordinator, bind = self._choose_coordinator(places, deadline)
                if len({place["host"] for place in places}) > 1:
                    progress.update("checking that every host reaches the coordinator")
                    self._check_addresses(places, coordinator, deadline)
                progress.update("joining jax.distributed")
                self._join(engine_ids, coordinator, bind, None, deadline)
            except BaseException:
                self._disconnect()
                raise

    def _expected_engines(self) -> int | None:
        """How many engines connect waits for: `n` when given, else the count in ipcluster's cluster file."""
        return self._options.get("n") or _launched_engine_count(self._options["profile"], self._options["cluster_id"])

    def _await_registration(self, expected: int | None, deadline: float, progress: Progress) -> list[int]:
        """The engine ids, once as many engines as expected (else one) have registered
        (`ipcluster start --daemonize` returns before they have)."""
        shown = None
        while True:
            have = len(self._client.ids)
            if have >= (expected or 1):
                return sorted(self._client.ids)
            if time.monotonic() > deadline:
                which = f"{expected}" if expected else "any"
                raise ClusterError(
                    f"%cluster connect: {have} engines registered, waiting for {which}, within "
                    f"{self._start_timeout():g} s. Check `ipcluster`'s log, or connect with a longer `--timeout`."
                )
            if have != shown:
                progress.update(f"waiting for engines {have}/{expected or '?'}")
                shown = have
            time.sleep(0.1)  # library code polling a registration count

    def _answering(self, engine_ids: list[int], expected: int | None, deadline: float) -> tuple[list[int], list]:
        """The registered engines that answer, and where each runs (`whereami`). A controller lists a
        dead engine until its heartbeat times out (half a minute), e.g. after a partition or when
        engines were restarted by hand: connect must not wait on those. With `expected` known, the
        first that many to answer will do; otherwise every engine gets ANSWER_S."""
        asks = {}
        for eid in engine_ids:
            try:
                asks[eid] = self._client[eid].apply_async(cluster_engine.whereami)
            except IndexError:  # dropped by the controller since we listed it
                continue
        until = min(deadline, time.monotonic() + ANSWER_S)
        while True:
            answered = sorted(eid for eid, ar in asks.items() if ar.ready())
            if len(answered) == len(asks) or (expected and len(answered) >= expected) or time.monotonic() > until:
                break
            next(ar for ar in asks.values() if not ar.ready()).wait(POLL_S)
        failed = [eid for eid in answered if not asks[eid].successful()]
        if failed:
            error = asks[failed[0]].exception()
            raise ClusterError(f"%cluster connect: engine {failed[0]} failed to answer: {type(error).__name__}: {error}")
        silent = [eid for eid in engine_ids if eid not in answered]
        if not answered or (expected and len(answered) < expected):
            raise ClusterError(
                f"%cluster connect: {len(engine_ids)} engines are registered, but only {len(answered)} answered within "
                f"{ANSWER_S:g} s (silent: engine{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}). The "
                "controller still lists engines that died until their heartbeat times out, or they are busy. Start "
                "the missing engines, or wait half a minute and connect again."
            )
        return answered, [asks[eid].get(0) for eid in answered]

    def _choose_coordinator(self, places: list[dict], deadline: float) -> tuple[str, str | None]:
        """Where rank 0 hosts the coordinator, and the address it binds (None: every interface)."""
        all_here = all(place["host"] == socket.gethostname() for place in places)
        given = self._options["coordinator"]
        host, port = _split_address(given) if given else ("127.0.0.1" if all_here else places[0]["host"], None)
        if port is None:
            ask = self._submit([0], cluster_engine.free_port)
            kind, port = self._wait(ask, deadline - time.monotonic(), "choosing a coordinator port")[0][0]
            if kind == "error":
                raise ClusterError(f"%cluster connect: process 0 could not find a free port: {port.evalue}. "
                                   "Give one with `--coordinator HOST:PORT`.")
        loopback = host in ("127.0.0.1", "localhost", "::1")
        return f"{host}:{port}", (f"{host}:{port}" if loopback else None)

    def _check_addresses(self, places: list[dict], coordinator: str, deadline: float) -> None:
        """Before JAX can hang or abort on them, on a cluster over several hosts: every host's own
        name must resolve to an address the others can dial (JAX's CPU collectives advertise it),
        and every other host must resolve the coordinator to a non-loopback address and reach its
        port (rank 0 listens on it for the check, then lets JAX have it)."""
        for place in places:
            problem = own_name_problem(place)
            if problem:
                raise UsageError(problem)
        host, port = _split_address(coordinator)
        rank0 = places[0]["host"]
        hint = (f"Pass `--coordinator ADDRESS:{port}` with {rank0}'s address as the other hosts see it"
                + (f" (its addresses: {', '.join(places[0]['interfaces'])})" if places[0]["interfaces"] else "") + ".")
        others = [rank for rank, place in enumerate(places) if place["host"] != rank0]
        listening, _ = self._wait(self._submit([0], cluster_engine.listen, port, REACH_S + 2),
                                  max(1.0, deadline - time.monotonic()), "opening the coordinator's port")
        if listening[0][0] == "error":
            error = listening[0][1]
            raise UsageError(f"%cluster connect: rank 0 on {rank0} cannot listen on port {port} ({error.ename}: "
                             f"{error.evalue}). Pass `--coordinator {host}:PORT` with a free port.")
        try:
            asks = self._submit(others, cluster_engine.reach, host, port, REACH_S)
            outcome, _ = self._wait(asks, min(REACH_S + 5, max(1.0, deadline - time.monotonic())),
                                    "checking the coordinator's address")
        finally:
            self._submit([0], cluster_engine.stop_listening)  # runs before the join: engines keep the order
        for rank in others:
            kind, answer = outcome[rank]
            there = places[rank]["host"]
            if kind == "error":
                raise ClusterError(f"%cluster connect: process {rank} on {there} failed to check the coordinator's "
                                   f"address: {answer.ename}: {answer.evalue}")
            loopback = [a for a in answer["addresses"] if _loopback(a)]
            if loopback:
                raise UsageError(
                    f"%cluster connect: on {there}, the coordinator `{host}` resolves to {', '.join(loopback)}, a "
                    f"loopback address: {there} would dial itself instead of {rank0}, where rank 0 hosts JAX's "
                    f"coordinator. {hint}"
                )
            if answer["error"]:
                raise UsageError(
                    f"%cluster connect: from {there}, {answer['error']}: JAX's coordinator on {rank0} (rank 0) would "
                    f"never be reached, and joining would hang until its timeout. Check the name and the firewall "
                    f"between the hosts. {hint}"
                )

    # --- lifecycle -----------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        """Processes (rank, host, pid, local devices), coordinator, state (running/broken(why)/stopped)."""
        if self.state == "running":
            try:
                self._check_alive()
            except ClusterError:
                pass  # now broken, which is what the status shows
        return ClusterStatus(self.state, self.why, self.coordinator, self.processes, self._owned)

    def stop(self) -> None:
        """Stop: a cluster started here ends every process (engines, nannies, controller), in well
        under a second when the engines are idle and a few seconds at most when they are stuck; a
        connected one only disconnects, its engines keep running. Stopping twice is harmless."""
        global _current
        if self.state == "stopped" and self._client is None:
            return
        try:
            if self._owned:
                self._teardown(graceful=self.state == "running")
            else:
                self._disconnect()
        finally:
            self.state, self.why = "stopped", None
            if _current is self:
                _current = None

    def restart(self, timeout: float | None = None) -> None:
        """Stop, then start again with the same options (a cluster started here only); `timeout`
        replaces the start's limit. Every name defined on the cluster is lost."""
        if not self._owned:
            raise UsageError(
                "%cluster restart: this cluster was connected to, not started here, so its engines are not "
                "this kernel's to restart. Restart them with `ipcluster stop` / `ipcluster start`, then "
                "`%cluster connect` again."
            )
        other = current()
        if other is not None and other is not self:
            raise UsageError("%cluster restart: another cluster is running in this kernel; `%cluster stop` it first.")
        if timeout is not None:
            self._options["timeout"] = timeout
        self.stop()
        self._reset()
        self._launch()

    def _teardown(self, graceful: bool) -> None:
        """End every process of a cluster started here: engines by a hard exit, then by pid."""
        from .reaper import kill, processes_of, reaper, wait_gone

        engines = [proc for _, proc in self._watched]
        family = processes_of([proc.pid for proc in engines])  # the engines and their nannies
        if graceful and self._client is not None:
            for rank in range(len(self._engine_ids)):
                try:
                    self._view(rank).apply_async(cluster_engine.hard_exit)
                except Exception:  # a dead engine or controller: the kill below covers it
                    pass
            wait_gone(engines, STOP_WAIT_S)
        kill(family)  # stuck engines, and the nannies, which take over a second to notice on their own
        if self._controller is not None:
            controller = processes_of([self._controller.pid])
            survivors = kill(controller, signal.SIGTERM, wait=STOP_WAIT_S)
            if survivors:
                kill(survivors)
        self._disconnect()
        keeper = reaper()
        keeper.forget([proc.pid for _, proc in self._watched] + ([self._controller.pid] if self._controller else []))
        if self._profile_dir is not None:
            shutil.rmtree(self._profile_dir, ignore_errors=True)
            keeper.keep(self._profile_dir)

    def _disconnect(self) -> None:
        if self._client is not None:
            try:
                self._client.close(linger=0)
            except Exception:  # closing a client whose controller is gone must not mask the real error
                pass
        self._client = None
        self._views = {}

    # --- running code -------------------------------------------------------------------------
    def execute(self, code: str, targets=None, timeout: float | None = None) -> None:
        """Run plain code in every process (or the ranks in `targets`), like ipyparallel's %%px.

        stdout/stderr and the final expression's value are printed labelled `[process R]`. When the
        code fails in any process, every targeted process's namespace is restored (rebindings undone,
        new names removed; objects mutated in place stay mutated) and one error names the processes.
        """
        ranks = self._ranks(targets)
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self._submit(ranks, cluster_engine.snapshot)  # runs before the cell: engines keep the order
        runs = self._submit_execute(ranks, code)
        relay = _Relay(runs)
        try:
            outcome, notes = self._wait(runs, timeout, "the cell", relay=relay)
        except (KeyboardInterrupt, ClusterError):
            if self.state == "running":  # interrupted, or timed out, in plain Python: roll back
                self._settle(ranks, cluster_engine.restore)
            raise
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        if errors:
            if self.state == "running":
                self._settle(ranks, cluster_engine.restore)
            raise _remote_error(errors, notes)
        relay.show_results()
        self._submit(ranks, cluster_engine.forget_snapshot)  # not waited: engines run requests in order

    def call(self, func_path: str, *args, targets=None, timeout: float | None = None) -> list:
        """Run `module:function` in every process (or `targets`) as `func(namespace, *args)`, two-phase.

        The function returns `(reply, bindings)`. Only when every targeted process succeeded are the
        bindings committed (`namespace.update(bindings)`) everywhere; otherwise all are discarded.
        Returns the replies in rank order. A UsageError raised on engines arrives as one UsageError
        naming the processes; any other exception as one ClusterCellError.
        """
        ranks = self._ranks(targets)
        return self._call(func_path, {rank: args for rank in ranks}, timeout)

    def _call(self, func_path: str, args_by_rank: dict[int, tuple], timeout: float | None) -> list:
        self._require_running()
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        token = uuid.uuid4().hex
        ranks = list(args_by_rank)
        ars = self._submit(ranks, cluster_engine.run_phase,
                           per_rank=lambda rank: (token, func_path, *args_by_rank[rank]))
        try:
            outcome, notes = self._wait(ars, timeout, "the cluster call", relay=_Relay(ars))
        except (KeyboardInterrupt, ClusterError):
            if self.state == "running":
                self._settle(ranks, cluster_engine.discard, token)
            raise
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        pending = [rank for rank, (kind, value) in outcome.items() if kind == "ok" and value["pending"]]
        if errors:
            if self.state == "running" and pending:
                self._settle(pending, cluster_engine.discard, token)
            raise _remote_error(errors, notes)
        if pending:
            # Not waited: an engine runs requests in the order sent, so whatever the kernel sends next
            # sees the names; a dict update cannot fail, and an engine that dies is named by the next wait.
            self._submit(pending, cluster_engine.commit, token)
        return [outcome[rank][1]["reply"] for rank in ranks]

    def _settle(self, ranks, func, *args) -> None:
        """Phase two (commit/discard) or a rollback, on the ranks that need it; waited, with a timeout."""
        outcome, _ = self._wait(self._submit(ranks, func, *args), CLEANUP_TIMEOUT, "settling the cell")
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        if errors:
            raise _remote_error(errors, ())

    # --- moving data ----------------------------------------------------------------------------
    def push(self, values: dict, targets=None, timeout: float | None = None) -> None:
        """Copy kernel values to every process (or `targets`) as they are, under their names. A
        pytree (dict, registered dataclass, Equinox module, optax state) is rebuilt as the same type
        there; its jax.Array leaves become jax.Arrays of each process."""
        import jax
        import numpy as np

        packed = {}
        for name, value in dict(values).items():
            structure, leaves = trees.flatten(name, value)
            unsendable = _unsendable({path: leaf for path, leaf in leaves})
            if unsendable:
                path, problem = unsendable[0]
                raise UsageError(f"%cluster push: {trees.label(path, name)} cannot be sent to the engines ({problem}). "
                                 "Push what it is made of, or build it on the cluster in a %%cluster cell.")
            packed[name] = (structure, [("jax", np.asarray(leaf)) if isinstance(leaf, jax.Array)
                                        else ("value", trees.canned(leaf)) for _, leaf in leaves])
        self._push_packed({rank: packed for rank in self._ranks(targets)}, timeout)

    def scatter(self, values: dict, timeout: float | None = None) -> None:
        """Turn kernel arrays into global jax.Arrays of the same shape on the cluster: the leading
        axis is split over all global devices (1-D mesh axis "i", in `jax.devices()` order) and each
        process receives and holds only its own devices' rows
        (`jax.make_array_from_process_local_data`). Any pytree works: each array leaf is split so
        (a 0-d leaf is replicated on every device), other leaves are sent as they are, and the same
        type is rebuilt in every process."""
        import numpy as np

        self._require_running()
        device_count = len(self._global_devices)
        positions = {rank: [k for k, (_, process) in enumerate(self._global_devices) if process == rank]
                     for rank in range(len(self.processes))}
        packed: dict[int, dict] = {rank: {} for rank in positions}
        for name, value in values.items():
            structure, leaves = trees.flatten(name, value)
            entries: dict[int, list] = {rank: [] for rank in positions}
            for path, leaf in leaves:
                whole_value = path == name  # not inside a pytree: it must be an array (as before pytrees)
                if not whole_value and not trees.is_array(leaf):
                    for rank in positions:
                        entries[rank].append(("value", trees.canned(leaf)))
                    continue
                array = np.asarray(leaf)
                if array.ndim == 0 and not whole_value:  # a pytree's scalar (optax's count): on every device
                    for rank in positions:
                        entries[rank].append(("whole", array))
                    continue
                rows = array.shape[0] if array.ndim else None
                if rows is None or rows % device_count:
                    have = f"has {rows} rows, which do not split" if rows is not None else "is a scalar, which does not split"
                    raise UsageError(
                        f"%cluster scatter {name}: {trees.label(path, name)} {have} over the cluster's {device_count} "
                        f"devices ({len(self.processes)} processes): scatter splits the leading axis evenly, so it "
                        f"needs a multiple of {device_count} rows. Pad or trim it, or send it whole with "
                        f"`%cluster push {name}`."
                    )
                per_device = rows // device_count
                for rank, places in positions.items():
                    local = np.concatenate([array[k * per_device:(k + 1) * per_device] for k in places])
                    entries[rank].append(("rows", local, array.shape))
            for rank in positions:
                packed[rank][name] = (structure, entries[rank])
        self._push_packed(packed, timeout)

    def _push_packed(self, packed_by_rank: dict[int, dict], timeout: float | None) -> None:
        self._call("jaxpar_magic.cluster_engine:import_trees",
                   {rank: (packed, AXIS_NAME) for rank, packed in packed_by_rank.items()}, timeout)

    def gather(self, names, timeout: float | None = None) -> dict:
        """Bring cluster values into the kernel: a global jax.Array as one numpy array of its global
        shape (assembled from each process's replica-0 shards), anything else as a list with one
        value per process. A pytree with global jax.Array leaves comes back as one value of the same
        type, those leaves assembled and the others taken from process 0. An unknown name is a
        UsageError."""
        names = [names] if isinstance(names, str) else list(names)
        replies = self.call("jaxpar_magic.cluster_engine:export_values", names, timeout=timeout)
        gathered = {}
        for name in names:
            items = [reply[name] for reply in replies]
            missing = [rank for rank, item in enumerate(items) if item[0] == "missing"]
            if len(missing) == len(items):
                raise UsageError(
                    f"%cluster gather {name}: {name!r} is not defined on the cluster (in none of its {len(items)} "
                    "processes). Define it in a cluster cell first, or check the spelling."
                )
            if missing:
                raise UsageError(
                    f"%cluster gather {name}: {name!r} is defined in some processes but not in {_processes(missing)}; "
                    "gather needs it in every process."
                )
            bad = [(rank, path, entry) for rank, item in enumerate(items) for path, entry in item[2]
                   if entry[0] == "unsendable"]
            if bad:
                _, path, (_, kind, problem) = bad[0]
                ranks = sorted({rank for rank, p, _ in bad if p == path})
                raise UsageError(
                    f"%cluster gather {name}: {trees.label(path, name)} is a {kind} in {_processes(ranks)}, which "
                    f"cannot be sent to the kernel ({problem}). Gather something picklable made from it (e.g. a "
                    "list or an array)."
                )
            if any(entry[0] == "global" for _, entry in items[0][2]):
                leaves = [_assemble(path, [item[2][k][1] for item in items]) if entry[0] == "global"
                          else trees.uncanned(entry[1]) for k, (path, entry) in enumerate(items[0][2])]
                gathered[name] = trees.rebuild(name, items[0][1], leaves)
            else:
                gathered[name] = [trees.rebuild(name, item[1], [trees.uncanned(entry[1]) for _, entry in item[2]])
                                  for item in items]
        return gathered

    # --- the waiting machinery ---------------------------------------------------------------------
    def _ranks(self, targets) -> list[int]:
        self._require_running()
        count = len(self.processes)
        if targets is None:
            return list(range(count))
        chosen = [targets] if isinstance(targets, int) else list(targets)
        wrong = [rank for rank in chosen if not isinstance(rank, int) or not 0 <= rank < count]
        if wrong or not chosen:
            raise UsageError(f"--targets {wrong[0] if wrong else ''}: the cluster's ranks are 0 to {count - 1}.")
        return sorted(set(chosen))

    def _require_running(self) -> None:
        if self.state == "running":
            self._check_alive()
        if self.state == "broken":
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()} Or `%cluster stop`.")
        if self.state == "stopped":
            raise UsageError(f"no cluster is running; start one with `{SUBCOMMAND_HINT}`.")

    def _break(self, why: str) -> None:
        if self.state != "stopped":
            self.state, self.why = "broken", why

    def _view(self, rank: int):
        view = self._views.get(rank)
        if view is None:
            view = self._views[rank] = self._client[self._engine_ids[rank]]
        return view

    def _submit(self, ranks, func, *args, per_rank=None) -> dict:
        """`func(*args)` applied on each rank, not waited; `per_rank(rank)` gives each rank its own args."""
        try:
            return {rank: self._view(rank).apply_async(func, *(per_rank(rank) if per_rank else args))
                    for rank in ranks}
        except IndexError:  # ipyparallel's "No such engine": the controller dropped a dead engine
            self._check_alive()
            self._break("an engine is gone from the ipyparallel controller")
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()}") from None

    def _submit_execute(self, ranks, code: str) -> dict:
        try:
            return {rank: self._view(rank).execute(code, silent=False, block=False) for rank in ranks}
        except IndexError:
            self._check_alive()
            self._break("an engine is gone from the ipyparallel controller")
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()}") from None

    def _wait(self, ars: dict, timeout: float, what: str, relay: _Relay | None = None) -> tuple[dict, tuple]:
        """Every rank's outcome, ("ok", value) or ("error", RemoteError), within `timeout` seconds.

        Raises ClusterError (and marks the cluster broken) when a process dies or the time runs out;
        on KeyboardInterrupt interrupts the engines, checks the cluster, and re-raises. Once a process
        has failed, the others get FAIL_GRACE_S more before they are interrupted: they are most
        likely waiting in a collective the failed one never reached. Returns (outcome, notes).
        """
        deadline = time.monotonic() + timeout
        outcome: dict[int, tuple] = {}
        notes: list[str] = []
        failed_at = None
        pending = list(ars)
        try:
            while True:
                for rank in pending:
                    if ars[rank].ready():
                        outcome[rank] = self._outcome(rank, ars[rank])
                if relay is not None:
                    relay.pump()
                pending = [rank for rank in ars if rank not in outcome]
                if not pending:
                    break
                self._check_alive()
                now = time.monotonic()
                if failed_at is None and any(kind == "error" for kind, _ in outcome.values()):
                    failed_at = now
                if failed_at is not None and now - failed_at > FAIL_GRACE_S:
                    notes += self._stop_stragglers(pending, ars, outcome)
                    break
                if now > deadline:
                    self._time_out(pending, ars, timeout, what)
                ars[pending[0]].wait(min(POLL_S, max(deadline - now, 0.001)))
        except KeyboardInterrupt:
            self._after_interrupt(pending, ars)
            raise
        finally:
            if relay is not None:
                relay.finish()
        return outcome, tuple(notes)

    def _outcome(self, rank: int, ar) -> tuple:
        from ipyparallel.error import EngineError, RemoteError

        try:
            return "ok", ar.get(0)
        except RemoteError as error:
            return "error", error
        except EngineError:
            self._check_alive()  # names the death with its cause where the engine is local
            self._dies(rank, "stopped answering (ipyparallel lost the engine)")
            raise  # not reached: _dies raises

    def _check_alive(self, when: str = "") -> None:
        """Raise ClusterError, marking the cluster broken, if a watched local process has died."""
        for rank, proc in self._watched:
            if not _alive(proc):
                if rank is None:
                    raise ClusterError(f"an engine exited {when}: {self._exit_reason(proc.pid)}.{self._log_tail()}")
                self._dies(rank, self._exit_reason(proc.pid))
        if self._controller is not None and not _alive(self._controller):
            self._break("the ipyparallel controller died")
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()}")

    def _dies(self, rank: int, reason: str) -> None:
        process = self.processes[rank] if rank < len(self.processes) else None
        where = f" (pid {process.pid} on {process.host})" if process else ""
        silent = self._silent_hosts(exclude=rank) if self.state == "running" else ""
        self._break(f"process {rank}{where} {reason}" + (f"; {silent} stopped answering" if silent else ""))
        cause = ""
        if silent:
            cause = (f" {silent} stopped answering as well, so most likely the network to {silent} is down (or the "
                     f"host is): JAX ends a process whose peers are silent for {HEARTBEAT_S} s.")
        raise ClusterError(
            f"process {rank}{where} {reason}.{cause} The cluster is broken: its other processes cannot run "
            f"collectives without it. {self._recovery()}"
        )

    def _silent_hosts(self, exclude: int) -> str:
        """On a cluster over several hosts: the hosts none of whose other processes answer a tiny
        request within SILENT_S (a partition, or a host that went down), as "hostb" or "hostb, hostc"."""
        hosts = {p.host for p in self.processes}
        others = [p.rank for p in self.processes if p.rank != exclude]
        if len(hosts) < 2 or not others or self._client is None or self._asking:
            return ""
        self._asking = True  # a submit that finds another dead engine names it without asking again
        try:
            asks = self._submit(others, cluster_engine.whereami)
        except ClusterError:
            return ""
        finally:
            self._asking = False
        until = time.monotonic() + SILENT_S
        while time.monotonic() < until and not all(ar.ready() for ar in asks.values()):
            next(ar for ar in asks.values() if not ar.ready()).wait(POLL_S)
        answering = {self.processes[rank].host for rank, ar in asks.items() if ar.ready() and ar.successful()}
        silent = sorted({self.processes[rank].host for rank in others} - answering)
        return ", ".join(silent)

    def _on_host(self, rank: int) -> str:
        return f" (on {self.processes[rank].host})" if rank < len(self.processes) else ""

    def _recovery(self) -> str:
        """What brings a broken cluster back: a restart here, or fresh engines and a new connect."""
        if self._owned:
            return "Run `%cluster restart` (names defined on the cluster are lost)."
        return (f"This kernel did not start the engines, so `%cluster restart` cannot help: restart them "
                f"(`ipcluster stop`, then `ipcluster start`, or your scheduler's job), then run "
                f"`{self._connect_line()}` again in this kernel (names defined on the cluster are lost).")

    def _connect_line(self) -> str:
        words = ["%cluster connect"]
        for option, flag in (("profile", "--profile"), ("cluster_id", "--cluster-id"), ("n", "-n"),
                             ("coordinator", "--coordinator")):
            if self._options.get(option) is not None:
                words.append(f"{flag} {self._options[option]}")
        return " ".join(words)

    def _exit_reason(self, pid: int) -> str:
        code = self._exit_code(pid)
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            cause = " (by hand, or by the out-of-memory killer)" if -code == signal.SIGKILL else ""
            return f"was killed by {name}{cause}"
        return f"exited with status {code}" if code is not None else "died"

    def _exit_code(self, pid: int) -> int | None:
        """The exit code ipyparallel's launcher recorded for an engine, if it has. Best effort: the
        launcher records it on its event loop, which runs in a notebook kernel, not in a plain script."""
        until = time.monotonic() + 0.3
        while self._ipp is not None:
            for engine_set in self._ipp.engines.values():
                for stopped in (engine_set.stop_data or {}).get("engines", {}).values():
                    if stopped.get("pid") == pid:
                        return stopped.get("exit_code")
            if time.monotonic() > until:
                return None
            time.sleep(0.02)
        return None

    def _log_tail(self) -> str:
        if self._profile_dir is None:
            return ""
        logs = os.path.join(self._profile_dir, "log")
        tails = []
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else ():
            if "engine" in name:
                with open(os.path.join(logs, name), errors="replace") as f:
                    lines = [line.rstrip() for line in f.readlines()[-6:] if line.strip()]
                if lines:
                    tails.append(f"\n{name}:\n  " + "\n  ".join(lines))
        return "".join(tails[:2])

    def _interrupt(self, ranks) -> None:
        self._signal(ranks, signal.SIGINT)

    def _signal(self, ranks, sig: int) -> None:
        """Signal local engines by pid at once, others through their nanny (via the controller)."""
        for rank in ranks:
            proc = dict((r, p) for r, p in self._watched if r is not None).get(rank)
            try:
                if proc is not None:
                    proc.send_signal(sig)
                elif self._client is not None:
                    self._client.send_signal(sig, targets=[self._engine_ids[rank]], block=False)
            except Exception:  # a process that is already gone cannot be signalled; the next check names it
                pass

    def _settled_after_interrupt(self, pending, ars, outcome) -> list[int]:
        """Wait INTERRUPT_GRACE_S for interrupted ranks; returns those that never answered."""
        until = time.monotonic() + INTERRUPT_GRACE_S
        silent = list(pending)
        while silent and time.monotonic() < until:
            for rank in list(silent):
                if ars[rank].ready():
                    outcome[rank] = self._outcome(rank, ars[rank])
                    silent.remove(rank)
            if silent:
                ars[silent[0]].wait(POLL_S)
        return silent

    def _healthy(self) -> bool:
        """After an interrupt: does a tiny collective over every process still finish? If not, the
        interrupt cut a collective and JAX's cluster cannot be used again (the probe is then stuck
        too: the cluster is broken, and restart or stop kill the engines by pid)."""
        if len(self.processes) < 2:
            return True  # no other process to have cut a collective with
        probes = self._submit(range(len(self.processes)), cluster_engine.probe)
        until = time.monotonic() + PROBE_TIMEOUT_S
        while time.monotonic() < until:
            self._check_alive()
            if all(ar.ready() for ar in probes.values()):
                return all(self._outcome(rank, ar)[0] == "ok" for rank, ar in probes.items())
            next(iter(probes.values())).wait(POLL_S)
        self._interrupt([rank for rank, ar in probes.items() if not ar.ready()])
        return False

    def _stop_stragglers(self, pending, ars, outcome) -> list[str]:
        self._interrupt(pending)
        silent = self._settled_after_interrupt(pending, ars, outcome)
        was = "was" if len(pending) == 1 else "were"
        still = f"{_processes(pending)} {was} still running {FAIL_GRACE_S:g} s after the failure and {was} interrupted"
        if silent or not self._healthy():
            self._break(f"{_processes(pending)} {was} interrupted after the others failed, most likely inside a "
                        "collective the failed processes never reached, and JAX's cluster cannot recover from that")
            return [f"{still}, which cut a collective: the cluster is broken. {self._recovery()}"]
        return [f"{still}."]

    def _time_out(self, pending, ars, timeout: float, what: str) -> None:
        """The time ran out: interrupt the engines still busy, then keep the cluster if a probe
        collective still works (a slow plain-Python cell) or mark it broken (a cut collective)."""
        waits = self._where_they_wait(pending, ars)
        self._interrupt(pending)
        done = [rank for rank in ars if rank not in pending]
        finished = f" ({_processes(done)} had finished)" if done else ""
        try:
            usable = not self._settled_after_interrupt(pending, ars, {}) and self._healthy()
        except ClusterError:
            usable = False
        if usable:
            raise ClusterError(
                f"no answer from {_processes(pending)} within the {timeout:g} s timeout{finished}, so the cell was "
                f"interrupted.{waits} It was plain Python, not a collective, so the cluster is still usable; give a slow "
                "cell more time with `--timeout S` (or `%config JaxparMagics.cluster_timeout`)."
            )
        self._break(f"{what} ran past its {timeout:g} s timeout in {_processes(pending)}, and interrupting it "
                    "cut a collective")
        raise ClusterError(
            f"no answer from {_processes(pending)} within the {timeout:g} s timeout{finished}.{waits} A collective "
            "that not every process reaches (a psum under `if jax.process_index() == 0:`) waits forever. The engines "
            "were interrupted, and an interrupted JAX collective cannot recover, so the cluster is broken. "
            f"{self._recovery()} A cell that is merely slow needs a longer `--timeout S` (or "
            "`%config JaxparMagics.cluster_timeout`)."
        )

    def _where_they_wait(self, pending, ars) -> str:
        """" Process 0 waits at line 5 of the cell (`...`), ...": each stuck process is asked (SIGUSR1,
        answered by `hang_doctor` from a thread of its own) and its report read from its output."""
        from . import hang_doctor

        self._signal(pending, hang_doctor.SIGNAL)
        until = time.monotonic() + DOCTOR_S
        reports: dict[int, list] = {}
        while time.monotonic() < until and len(reports) < len(pending):
            for rank in pending:
                if rank not in reports:
                    frames = hang_doctor.read_report(_stream_text(ars[rank], "stderr"))
                    if frames is not None:
                        reports[rank] = frames
            time.sleep(POLL_S)  # the reports arrive with the requests' output, not as replies
        hosts = {p.host for p in self.processes}
        said = [f" Process {rank}{self._on_host(rank) if len(hosts) > 1 else ''} waits {text}." for rank in pending
                if (text := hang_doctor.describe(reports.get(rank, [])))]
        return "".join(said)

    def _after_interrupt(self, pending, ars) -> None:
        """The kernel was interrupted mid-wait: interrupt the engines, then keep or break the cluster."""
        if not pending or self.state != "running":
            return
        self._interrupt(pending)
        try:
            silent = self._settled_after_interrupt(pending, ars, {})
            usable = not silent and self._healthy()
        except ClusterError:
            usable = False
        if usable:
            print(f"interrupted {_processes(pending)}; the cluster is still usable.", file=sys.stderr)
        else:
            self._break(f"an interrupt cut {_processes(pending)} in the middle of a collective")
            print(f"interrupted {_processes(pending)} in the middle of a collective: the cluster is broken. "
                  f"{self._recovery()}", file=sys.stderr)

    def __repr__(self) -> str:
        return f"<Cluster {self.status().headline()}>"


def _stream_text(ar, stream: str) -> str:
    try:
        text = ar[stream]
    except Exception:  # metadata not there yet (the request is still being sent)
        return ""
    return text if isinstance(text, str) else "".join(text)


class _Relay:
    """Prints the engines' stdout/stderr while they arrive, each line labelled `[process R]`."""

    def __init__(self, ars: dict):
        self._ars = ars
        self._seen: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}

    def pump(self, final: bool = False) -> None:
        for rank, ar in self._ars.items():
            for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                key = (rank, stream)
                text = _stream_text(ar, stream)
                fresh = self._partial.get(key, "") + text[self._seen.get(key, 0):]
                self._seen[key] = len(text)
                lines = fresh.split("\n")
                self._partial[key] = "" if final else lines.pop()
                if final and lines and lines[-1] == "":
                    lines.pop()
                for line in lines:  # (Gloo's chatter never gets here: the engines filter it at the source)
                    if not line.startswith(hang_doctor.MARK):
                        out.write(f"[process {rank}] {line}\n")

    def finish(self) -> None:
        until = time.monotonic() + 1.0
        for ar in self._ars.values():
            if ar.ready():  # output of a finished request trails its reply by a moment
                ar.wait_for_output(max(0.0, until - time.monotonic()))
        self.pump(final=True)

    def show_results(self) -> None:
        """The final expression's value and displays of a %%cluster cell, labelled by process."""
        from IPython.display import publish_display_data

        for rank, ar in self._ars.items():
            for output in ar["outputs"] or ():
                data = {k: v for k, v in output.get("data", {}).items() if "widget" not in k}
                if data:
                    print(f"[process {rank}]")
                    publish_display_data(data, output.get("metadata", {}))
            result = ar["execute_result"]
            if result:
                text = result.get("data", {}).get("text/plain", "")
                lines = text.splitlines() or [""]
                print(f"[process {rank}] Out: {lines[0]}")
                for line in lines[1:]:
                    print(f"[process {rank}]      {line}")


def _remote_error(errors: dict, notes: tuple) -> Exception:
    """One kernel-side error for failures in several processes (the first failing rank speaks)."""
    own = {rank: e for rank, e in errors.items() if e.ename != "KeyboardInterrupt"} or errors
    ranks = sorted(own)
    first = own[ranks[0]]
    if first.ename == "UsageError":
        return UsageError(f"in {_processes(ranks)}: {first.evalue}" + "".join(f" {n}" for n in notes))
    return ClusterCellError(ranks, first.ename, first.evalue, first.traceback, notes)


def _assemble(name: str, items: list) -> object:
    import numpy as np

    shape = items[0][1]
    shards = [shard for item in items for shard in item[3]]
    dtype = shards[0][1].dtype if shards else np.dtype(items[0][2])
    out = np.empty(shape, dtype)
    filled = 0
    for index, data in shards:
        out[index] = data
        filled += data.size
    if filled != out.size:
        raise ClusterError(f"%cluster gather {name}: the processes' shards cover {filled} of {out.size} elements.")
    return out


def _unsendable(values: dict) -> list[tuple[str, str]]:
    """(name, why) of the values ipyparallel cannot serialize, checked the way it sends them."""
    from ipyparallel.serialize import serialize_object

    bad = []
    for name, value in values.items():
        try:
            serialize_object(value)
        except Exception as error:  # whatever stops a value from travelling is what the user must hear
            bad.append((name, f"{type(error).__name__}: {error}"))
    return bad


def _alive(proc) -> bool:
    from .reaper import gone

    return not gone(proc)


def _local_process(process: ProcessInfo):
    """The psutil handle of an engine on this host (pids are polled to notice a death at once)."""
    import psutil

    if process.host != socket.gethostname():
        return None
    try:
        return psutil.Process(process.pid)
    except psutil.Error:
        return None


def _launched_engine_count(profile: str | None, cluster_id: str | None) -> int | None:
    """How many engines `ipcluster start` launched, from the cluster file it leaves; None without one."""
    import ipyparallel as ipp

    try:
        launched = ipp.Cluster.from_file(profile=profile or "default", cluster_id=cluster_id or "",
                                         shutdown_atexit=False)
    except Exception:  # no cluster file (engines started by hand with ipengine), or a stale one: count what came
        return None
    return sum(engine_set.n for engine_set in launched.engines.values()) or None


def own_name_problem(place: dict) -> str | None:
    """The UsageError's text when a host's own name (from `cluster_engine.whereami`) resolves to
    nothing, or to loopback first: JAX's CPU collectives (Gloo) advertise the first address its
    own name resolves to, so the other hosts would dial themselves. None when it is fine."""
    host, own = place["host"], place["own_addresses"]
    first = own[0] if own else "nothing"
    if _loopback(first) is False:
        return None
    fix = ", ".join(place["interfaces"]) or "its network address"
    said = (f"resolves to {first} first, a loopback address" if _loopback(first) else f"does not resolve there ({first})")
    return (f"%cluster connect: on {host}, the host's own name `{host}` {said}. JAX's CPU collectives (Gloo) "
            "advertise the address of a host's own name to the other hosts, which could then not dial it. Map "
            f"`{host}` to {fix} in /etc/hosts on {host} (Debian maps a machine's own name to 127.0.1.1; containers "
            "often have no entry at all), restart its engine, and connect again.")


def _loopback(text: str) -> bool | None:
    """Whether an address is loopback; None for text that is no address (an error's text)."""
    import ipaddress

    try:
        return ipaddress.ip_address(text.split("%")[0]).is_loopback
    except ValueError:
        return None


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split_address(address: str) -> tuple[str, int | None]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, None
    if not host or not port.isdigit():
        raise UsageError(f"--coordinator {address}: give HOST:PORT (e.g. `node0.cluster:12355`) or just HOST, "
                         "where HOST is how the other hosts reach rank 0's host.")
    return host, int(port)


def _check_positive(value, option: str, meaning: str) -> None:
    if not isinstance(value, int) or value < 1:
        raise UsageError(f"{option} {value}: {meaning} must be at least 1, e.g. `{SUBCOMMAND_HINT}`.")


def _refuse_second(action: str) -> None:
    running = current()
    if running is not None:
        what = f"{len(running.processes)} processes, {running.state}"
        raise UsageError(
            f"%cluster {action}: a cluster is already running in this kernel ({what}). Stop it first with "
            "`%cluster stop`, or start it afresh with `%cluster restart`."
        )


@atexit.register
def _stop_started_cluster() -> None:
    """The kernel's normal exit stops the cluster it started; a connected one is left running."""
    cluster = current()
    if cluster is not None and cluster._owned:
        cluster.stop()
