"""The cluster's watchdog in the kernel: every request sent to the engines and every wait on their
answers, bounded, so that no fault hangs the kernel.

A wait polls the local engines' pids (a killed engine is named within a poll), gives the others
FAIL_GRACE_S once one process failed, interrupts the engines when the time runs out or the kernel
is interrupted, and then checks the cluster with a tiny collective over every process
(`cluster_engine.probe`): it stays usable after plain Python and is marked broken when a collective
was cut. A stuck process is asked where it waits (`hang_doctor`) before it is interrupted.
"""
from __future__ import annotations

import signal
import sys
import time

from ..cell.interrupts import HeldInterrupt
from . import engine as cluster_engine, hang_doctor
from .status import ClusterError, ProcessInfo, processes_text

POLL_S = 0.05  # how often a wait looks at the engines' pids
FAIL_GRACE_S = 2.0  # once a process failed, how long the others may still run before they are interrupted
INTERRUPT_GRACE_S = 3.0  # how long interrupted engines get to answer
PROBE_TIMEOUT_S = 4.0  # the health check after an interrupt
HEARTBEAT_S = 10  # jax.distributed: a lost peer is noticed in seconds, not JAX's default minutes
SILENT_S = 3.0  # after a death on a cluster over several hosts: how long the other hosts get to answer
DOCTOR_S = 2.0  # how long a stuck process gets to say where it waits
ABORT_ACK_S = 1.0  # after an interrupt: how long the engines get to acknowledge that queued requests are dropped


