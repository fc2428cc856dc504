"""Two hosts, rehearsed on one machine: the README's recipe across a real network boundary.

`scripts/two-hosts up` makes "hosta" (10.231.0.1) and "hostb" (10.231.0.2): two network namespaces,
each with a hostname (a UTS namespace) and an /etc/hosts of its own, joined by a veth pair; they
share this filesystem like an NFS home. On hosta run an ipyparallel controller, an engine, and the
notebook's kernel (`two_hosts_kernel.py`: a real IPython shell); on hostb a second engine. Then the
user's commands: `%cluster connect`, `%devices`, a psum and a gather, a partition of the link in the
middle of a loop of collectives, `%cluster status`, `%cluster stop`, fresh engines under the same
controller and a new connect in the same kernel (first refused for names that resolve badly), and
a collective only hostb reaches (the hang doctor answers from the other host).

Needs root (network namespaces). Under CI=true it must run; elsewhere it skips without root. The
namespaces, the veth pair and every process started are removed even when the test fails.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from jaxpar_magic.cluster.reaper import gone, kill, processes_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TWO_HOSTS = ROOT / "scripts" / "two-hosts"
KERNEL = Path(__file__).with_name("two_hosts_kernel.py")
PROFILE = "pod"
DEVICES = 2  # simulated CPU devices per engine
CELL_S = 90.0  # the longest any one cell may take before the test gives up on the kernel


def _can_make_namespaces() -> str | None:
    """Why this machine cannot run the test, or None."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (run as root, or in CI)"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} (apt-get install -y iproute2 util-linux)"
    return None


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """hosta and hostb, up; torn down at the end whatever happens."""
    why = _can_make_namespaces()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the two-host test must run in CI, but it {why}")
        pytest.skip(why)
    _remove_leftovers()
    # A prefix of our own: several runs on one machine never share namespaces (veth names: <= 15 chars).
    env = dict(os.environ, JPM_NS_PREFIX=f"jt{os.getpid()}")
    made = subprocess.run([str(TWO_HOSTS), "up"], env=env, capture_output=True, text=True, timeout=30)
    machine = Machine(env, tmp_path_factory.mktemp("two-hosts"))
    try:
        assert made.returncode == 0, made.stderr
        yield machine
    finally:
        machine.end_everything()
        subprocess.run([str(TWO_HOSTS), "down"], env=env, capture_output=True, timeout=30)
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        assert env["JPM_NS_PREFIX"] + "-host" not in names, names


