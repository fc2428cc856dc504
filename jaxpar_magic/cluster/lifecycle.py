"""A multi-process JAX cluster driven from the kernel: ipyparallel engines joined by jax.distributed.

    cluster = Cluster.start(2, simulate=4)      # 2 local processes x 4 CPU devices: 8 global devices
    cluster.execute("import jax; print(jax.process_index())")
    cluster.scatter({"x": np.arange(8.0)})      # a global jax.Array, each process holding its rows
    cluster.gather(["x"])["x"]                  # back as one numpy array
    cluster.stop()

Lifecycle: `start` (local engines, owned) or `connect` (existing engines) -> running -> broken(why)
-> `restart` / `stop`. One cluster per kernel; `current()` returns it.

This module is the lifecycle: making a cluster (starting local engines or joining existing ones
into jax.distributed), its status, stop and restart. What runs on the engines is `runs.py`;
every wait on them, with the fault handling described below, is `waits.py`; the errors and the status
report are `status.py`; the engines' side of each request is `engine.py`.

Faults never hang the kernel: every wait has a timeout, local engines' pids are polled while waiting
(a killed engine is named within a poll), a timed-out cell interrupts the engines and marks the
cluster broken (JAX collectives do not recover from an interrupt). A KeyboardInterrupt in the kernel
interrupts the engines too; the cluster then checks itself with a tiny collective over every
process (`cluster_engine.probe`): it stays usable when the interrupted code was plain Python and is
marked broken when a collective was cut. `stop` ends the engines with a hard exit (JAX swallows
SIGTERM), kills what is left by pid, and a watchdog (`cluster/reaper.py`) does the same if the kernel dies
by a signal. The kernel's normal exit stops the cluster it started, never one it connected to.
"""
from __future__ import annotations

import atexit
import logging
import shutil
import signal
import socket
import tempfile
import time

from ..errors import UsageError
from ..views.progress import Progress
from . import engine as cluster_engine
from .runs import ClusterRuns
from .status import SUBCOMMAND_HINT, ClusterError, ClusterStatus, ProcessInfo, engine_log_tail, exit_reason, processes_text, recovery_advice
from .waits import HEARTBEAT_S, POLL_S

START_TIMEOUT = 60.0  # starting engines and joining jax.distributed
SHUTDOWN_S = 3
STOP_WAIT_S = 1.0  # how long stop waits for a hard exit before it kills
REACH_S = 3.0  # connect: how long a host gets to reach the coordinator's port
ANSWER_S = 5.0  # connect: how long a registered engine gets to answer (a dead one never does)

_current: Cluster | None = None
_last: Cluster | None = None  # the latest cluster, stopped or not: `%cluster status` / `restart` after a stop


# --- the cluster ------------------------------------------------------------------------------------
def current() -> Cluster | None:
    """The running or broken cluster of this kernel, or None."""
    return _current if _current is not None and _current.state != "stopped" else None


def last() -> Cluster | None:
    """The latest cluster of this kernel, even a stopped one (for status and restart)."""
    return _last


class Cluster(ClusterRuns):
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
                raise UsageError(f"in {processes_text(errors)}: {errors[first].evalue}")
            raise ClusterError(
                f"joining jax.distributed failed in {processes_text(errors)}: {errors[first].ename}: "
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

    # --- what the waits ask of the lifecycle ------------------------------------------------------
    def _recovery(self) -> str:
        """What brings a broken cluster back: a restart here, or fresh engines and a new connect."""
        return recovery_advice(self._owned, self._options)

    def _exit_reason(self, pid: int) -> str:
        return exit_reason(self._exit_code(pid))

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
        return engine_log_tail(self._profile_dir)

    def __repr__(self) -> str:
        return f"<Cluster {self.status().headline()}>"


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