class WatchedEngines:
    """The cluster's engines as seen from the kernel: send them requests, wait on the answers.

    The lifecycle (`cluster.Cluster`, a subclass) sets these attributes when it starts or connects,
    and says how to recover and why a local engine ended (`_recovery`, `_exit_reason`, `_log_tail`).
    """

    state: str  # "running", "broken" or "stopped"
    why: str | None  # what broke the cluster
    processes: tuple[ProcessInfo, ...]  # by rank
    _client: object  # the ipyparallel Client, None once disconnected
    _views: dict  # rank -> ipyparallel view, made on first use
    _engine_ids: list[int]  # rank -> engine id
    _watched: list  # (rank or None while starting, psutil.Process) of the engines on this host
    _controller: object  # psutil.Process of the controller, for clusters started here
    _asking: bool  # asking the other hosts whether they answer (a death found meanwhile does not ask again)

    def _recovery(self) -> str:
        """What brings a broken cluster back (the lifecycle knows: restart, or reconnect)."""
        raise NotImplementedError

    def _exit_reason(self, pid: int) -> str:
        """How the local engine `pid` ended, as a sentence's predicate ("was killed by SIGKILL")."""
        raise NotImplementedError

    def _log_tail(self) -> str:
        """The engines' last log lines, for an error while starting ("" when there are none)."""
        raise NotImplementedError

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
        return self._send(ranks, lambda rank, view: view.apply_async(func, *(per_rank(rank) if per_rank else args)))

    def _submit_execute(self, ranks, code: str) -> dict:
        """`code` run on each rank as a cell (its output and final value recorded), not waited."""
        return self._send(ranks, lambda rank, view: view.execute(code, silent=False, block=False))

    def _send(self, ranks, request) -> dict:
        """rank -> `request(rank, view)`: one request each, not waited, naming an engine found gone."""
        try:
            return {rank: request(rank, self._view(rank)) for rank in ranks}
        except IndexError:  # ipyparallel's "No such engine": the controller dropped a dead engine
            self._check_alive()
            self._break("an engine is gone from the ipyparallel controller")
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()}") from None

    def _wait(self, ars: dict, timeout: float, what: str, relay=None, held: HeldInterrupt | None = None
              ) -> tuple[dict, tuple]:
        """Every rank's outcome, ("ok", value) or ("error", RemoteError), within `timeout` seconds.

        Raises ClusterError (and marks the cluster broken) when a process dies or the time runs out;
        on KeyboardInterrupt interrupts the engines, checks the cluster, and re-raises. Once a process
        has failed, the others get FAIL_GRACE_S more before they are interrupted: they are most
        likely waiting in a collective the failed one never reached. Returns (outcome, notes).
        `relay` (a `runs.OutputRelay`) prints the engines' output while it arrives. `held`: the
        interrupt held while `ars` were sent, raised (and handled) here.
        """
        deadline = time.monotonic() + timeout
        outcome: dict[int, tuple] = {}
        notes: list[str] = []
        failed_at = None
        pending = list(ars)
        try:
            if held is not None:
                held.release()
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
        from ipyparallel.error import EngineError, RemoteError, TaskAborted

        try:
            return "ok", ar.get(0)
        except RemoteError as error:
            return "error", error
        except TaskAborted as error:  # dropped unrun after an interrupt (`_drop_unstarted`)
            return "aborted", error
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
        still = f"{processes_text(pending)} {was} still running {FAIL_GRACE_S:g} s after the failure and {was} interrupted"
        if silent or not self._healthy():
            self._break(f"{processes_text(pending)} {was} interrupted after the others failed, most likely inside a "
                        "collective the failed processes never reached, and JAX's cluster cannot recover from that")
            return [f"{still}, which cut a collective: the cluster is broken. {self._recovery()}"]
        return [f"{still}."]

    def _time_out(self, pending, ars, timeout: float, what: str) -> None:
        """The time ran out: interrupt the engines still busy, then keep the cluster if a probe
        collective still works (a slow plain-Python cell) or mark it broken (a cut collective)."""
        waits = self._where_they_wait(pending, ars)
        self._interrupt(pending)
        done = [rank for rank in ars if rank not in pending]
        finished = f" ({processes_text(done)} had finished)" if done else ""
        try:
            usable = not self._settled_after_interrupt(pending, ars, {}) and self._healthy()
        except ClusterError:
            usable = False
        if usable:
            raise ClusterError(
                f"no answer from {processes_text(pending)} within the {timeout:g} s timeout{finished}, so the cell was "
                f"interrupted.{waits} It was plain Python, not a collective, so the cluster is still usable; give a slow "
                "cell more time with `--timeout S` (or `%config JaxparMagics.cluster_timeout`)."
            )
        self._break(f"{what} ran past its {timeout:g} s timeout in {processes_text(pending)}, and interrupting it "
                    "cut a collective")
        raise ClusterError(
            f"no answer from {processes_text(pending)} within the {timeout:g} s timeout{finished}.{waits} A collective "
            "that not every process reaches (a psum under `if jax.process_index() == 0:`) waits forever. The engines "
            "were interrupted, and an interrupted JAX collective cannot recover, so the cluster is broken. "
            f"{self._recovery()} A cell that is merely slow needs a longer `--timeout S` (or "
            "`%config JaxparMagics.cluster_timeout`)."
        )

    def _where_they_wait(self, pending, ars) -> str:
        """" Process 0 waits at line 5 of the cell (`...`), ...": each stuck process is asked (SIGUSR1,
        answered by `hang_doctor` from a thread of its own) and its report read from its output."""
        self._signal(pending, hang_doctor.SIGNAL)
        until = time.monotonic() + DOCTOR_S
        reports: dict[int, list] = {}
        while time.monotonic() < until and len(reports) < len(pending):
            for rank in pending:
                if rank not in reports:
                    frames = hang_doctor.read_report(stream_text(ars[rank], "stderr"))
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
        self._drop_unstarted(pending, ars)
        self._interrupt(pending)
        try:
            silent = self._settled_after_interrupt(pending, ars, {})
            usable = not silent and self._healthy()
        except ClusterError:
            usable = False
        if usable:
            print(f"interrupted {processes_text(pending)}; the cluster is still usable.", file=sys.stderr)
        else:
            self._break(f"an interrupt cut {processes_text(pending)} in the middle of a collective")
            print(f"interrupted {processes_text(pending)} in the middle of a collective: the cluster is broken. "
                  f"{self._recovery()}", file=sys.stderr)

    def _drop_unstarted(self, pending, ars) -> None:
        """Abort the requests that have not started yet (an interrupt that came while they were sent):
        the engine drops them unrun (ipyparallel's abort_request, answered by its control thread even
        while the cell runs). Waiting for the acknowledgement means that a request not dropped has
        started before the SIGINT that follows, so the SIGINT finds it running, never an idle engine
        (which ignores SIGINT)."""
        if self._client is None:
            return
        try:
            acknowledged = self._client.abort(jobs=[ars[rank] for rank in pending],
                                              targets=[self._engine_ids[rank] for rank in pending], block=False)
            acknowledged.result(ABORT_ACK_S)
        except Exception:  # an engine gone or silent: the SIGINT and the checks after it name what happened
            pass


def stream_text(ar, stream: str) -> str:
    """What an ipyparallel request has printed so far on `stream` ("stdout"/"stderr"), "" before any."""
    try:
        text = ar[stream]
    except Exception:  # metadata not there yet (the request is still being sent)
        return ""
    return text if isinstance(text, str) else "".join(text)


def _alive(proc) -> bool:
    from .reaper import gone

    return not gone(proc)