def _remove_leftovers() -> None:
    """Namespaces of an earlier run that was killed before its teardown (its pid is gone)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    for pid in sorted(set(re.findall(r"^jt(\d+)-host[ab]\b", names, re.M))):
        if not psutil.pid_exists(int(pid)):
            subprocess.run([str(TWO_HOSTS), "down"], env=dict(os.environ, JPM_NS_PREFIX=f"jt{pid}"),
                           capture_output=True, timeout=30)


class Machine:
    """Starts processes "on" hosta or hostb and remembers them all, to end them by pid."""

    def __init__(self, env: dict, folder: Path):
        self.folder = folder
        self.env = dict(env, IPYTHONDIR=str(folder / "ipython"), JAX_PLATFORMS="cpu",
                        JAX_NUM_CPU_DEVICES=str(DEVICES))
        self.env.pop("XLA_FLAGS", None)
        self.started: list[subprocess.Popen] = []
        self.family: list[psutil.Process] = []

    def on(self, host: str, argv: list[str], log: str, **popen) -> subprocess.Popen:
        opened = open(self.folder / log, "w")
        popen.setdefault("stdout", opened)
        popen.setdefault("stderr", opened)
        proc = subprocess.Popen([str(TWO_HOSTS), "on", host, *argv], env=self.env, cwd=self.folder, **popen)
        opened.close()
        self.started.append(proc)
        return proc

    def controller(self) -> subprocess.Popen:
        connection = self.folder / "ipython" / f"profile_{PROFILE}" / "security" / "ipcontroller-engine.json"
        connection.unlink(missing_ok=True)
        proc = self.on("hosta", [sys.executable, "-m", "ipyparallel.controller", f"--profile={PROFILE}",
                                 "--ip=10.231.0.1", "--log-level=ERROR"], "controller.log")
        until = time.monotonic() + 30
        while not connection.exists():
            assert proc.poll() is None and time.monotonic() < until, self.log("controller.log")
            time.sleep(0.1)  # the controller writes its connection file once it listens
        return proc

    def engine(self, host: str, log: str) -> subprocess.Popen:
        return self.on(host, [sys.executable, "-m", "ipyparallel.engine", f"--profile={PROFILE}",
                              "--log-level=ERROR"], log)

    def remember_families(self) -> None:
        """The started processes and their children (engines' nannies, the controller's workers):
        a nanny outlives its engine, so its pid is taken while the engine lives."""
        for proc in processes_of([p.pid for p in self.started if p.poll() is None]):
            if all(proc.pid != known.pid for known in self.family):
                self.family.append(proc)

    def end(self, procs: list[subprocess.Popen]) -> None:
        self.remember_families()
        pids = {p.pid for p in procs}
        doomed = [p for p in self.family if p.pid in pids or _parent_in(p, pids)]
        kill(processes_of(list(pids)) + doomed)
        for proc in procs:
            proc.wait(10)

    def end_everything(self) -> None:
        self.remember_families()
        kill(processes_of([p.pid for p in self.started]) + self.family)
        for proc in self.started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            for pipe in (proc.stdin, proc.stdout, proc.stderr):  # the kernel's: unclosed, a ResourceWarning later
                if pipe is not None:
                    with contextlib.suppress(OSError):  # a write still buffered to a killed kernel
                        pipe.close()
        assert [p.pid for p in self.family if not gone(p)] == []

    @contextlib.contextmanager
    def hosts_file(self, host: str, first: str):
        """/etc/hosts on `host` with `first` put in front for a while (rewritten in place: the file is
        bind-mounted into processes already running there)."""
        path = Path("/etc/netns") / f"{self.env['JPM_NS_PREFIX']}-{host}" / "hosts"
        before = path.read_text()
        with open(path, "w") as f:
            f.write(first + before)
        try:
            yield
        finally:
            with open(path, "w") as f:
                f.write(before)

    def log(self, name: str) -> str:
        path = self.folder / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _parent_in(proc: psutil.Process, pids: set[int]) -> bool:
    try:
        return any(parent.pid in pids for parent in proc.parents())
    except psutil.Error:
        return False


class Kernel:
    """The notebook's kernel on hosta; `run(cell)` answers what the cell did, within CELL_S."""

    def __init__(self, machine: Machine):
        self.proc = machine.on("hosta", [sys.executable, str(KERNEL)], "kernel.log",
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.machine = machine
        ready = self.answer(60)
        assert ready.get("ready"), ready

    def answer(self, timeout: float) -> dict:
        """The next cell's answer, within `timeout` seconds."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the kernel gave no answer within {timeout:g} s:\n{self.machine.log('kernel.log')}"
        line = self.proc.stdout.readline()
        assert line, f"the kernel died:\n{self.machine.log('kernel.log')}"
        return json.loads(line)

    def send(self, cell: str) -> None:
        self.proc.stdin.write(json.dumps({"cell": cell}) + "\n")
        self.proc.stdin.flush()

    def run(self, cell: str, timeout: float = CELL_S) -> dict:
        self.send(cell)
        return self.answer(timeout)

    def ok(self, cell: str) -> dict:
        answer = self.run(cell)
        assert answer["success"], answer
        return answer


SETUP = """%%cluster
import jax, numpy as np, pathlib
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(jax.devices(), ("i",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), np.arange(2.0) + 10 * jax.process_index())
psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
total = psum(x).block_until_ready()
"""
EXPECTED_TOTAL = [0.0 + 1.0 + 10.0 + 11.0] * (2 * DEVICES)


def connect_and_check(kernel: Kernel) -> dict:
    connected = kernel.ok(f"%cluster connect --profile {PROFILE} -n 2 --timeout 60")
    shown = "\n".join(connected["shown"])
    assert f"cluster running: 2 processes, {2 * DEVICES} devices" in shown and "connected" in shown, shown
    assert "hosta" in shown and "hostb" in shown
    # Rank 0 hosts the coordinator under its own name, which the other host resolves through its hosts file.
    rank0 = next(line.split()[1] for line in shown.splitlines() if line.startswith("0 "))
    assert f"coordinator {rank0}:" in shown
    kernel.ok(SETUP)
    gathered = kernel.ok("%cluster gather total\nprint(total.tolist())")
    assert gathered["stdout"].strip().splitlines()[-1] == str(EXPECTED_TOTAL), gathered
    return connected


def test_two_hosts_connect_partition_and_connect_again(hosts):
    machine = hosts
    first = [machine.controller(), machine.engine("hosta", "engine-a.log"), machine.engine("hostb", "engine-b.log")]
    kernel = Kernel(machine)

    started = time.monotonic()
    connect_and_check(kernel)
    machine.remember_families()
    devices = "\n".join(kernel.ok("%devices")["shown"])
    assert "host hosta" in devices and "host hostb" in devices, devices
    assert "[Gloo]" not in json.dumps(kernel.ok("%%cluster\ntotal = psum(x).block_until_ready()"))
    connected_s = time.monotonic() - started

    # A partition in the middle of a loop of collectives: hosta's link goes down.
    marker = machine.folder / "looping"
    kernel.send(f"%%cluster --timeout 80\npathlib.Path({str(marker)!r}).touch()\n"
                "for step in range(100000):\n    total = psum(x).block_until_ready()\n")
    until = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < until and kernel.proc.poll() is None, "the loop never started"
        time.sleep(0.05)  # waiting for the cell to reach its loop, with a deadline
    subprocess.run([str(TWO_HOSTS), "cut"], env=machine.env, check=True, timeout=10)
    cut_at = time.monotonic()
    failed = kernel.answer(60)
    failed_after = time.monotonic() - cut_at
    assert not failed["success"] and failed["error_type"] == "ClusterError", failed
    assert failed_after < 45, failed_after
    message = failed["error"]
    assert "hostb" in message, message  # the host that stopped answering
    assert "`%cluster restart` cannot help" in message and f"%cluster connect --profile {PROFILE} -n 2" in message
    status = kernel.ok("%cluster status")
    assert "cluster broken (" in status["stdout"] + "".join(status["shown"]), status
    stop = kernel.ok("%cluster stop")
    assert stop["elapsed"] < 15, stop

    # The network back, fresh engines under the same controller, the same kernel. The controller may
    # still list a dead engine (until its heartbeat times out): connect must not wait on it.
    machine.end(first[1:])  # the engines (and their nannies)
    subprocess.run([str(TWO_HOSTS), "mend"], env=machine.env, check=True, timeout=10)
    machine.engine("hosta", "engine-a2.log")
    machine.engine("hostb", "engine-b2.log")
    # Names that resolve badly are caught at connect, before JAX could hang or abort on them.
    with machine.hosts_file("hostb", "127.0.1.1\thostb\n"):  # Debian's way: a machine's own name on loopback
        refused = kernel.run(f"%cluster connect --profile {PROFILE} -n 2 --timeout 60")
    assert refused["error_type"] == "UsageError", refused
    assert "on hostb, the host's own name `hostb` resolves to 127.0.1.1 first, a loopback address" in refused["error"], refused
    assert "10.231.0.2" in refused["error"]  # the address to map it to
    with machine.hosts_file("hosta", "127.0.0.1\thostb\n"), machine.hosts_file("hostb", "127.0.0.1\thosta\n"):
        refused = kernel.run(f"%cluster connect --profile {PROFILE} -n 2 --timeout 60")
    assert refused["error_type"] == "UsageError", refused
    found = re.search(r"on (host[ab]), the coordinator `(host[ab])` resolves to 127.0.0.1, a loopback", refused["error"])
    assert found and found.group(1) != found.group(2), refused
    assert "--coordinator ADDRESS:" in refused["error"]
    other = found.group(1)  # not rank 0's host: a coordinator there answers nobody
    refused = kernel.run(f"%cluster connect --profile {PROFILE} -n 2 --coordinator {other}:23456 --timeout 60")
    assert refused["error_type"] == "UsageError", refused
    assert f"from {other}, {other}:23456 does not answer" in refused["error"], refused
    connect_and_check(kernel)
    machine.remember_families()
    # A collective only hostb reaches: the hang doctor answers from the other host (the signal goes
    # through ipyparallel's nanny there), naming the host, the line and the collective.
    hung = kernel.run("%%cluster --timeout 3\nimport socket\nif socket.gethostname() == 'hostb':\n"
                      "    total = psum(x).block_until_ready()\n")
    assert hung["error_type"] == "ClusterError", hung
    assert re.search(r"Process \d \(on hostb\) waits at line 3 of the cell \(`total = psum\(x\).block_until_ready\(\)`\); "
                     r"that line calls `psum`", hung["error"]), hung["error"]
    assert kernel.ok("%cluster stop")["elapsed"] < 15
    print(f"connected and checked in {connected_s:.1f} s; the partition failed the cell in {failed_after:.1f} s:"
          f"\n{message}")
