"""Our magics on a running cluster (2 processes x 4 simulated CPU devices, on loopback): `%devices`,
`%mesh`, `%%pmap`, `%%shard`, `%%shard_map`, `%sharding` run in every process over the 8 global
devices, the notebook shows one view built from every process's facts, and names live on the
cluster. Equal to the same programs run in one process.

(The cluster's own lifecycle and faults: tests/test_cluster.py, test_cluster_faults.py.)
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax import lax

import jaxpar_magic
from shell_helpers import shown_widgets, snapshot

pytestmark = pytest.mark.slow

TRAIN_DEFS = """
def loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params - y) ** 2)

def train_step(params, batch, lr):
    grads = jax.grad(loss)(params, batch)
    grads = lax.pmean(grads, axis_name='batch')
    return params - lr * grads, loss(params, batch)
"""
STEPS, LR = 20, 0.1


@pytest.fixture(scope="module")
def cluster(_shell):
    """`%cluster start -n 2 --simulate 4` in the test shell; stopped at the end, whatever happens."""
    shell, _ = _shell
    if shell.find_cell_magic("pmap") is None:
        shell.run_line_magic("load_ext", "jaxpar_magic")
    with capture_output():
        shell.run_line_magic("cluster", "start -n 2 --simulate 4")
    try:
        with capture_output():
            shell.run_cell_magic("cluster", "", "import jax, jax.numpy as jnp, numpy as np\nfrom jax import lax\n")
        yield shell
    finally:
        with capture_output():
            shell.run_line_magic("cluster", "stop")


def on_cluster(shell, magic: str, line: str, source: str | None = None):
    """Run one of our magics (it goes to the cluster); returns (value, widgets shown, captured)."""
    with capture_output() as captured:
        if source is None:
            value = shell.run_line_magic(magic, line)
        else:
            value = shell.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, shown_widgets(captured), captured


def gather(shell, *names):
    with capture_output():
        shell.run_line_magic("cluster", "gather " + " ".join(names))
    return [shell.user_ns.pop(n) for n in names]


def test_devices_shows_8_global_devices_grouped_by_process(cluster):
    _, (view,), _ = on_cluster(cluster, "devices", "")
    state = view.state
    assert state["total"] == 8 and [p["count"] for p in state["processes"]] == [4, 4]
    assert sorted(state["hosts"]) == ["0", "1"] and all(h["pid"] for h in state["hosts"].values())
    assert [d["process"] for d in state["devices"]] == [0] * 4 + [1] * 4


def test_the_issues_example_psum_spans_both_processes(cluster):
    with capture_output():
        cluster.run_cell_magic("cluster", "", textwrap.dedent("""
            from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
            local = np.arange(4.0) + 10 * jax.process_index()        # each process loads its own rows
            x = jax.make_array_from_process_local_data(NamedSharding(Mesh(jax.devices(), ("i",)), P("i")), local)
        """))
    value, (view,), _ = on_cluster(cluster, "pmap", "", "total = lax.psum(x, 'i')\ntotal")
    assert "global jax.Array" in repr(value)  # the value stays on the cluster
    assert "total" not in cluster.user_ns  # ... and so does the name
    (total,) = gather(cluster, "total")
    everything = np.concatenate([np.arange(4.0), np.arange(4.0) + 10])
    np.testing.assert_allclose(total, np.full(8, everything.sum()))
    tile = view.state["outputs"][0]
    assert tile["same_on_all"] and view.state["device_process"] == [0] * 4 + [1] * 4
    (collective,) = view.state["collectives"]
    assert collective["op"] == "all-reduce" and sorted(collective["groups"][0] or GLOBAL_IDS) == GLOBAL_IDS


GLOBAL_IDS = [0, 1, 2, 3, 2048, 2049, 2050, 2051]  # process 0's devices, then process 1's


def test_a_ppermute_ring_across_processes(cluster):
    ring = np.arange(8.0) * 3
    cluster.push({"ring": ring})
    with capture_output():
        cluster.run_line_magic("cluster", "scatter ring")
    del cluster.user_ns["ring"]
    on_cluster(cluster, "pmap", "--no-show", "nxt = lax.ppermute(ring, 'i', [(j, (j + 1) % 8) for j in range(8)])")
    (nxt,) = gather(cluster, "nxt")
    np.testing.assert_allclose(nxt, np.roll(ring, 1))


def cluster_run(shell, code: str):
    with capture_output():
        shell.run_cell_magic("cluster", "", textwrap.dedent(code))


def test_scatter_then_pmap_then_gather_equals_numpy(cluster):
    v = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    cluster.push({"v": v})
    with capture_output():
        cluster.run_line_magic("cluster", "scatter v")
    del cluster.user_ns["v"]
    on_cluster(cluster, "pmap", "--no-show", "w = jnp.sin(v) * 2")
    (w,) = gather(cluster, "w")
    np.testing.assert_allclose(w, np.sin(v) * 2, rtol=1e-6)


def test_seed_train_step_over_two_processes_equals_one_process(cluster):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(8, 10, 3)).astype(np.float32)
    ys = rng.normal(size=(8, 10)).astype(np.float32)
    w0 = np.array([0.5, -1.0, 2.0], np.float32)
    cluster.push({"xs": xs, "ys": ys, "w0": w0})
    with capture_output():
        cluster.run_line_magic("cluster", "push xs ys w0")
    on_cluster(cluster, "pmap", "-a batch --in-axes '(None, 0, None)'", TRAIN_DEFS)
    # numpy inputs passed to a global program are read as the global value: every process holds the same
    cluster_run(cluster, f"""
        params = w0
        for _ in range({STEPS}):
            params, losses = train_step(params, (xs, ys), {LR})
            params = params[0]  # every device holds the same new parameters: keep one copy
    """)
    (trained,) = gather(cluster, "params")
    # The same training in this one process, with the plain-Python twin.
    ns = {"jax": jax, "jnp": jnp, "lax": lax}
    exec(TRAIN_DEFS, ns)
    step = jaxpar_magic.pmap(ns["train_step"], axis_name="batch", in_axes=(None, 0, None))
    params = jnp.asarray(w0)
    for _ in range(STEPS):
        params, _ = step(params, (xs, ys), LR)
        params = params[0]
    np.testing.assert_allclose(trained, np.asarray(params), rtol=1e-5)
    assert not np.allclose(trained, w0)  # it did train


def test_seed_sharded_dot_product_with_shard_over_the_global_mesh(cluster):
    cluster_run(cluster, """
        rng = np.random.default_rng(42)                    # the same data in every process
        vs = rng.normal(size=(8000, 100)).astype(np.float32)
        v1s, v2s = vs[:4000], vs[4000:]
        def dot(a, b):
            return jnp.vdot(a, b)
    """)
    _, views, _ = on_cluster(cluster, "mesh", "data=8")
    assert views[0].state["device_ids"] == GLOBAL_IDS
    _, views, _ = on_cluster(cluster, "shard", "--in v1s=data v2s=data", "d = jax.vmap(dot)(v1s, v2s)")
    shards = {v.state["name"]: v.state for v in views}
    assert set(shards) == {"v1s", "v2s", "d"}
    assert set(shards["d"]["device_process"].values()) == {0, 1}  # which process holds each block
    (d,) = gather(cluster, "d")
    vs = np.random.default_rng(42).normal(size=(8000, 100)).astype(np.float32)
    np.testing.assert_allclose(d, np.einsum("ij,ij->i", vs[:4000], vs[4000:]), rtol=1e-4, atol=1e-4)


def test_a_pytree_output_is_one_tree_view_whose_pictures_name_processes(cluster):
    on_cluster(cluster, "mesh", "data=8 --no-show")
    cluster_run(cluster, "x = np.arange(64, dtype=np.float32).reshape(8, 8)")
    _, views, _ = on_cluster(cluster, "shard", "--in x=data", "pair = {'a': x * 2, 'b': x + 1}")
    assert [(type(v).__name__, v.state["name"]) for v in views] == [("ShardingView", "x"), ("TreeView", "pair")]
    tree = views[1].state
    (row,) = tree["rows"]  # both leaves share one layout
    assert (row["count"], row["paths"], row["where"]) == (2, ["['a']", "['b']"], "split dim 0 8× over data")
    assert tree["pictures"][0]["device_process"] == {str(d): k // 4 for k, d in enumerate(GLOBAL_IDS)}


def test_shard_map_and_collective_cards_on_the_cluster(cluster):
    on_cluster(cluster, "mesh", "x=4 y=2 --name m2 --no-show")
    cluster_run(cluster, "a = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)\nb = np.ones((16, 4), np.float32)")
    _, views, _ = on_cluster(cluster, "shard_map", "--mesh m2 --in a=x,y b=y,None --out c=x,None --collectives",
                             "c = lax.psum(jnp.dot(a, b), 'y')")
    kinds = [type(v).__name__ for v in views]
    assert kinds == ["ResultView", "ShardingView", "CollectivesView"]
    (card,) = views[2].state["cards"]
    assert card["op"] == "psum" and views[2].state["device_process"] == [0] * 4 + [1] * 4
    (c,) = gather(cluster, "c")
    np.testing.assert_allclose(c, np.arange(8 * 16, dtype=np.float32).reshape(8, 16) @ np.ones((16, 4)))


def test_a_name_only_the_kernel_has_says_push_or_scatter(cluster):
    cluster.push({"kernel_only": np.ones(8)})
    before = snapshot(cluster.user_ns)
    with pytest.raises(UsageError) as err:
        on_cluster(cluster, "pmap", "", "y = kernel_only * 2")
    message = str(err.value)
    assert "kernel_only" in message and "%cluster push kernel_only" in message and "%cluster scatter" in message
    assert snapshot(cluster.user_ns) == before
    del cluster.user_ns["kernel_only"]


def test_plain_cells_still_run_in_the_kernel(cluster):
    cluster.run_cell("here = 41 + 1", store_history=False).raise_error()
    assert cluster.user_ns.pop("here") == 42
