"""A real cluster on loopback: 2 ipyparallel engines x 4 simulated CPU devices, joined by jax.distributed.

One cluster serves the whole module (a start costs ~8 s); no test here breaks it. The last test stops
it and checks that no process is left. Faults (killed engines, hung collectives, a killed kernel)
are in test_cluster_faults.py, each on clusters of their own.
"""
from __future__ import annotations

import _thread
import os
import threading
import time

import numpy as np
import psutil
import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.face import cluster_magic
from jaxpar_magic.cluster.lifecycle import Cluster, current
from jaxpar_magic.cluster.status import ClusterCellError
from jaxpar_magic.errors import UsageError
from jaxpar_magic.cluster.reaper import gone, reaper

pytestmark = pytest.mark.slow

TIMEOUT = 60.0
SETUP = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
"""


@pytest.fixture(scope="module")
def cluster():
    started = Cluster.start(2, simulate=4)
    try:
        started.execute(SETUP, timeout=TIMEOUT)
        yield started
    finally:
        started.stop()


def cluster_processes() -> list[psutil.Process]:
    """Every ipyparallel process under this test process (controller and children, engines, nannies)."""
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid != reaper().pid and any("ipyparallel" in part for part in _cmdline(p))]


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def run(ip, source: str, line: str = "") -> str:
    """A %%cluster cell through the magic's entry point; returns what it printed."""
    with capture_output() as captured:
        cluster_magic.cell(ip, line, source, TIMEOUT)
    return captured.stdout + captured.stderr


def gather(names):
    return current().gather(names, timeout=TIMEOUT)


def interrupt_when(path: str, deadline_s: float = 30.0) -> threading.Thread:
    """Interrupt the main thread (as Kernel -> Interrupt does) once an engine has created `path`."""
    def watch():
        until = time.monotonic() + deadline_s
        while not os.path.exists(path) and time.monotonic() < until:
            time.sleep(0.02)  # a watcher polling a file, not the test waiting
        _thread.interrupt_main()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_two_processes_with_eight_global_devices(cluster, ip):
    status = cluster_magic.line(ip, "status", TIMEOUT)
    assert status.state == "running" and status.started_here
    assert [p.rank for p in status.processes] == [0, 1]
    assert [len(p.local_device_ids) for p in status.processes] == [4, 4]
    assert status.device_count == 8
    assert status.coordinator.startswith("127.0.0.1:")
    assert len({p.pid for p in status.processes} | {os.getpid()}) == 3
    # What JAX itself says in each process.
    run(ip, "facts = (jax.process_index(), jax.process_count(), jax.device_count(), "
            "[d.id for d in jax.local_devices()])")
    facts = gather("facts")["facts"]
    assert [f[:3] for f in facts] == [(0, 2, 8), (1, 2, 8)]
    assert [tuple(f[3]) for f in facts] == [p.local_device_ids for p in status.processes]
    assert "running" in status.text() and "<table" in status._repr_html_()


def test_output_is_labelled_by_process(cluster, ip):
    out = run(ip, "import sys\nprint('hello from', jax.process_index())\n"
                  "print('careful', file=sys.stderr)\njax.process_index() * 10")
    for rank in (0, 1):
        assert f"[process {rank}] hello from {rank}\n" in out
        assert f"[process {rank}] careful\n" in out
        assert f"[process {rank}] Out: {rank * 10}\n" in out


def test_targets_run_in_some_processes_only(cluster, ip):
    out = run(ip, "only_here = jax.process_index()\nprint('ran')", "--targets 1")
    assert "[process 1] ran" in out and "[process 0]" not in out
    with pytest.raises(UsageError, match="not in process 0"):
        gather(["only_here"])
    run(ip, "del only_here", "--targets 1")


def test_push_copies_values_as_they_are(cluster, ip):
    ip.user_ns["config"] = {"lr": 0.1, "layers": [3, 4]}
    ip.user_ns["table"] = np.arange(6).reshape(2, 3)
    cluster_magic.line(ip, "push config table", TIMEOUT)
    got = gather(["config", "table"])
    assert got["config"] == [{"lr": 0.1, "layers": [3, 4]}] * 2
    for copy in got["table"]:
        np.testing.assert_array_equal(copy, np.arange(6).reshape(2, 3))
    with pytest.raises(UsageError, match="'missing' is not defined in the kernel"):
        cluster_magic.line(ip, "push config missing", TIMEOUT)


