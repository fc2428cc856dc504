"""`%cluster connect` to engines this kernel did not start: `ipcluster start` in a private IPython
directory (as a user would on a login node), then connect, run a collective, disconnect, connect
again to the same engines, and stop them with `ipcluster stop`. The kernel never ends them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.face import cluster_magic
from jaxpar_magic.cluster.lifecycle import Cluster, current
from jaxpar_magic.errors import UsageError
from jaxpar_magic.cluster.reaper import gone, processes_of

pytestmark = pytest.mark.slow

PROFILE = "jpmconnect"
IPCLUSTER = [sys.executable, "-m", "ipyparallel.cluster"]


def ipcluster(args: list[str], ipython_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, IPYTHONDIR=str(ipython_dir), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return subprocess.run(IPCLUSTER + args, env=env, capture_output=True, text=True, timeout=timeout)


def cluster_file_pids(ipython_dir: Path) -> list[int]:
    """The controller's and engines' pids, from the file ipcluster leaves for `ipcluster stop`."""
    pids = []
    for path in (ipython_dir / f"profile_{PROFILE}" / "security").glob("cluster-*.json"):
        info = json.loads(path.read_text())
        pids.append(info["controller"]["state"]["pid"])
        for engine_set in info["engines"]["sets"].values():
            pids += [engine["pid"] for engine in engine_set.get("engines", {}).values()]
    return pids


@pytest.fixture
def external(tmp_path, monkeypatch):
    """Two engines started by `ipcluster` (not by this kernel), on this host."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    family: list[psutil.Process] = []
    try:
        started = ipcluster(["start", "-n", "2", f"--profile={PROFILE}", "--daemonize=True"], tmp_path, 90)
        family = processes_of(cluster_file_pids(tmp_path))  # with the controller's children, the nannies
        assert started.returncode == 0, started.stderr[-2000:]
        assert len(family) >= 5, [p.cmdline() for p in family]
        yield tmp_path
    finally:
        if current() is not None:
            current().stop()
        ipcluster(["stop", f"--profile={PROFILE}"], tmp_path, 60)
        for proc in family:  # ipcluster stop gives engines 5 s after SIGTERM; never leave one behind
            if not gone(proc):
                proc.kill()


def test_connect_runs_collectives_and_stop_only_disconnects(external, ip):
    with capture_output() as captured:
        cluster_magic.line(ip, f"connect --profile {PROFILE}", 60)
    shown = [output.data["text/plain"] for output in captured.outputs]
    assert len(shown) == 1 and shown[0].startswith("cluster running: 2 processes") and "connected" in shown[0]
    cluster = current()
    status = cluster.status()
    assert status.state == "running" and not status.started_here
    assert status.coordinator.startswith("127.0.0.1:")  # every engine is on this host
    assert [p.rank for p in status.processes] == [0, 1]
    cluster.execute("""
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(jax.devices(), ("i",))
count = jax.device_count()
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), np.ones(jax.local_device_count()) * (1 + jax.process_index()))
total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x).block_until_ready()
""", timeout=60)
    devices = status.device_count
    per_process = devices // 2
    expected = np.full(devices, per_process * 1.0 + per_process * 2.0)
    np.testing.assert_array_equal(cluster.gather("total", timeout=60)["total"], expected)
    assert cluster.gather("count", timeout=60)["count"] == [devices, devices]

    with pytest.raises(UsageError, match="connected to, not started here"):
        cluster_magic.line(ip, "restart", 60)
    engines = [psutil.Process(p.pid) for p in status.processes]
    with capture_output() as captured:
        cluster_magic.line(ip, "stop", 60)
    assert "the engines keep running" in captured.stdout
    assert current() is None
    assert [gone(p) for p in engines] == [False, False]

    # The same engines again: they keep their JAX cluster and their names.
    again = Cluster.connect(profile=PROFILE, timeout=60)
    assert again.status().coordinator == status.coordinator
    np.testing.assert_array_equal(again.gather("total", timeout=60)["total"], expected)
    again.stop()
    assert [gone(p) for p in engines] == [False, False]
    # atexit would not stop them either: only clusters started here are this kernel's.
    assert not again.status().started_here
    started = time.monotonic()
    ipcluster(["stop", f"--profile={PROFILE}"], external, 60)
    until = started + 20
    while any(not gone(p) for p in engines) and time.monotonic() < until:
        time.sleep(0.1)  # ipcluster stop's own SIGTERM-then-kill, polled with a deadline
    assert [p.pid for p in engines if not gone(p)] == []