def test_push_sends_kernel_functions_and_names_what_cannot_travel(cluster, ip):
    ip.run_cell("def double(v):\n    return 2 * v\nimport threading\nlock = threading.Lock()")
    cluster_magic.line(ip, "push double", TIMEOUT)
    assert "[process 1] 42" in run(ip, "print(double(21))")
    with pytest.raises(UsageError, match="push: 'lock' cannot be sent to the engines"):
        cluster_magic.line(ip, "push double lock", TIMEOUT)
    run(ip, "numbers = (i for i in range(3))")
    with pytest.raises(UsageError, match="'numbers' is a generator in processes 0, 1, which cannot be sent"):
        cluster_magic.line(ip, "gather numbers", TIMEOUT)


def test_scatter_then_gather_round_trip(cluster, ip):
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    ip.user_ns["x"] = x
    cluster_magic.line(ip, "scatter x", TIMEOUT)
    run(ip, """
global_x = not x.is_fully_addressable
rows_here = np.concatenate([np.asarray(s.data) for s in sorted(x.addressable_shards, key=lambda s: s.index[0].start)])
y = jnp.sin(x) * 2
""")
    got = gather(["global_x", "rows_here"])
    assert got["global_x"] == [True, True]
    # Each process holds only its own devices' rows: the first and the second half.
    np.testing.assert_array_equal(got["rows_here"][0], x[:8])
    np.testing.assert_array_equal(got["rows_here"][1], x[8:])
    del ip.user_ns["x"]
    cluster_magic.line(ip, "gather x y", TIMEOUT)
    assert isinstance(ip.user_ns["x"], np.ndarray)
    np.testing.assert_array_equal(ip.user_ns["x"], x)
    np.testing.assert_allclose(ip.user_ns["y"], np.sin(x) * 2, rtol=1e-6)


def test_scatter_needs_a_multiple_of_the_device_count(cluster, ip):
    ip.user_ns["odd"] = np.arange(10.0)
    with pytest.raises(UsageError, match="'odd' has 10 rows.*multiple of 8"):
        cluster_magic.line(ip, "scatter odd", TIMEOUT)
    ip.user_ns["scalar"] = 3.0
    with pytest.raises(UsageError, match="is a scalar.*push scalar"):
        cluster_magic.line(ip, "scatter scalar", TIMEOUT)


PARAMS_CLASS = """
import dataclasses, jax
@dataclasses.dataclass
class Params:
    w: object
    b: object
    name: str = dataclasses.field(default="layer", metadata=dict(static=True))
jax.tree_util.register_dataclass(Params)
"""


def test_pytrees_travel_and_come_back_as_the_same_type(cluster, ip):
    ip.run_cell(PARAMS_CLASS)
    run(ip, PARAMS_CLASS)  # as a notebook does: the class defined in the kernel and on the cluster
    ip.run_cell("import numpy as np, optax, jax.numpy as jnp\n"
                "p = Params(np.arange(16.0).reshape(8, 2), np.ones(8, np.float32), name='dense')\n"
                "opt = optax.adam(0.1).init({'w': jnp.ones((8, 2))})")
    cluster_magic.line(ip, "push p opt", TIMEOUT)
    said = run(ip, "print(type(p).__name__, p.name, type(p.w).__name__, float(p.w.sum()), "
                   "type(opt[0]).__name__, type(opt[0].mu['w']).__name__, int(opt[0].count))")
    for rank in (0, 1):  # a copy in every process, rebuilt as the same types (jax.Array leaves stay jax.Arrays)
        assert f"[process {rank}] Params dense ndarray 120.0 ScaleByAdamState ArrayImpl 0" in said, said

    cluster_magic.line(ip, "scatter p opt", TIMEOUT)
    run(ip, "spread = [not leaf.is_fully_addressable for leaf in jax.tree.leaves((p, opt))]\n"
            "rows_here = p.w.addressable_shards[0].data.shape[0]\n"
            "new = Params(p.w * 2, p.b + 1, name=p.name)")
    got = gather(["spread", "rows_here"])
    assert got["spread"] == [[True] * 5] * 2  # w, b, count (replicated), mu, nu: all global arrays
    assert got["rows_here"] == [1, 1]
    cluster_magic.line(ip, "gather new opt", TIMEOUT)
    new, opt = ip.user_ns["new"], ip.user_ns["opt"]
    assert isinstance(new, ip.user_ns["Params"]) and new.name == "dense"
    np.testing.assert_array_equal(new.w, np.arange(16.0).reshape(8, 2) * 2)
    np.testing.assert_array_equal(new.b, np.full(8, 2.0))
    assert type(opt[0]).__name__ == "ScaleByAdamState" and int(opt[0].count) == 0
    np.testing.assert_array_equal(opt[0].mu["w"], np.zeros((8, 2)))

    # An Equinox module, pushed (a copy per process) and gathered back (one per process).
    ip.run_cell("import equinox as eqx\nlinear = eqx.nn.Linear(3, 8, key=jax.random.key(0))")
    cluster_magic.line(ip, "push linear", TIMEOUT)
    run(ip, "import equinox as eqx\nlinear = eqx.tree_at(lambda m: m.bias, linear, linear.bias + jax.process_index())")
    cluster_magic.line(ip, "gather linear", TIMEOUT)
    copies = ip.user_ns["linear"]
    assert [type(m).__name__ for m in copies] == ["Linear", "Linear"] and copies[0].in_features == 3
    np.testing.assert_allclose(copies[1].bias - copies[0].bias, np.ones(8), rtol=1e-6)

    # A mistake on a leaf names the leaf.
    ip.run_cell("bad = Params(np.zeros((9, 2)), np.zeros(8))")
    with pytest.raises(UsageError, match=r"`bad\.w` has 9 rows, which do not split over the cluster's 8 devices"):
        cluster_magic.line(ip, "scatter bad", TIMEOUT)
    ip.run_cell("import threading\nholder = {'weights': np.ones(3), 'lock': threading.Lock()}")
    with pytest.raises(UsageError, match=r"push: `holder\['lock'\]` cannot be sent to the engines"):
        cluster_magic.line(ip, "push holder", TIMEOUT)
    # A type only the kernel knows: say where to define it, not a raw unpickling error.
    ip.run_cell("@dataclasses.dataclass\nclass KernelOnly:\n    v: object\n"
                "jax.tree_util.register_dataclass(KernelOnly)\nlonely = KernelOnly(np.ones(8))")
    with pytest.raises(UsageError, match="pytree whose type is unknown here.*%%cluster cell"):
        cluster_magic.line(ip, "push lonely", TIMEOUT)


def test_gather_of_a_replicated_global_array_counts_each_element_once(cluster, ip):
    run(ip, """
grid = Mesh(np.array(jax.devices()).reshape(2, 4), ("proc", "dev"))
whole = np.arange(24.0).reshape(8, 3)
# Split over "dev", replicated over "proc": each process holds a full copy.
replicated = jax.make_array_from_process_local_data(NamedSharding(grid, P("dev", None)), whole, (8, 3))
local_copy = jnp.arange(3) + jax.process_index()
""")
    got = gather(["replicated", "local_copy"])
    np.testing.assert_array_equal(got["replicated"], np.arange(24.0).reshape(8, 3))
    # A process-local jax.Array is "any other value": one per process, as numpy.
    assert [a.tolist() for a in got["local_copy"]] == [[0, 1, 2], [1, 2, 3]]


def test_issue_example_psum_and_ppermute_ring_across_processes(cluster, ip):
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    said = run(ip, """
local = np.arange(4.0) + 10 * jax.process_index()            # each process loads its own rows
mesh = Mesh(jax.devices(), ("i",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
ring = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]),
                             mesh=mesh, in_specs=P("i"), out_specs=P("i")))
total = psum(x).block_until_ready()
shifted = ring(x).block_until_ready()
""")
    # The first collectives connect Gloo, whose chatter the engines filter from their file descriptors.
    assert "Gloo" not in said and "peer ranks" not in said, said
    got = gather(["x", "total", "shifted"])
    data = np.concatenate([np.arange(4.0), np.arange(4.0) + 10]).astype(np.float32)
    np.testing.assert_array_equal(got["x"], data)
    # The same programs in this one process over its own 8 devices.
    mesh = Mesh(jax.devices(), ("i",))
    here = jax.device_put(data, NamedSharding(mesh, P("i")))
    total = jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(here)
    shifted = jax.shard_map(lambda v: jax.lax.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]),
                            mesh=mesh, in_specs=P("i"), out_specs=P("i"))(here)
    np.testing.assert_array_equal(got["total"], np.asarray(total))
    np.testing.assert_array_equal(got["total"], np.full(8, data.sum()))
    np.testing.assert_array_equal(got["shifted"], np.asarray(shifted))
    np.testing.assert_array_equal(got["shifted"], np.roll(data, 1))


def test_a_cell_failing_in_one_process_restores_every_namespace(cluster, ip):
    run(ip, "kept = 1")
    with pytest.raises(ClusterCellError) as caught:
        run(ip, "kept = 2\nfresh = 3\nif jax.process_index() == 1:\n    raise ValueError('boom in one process')")
    error = caught.value
    assert error.processes == [1]
    assert error.ename == "ValueError" and error.evalue == "boom in one process"
    rendered = "\n".join(error._render_traceback_())
    assert "process 1" in rendered and "ValueError" in rendered and "boom in one process" in rendered
    assert gather(["kept"])["kept"] == [1, 1]
    with pytest.raises(UsageError, match="'fresh' is not defined on the cluster"):
        gather(["fresh"])


def test_two_phase_call_binds_only_when_every_process_succeeded(cluster):
    from jaxpar_magic.cluster import trees

    seven, _ = trees.flatten("seven", 7)
    replies = cluster.call("jaxpar_magic.cluster.engine:import_trees", {"seven": (seven, [("value", 7)])}, "i",
                           timeout=TIMEOUT)
    assert replies == [{"seven": "int"}, {"seven": "int"}]
    assert gather(["seven"])["seven"] == [7, 7]
    # Process 0 succeeds and process 1 fails (rows that do not fit its devices): nobody binds.
    half, _ = trees.flatten("half", np.zeros(8, np.float32))
    good = {"half": (half, [("rows", np.zeros(4, np.float32), (8,))])}
    bad = {"half": (half, [("rows", np.zeros(3, np.float32), (8,))])}
    with pytest.raises(ClusterCellError) as caught:
        cluster._call("jaxpar_magic.cluster.engine:import_trees", {0: (good, "i"), 1: (bad, "i")}, TIMEOUT)
    assert caught.value.processes == [1]
    with pytest.raises(UsageError, match="'half' is not defined on the cluster"):
        gather(["half"])


def test_usage_error_raised_on_engines_arrives_as_one(cluster, ip):
    with pytest.raises(UsageError, match=r"^in processes 0, 1: bad line, fix it$"):
        run(ip, "from jaxpar_magic.errors import UsageError\nraise UsageError('bad line, fix it')")


def test_a_kernel_name_missing_on_the_cluster_suggests_push(cluster, ip):
    ip.user_ns["kernel_only"] = 5
    with pytest.raises(UsageError, match="'kernel_only' is defined in the kernel.*%cluster push kernel_only"):
        run(ip, "kernel_only + 1")
    with pytest.raises(ClusterCellError, match="NameError: name 'nowhere' is not defined"):
        run(ip, "nowhere + 1")


def test_mistakes_with_a_running_cluster(cluster, ip):
    with pytest.raises(UsageError, match="already running"):
        cluster_magic.line(ip, "start -n 2 --simulate 4", TIMEOUT)
    with pytest.raises(UsageError, match="already running"):
        Cluster.start(2, simulate=4)
    with pytest.raises(UsageError, match="'nope' is not defined on the cluster"):
        cluster_magic.line(ip, "gather nope", TIMEOUT)
    with pytest.raises(UsageError, match="ranks are 0 to 1"):
        run(ip, "print(1)", "--targets 2")
    with pytest.raises(UsageError, match="ranks are 0 to 1"):
        cluster.execute("print(1)", targets=[5])
    assert cluster.state == "running"


def test_a_failure_stops_the_other_processes_and_keeps_plain_code_usable(cluster, ip):
    started = time.monotonic()
    with pytest.raises(ClusterCellError) as caught:
        run(ip, "if jax.process_index() == 1:\n    raise RuntimeError('early')\nimport time\ntime.sleep(60)")
    assert time.monotonic() - started < 15  # not the 60 s of the sleep, nor the timeout
    assert caught.value.processes == [1]
    assert any("process 0 was still running" in note for note in caught.value.notes)
    assert cluster.status().state == "running"  # the probe collective still worked
    assert "[process 0] fine" in run(ip, "print('fine')")


def test_interrupting_a_plain_cell_keeps_the_cluster(cluster, ip, tmp_path):
    marker = tmp_path / "sleeping"
    ip.user_ns["marker"] = str(marker)
    cluster_magic.line(ip, "push marker", TIMEOUT)
    watcher = interrupt_when(str(marker))
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run(ip, "half_done = 1\nimport pathlib, time\npathlib.Path(marker).touch()\ntime.sleep(60)")
    watcher.join(5)
    assert time.monotonic() - started < 20
    assert cluster.status().state == "running"
    with pytest.raises(UsageError, match="'half_done' is not defined on the cluster"):
        gather(["half_done"])  # the interrupted cell was rolled back
    assert gather(["marker"])["marker"] == [str(marker)] * 2


def test_an_interrupt_while_the_cell_is_sent_stops_it_everywhere(cluster, ip, monkeypatch):
    """Kernel -> Interrupt while the kernel is still sending the cell (on a loaded machine an engine can
    start it before the kernel has sent it to every process): the cell is stopped in every process and
    rolled back, as for an interrupt during the wait. It used to escape from ipyparallel's send with the
    cell still running, so the next request waited behind it into its timeout."""
    send = cluster._submit_execute

    def send_then_interrupt(ranks, code):
        requests = send(ranks, code)
        _thread.interrupt_main()  # the user's interrupt, before the kernel waits on what it sent
        return requests

    monkeypatch.setattr(cluster, "_submit_execute", send_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(ip, "sent_half = 1\nimport time\ntime.sleep(60)")
    monkeypatch.undo()
    assert cluster.status().state == "running"
    with pytest.raises(UsageError, match="'sent_half' is not defined on the cluster"):
        current().gather(["sent_half"], timeout=10)  # a cell still sleeping would make this time out


def test_a_slow_plain_cell_past_its_timeout_keeps_the_cluster(cluster, ip):
    from jaxpar_magic.cluster.status import ClusterError

    started = time.monotonic()
    with pytest.raises(ClusterError, match="within the 3 s timeout.*still usable") as caught:
        run(ip, "slow_started = 1\nimport time\ntime.sleep(60)", "--timeout 3")
    for rank in (0, 1):  # each process says where it was (the hang doctor), before the interrupt
        assert f"Process {rank} waits at line 3 of the cell (`time.sleep(60)`)" in str(caught.value)
    assert 3 <= time.monotonic() - started < 15
    assert cluster.status().state == "running"
    with pytest.raises(UsageError, match="'slow_started' is not defined on the cluster"):
        gather(["slow_started"])  # rolled back like any failed cell


def test_stop_is_fast_and_leaves_no_process(cluster, ip):
    family = cluster_processes()
    kinds = sorted(next(part for part in _cmdline(p) if part.startswith("ipyparallel")) for p in family)
    assert kinds.count("ipyparallel.engine") == 2 and kinds.count("ipyparallel.engine.nanny") == 2
    assert "ipyparallel.controller" in kinds
    started = time.monotonic()
    cluster_magic.line(ip, "stop", TIMEOUT)
    assert time.monotonic() - started < 3
    assert [p.pid for p in family if not gone(p)] == []
    assert current() is None and cluster.status().state == "stopped"
    with pytest.raises(UsageError, match="no cluster is running"):
        cluster_magic.line(ip, "stop", TIMEOUT)
    with pytest.raises(UsageError, match="no cluster is running"):
        run(ip, "print(1)")
