"""Identical re-runs of a --no-show cell skip re-reading the line (magics._replays, the bench's hot
path); whatever that skipped must still be noticed: a rebound mesh, changed inputs, a changed
%config default.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import PartitionSpec as P

from jaxpar_magic.face import magics
from shell_helpers import N_DEVICES, run_python, shown_widgets


def mesh(ip, line: str):
    with capture_output():
        ip.run_line_magic("mesh", line + " --no-show")


@pytest.mark.parametrize("magic, line, source", [
    ("shard", "--in x=data --no-show", "y = x * 2"),
    ("shard_map", "--in x=data --out y=data --no-show", "y = x * 2"),
])
def test_a_rebound_default_mesh_is_followed(jx, magic, line, source):
    jx.push({"x": jnp.arange(16.0)})
    mesh(jx, "data=8")
    jx.run_cell_magic(magic, line, source)
    jx.run_cell_magic(magic, line, source)  # the replay
    assert jx.user_ns["y"].sharding.mesh.shape["data"] == 8
    mesh(jx, "data=4 --devices 4")  # `mesh` now means another mesh
    jx.push({"x": jnp.arange(16.0)})
    jx.run_cell_magic(magic, line, source)
    assert jx.user_ns["y"].sharding.mesh.shape["data"] == 4
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(16.0) * 2)


def test_a_named_mesh_rebound_is_followed(jx):
    jx.push({"x": jnp.arange(8.0)})
    mesh(jx, "data=8 --name m")
    line = "--mesh m --in x=data --no-show"
    jx.run_cell_magic("shard", line, "y = x + 1")
    mesh(jx, "data=2 --devices 2 --name m")
    jx.push({"x": jnp.arange(8.0)})
    jx.run_cell_magic("shard", line, "y = x + 1")
    assert jx.user_ns["y"].sharding.spec == P("data") and len(jx.user_ns["y"].sharding.device_set) == 2


def test_replays_notice_changed_inputs_and_errors(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    jx.run_cell_magic("pmap", "--no-show", "y = x * 3")
    key = ("pmap", "--no-show", "y = x * 3", ("i", True))  # (magic, line, cell, (axis_name, show))
    assert key in magics._replays
    jx.push({"x": jnp.ones((N_DEVICES, 2))})  # a new shape: the engine checks again and recompiles
    jx.run_cell_magic("pmap", "--no-show", "y = x * 3")
    np.testing.assert_allclose(jx.user_ns["y"], np.full((N_DEVICES, 2), 3.0))
    jx.push({"x": jnp.ones(3)})  # no slice per device: the same UsageError as without a replay
    with pytest.raises(UsageError, match="one slice per device"):
        jx.run_cell_magic("pmap", "--no-show", "y = x * 3")
    assert key not in magics._replays  # a replay that raised is forgotten
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    jx.run_cell_magic("pmap", "--no-show", "y = x * 3")
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(N_DEVICES) * 3.0)


def test_a_changed_config_default_is_not_replayed(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    jx.run_cell_magic("pmap", "--no-show", "t = lax.psum(x, 'i')")
    jx.run_line_magic("config", "JaxparMagics.axis_name = 'batch'")
    with pytest.raises(UsageError, match="unknown axis name 'i'"):
        jx.run_cell_magic("pmap", "--no-show", "t = lax.psum(x, 'i')")


def test_shown_cells_are_not_replayed(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    with capture_output() as captured:
        jx.run_cell_magic("pmap", "", "y = x + 1")
        jx.run_cell_magic("pmap", "", "y = x + 1")
    assert len(captured.outputs) == 2  # each run shows its view
    assert ("pmap", "", "y = x + 1", ("i", True)) not in magics._replays


def test_the_very_same_input_skips_its_checks_and_a_new_one_is_checked_again(jx):
    """A jax.Array is immutable, so a replay passes an input with the very same type, sharding and
    aval as the last one that passed straight through; an equal array laid out differently (same
    shape and dtype) must still be placed where --in puts it."""
    from jax.sharding import NamedSharding

    from jaxpar_magic.stages.run import shard as shard_run

    mesh(jx, "data=8")
    x = jnp.arange(16.0)
    jx.push({"x": x})
    line, source = "--in x=data --no-show", "y = x * 2"
    jx.run_cell_magic("shard", line, source)  # places x (binds the placed x) and compiles
    placed = jx.user_ns["x"]
    jx.run_cell_magic("shard", line, source)  # the replay checks the placed x once...
    (rerun,) = [r for k, r in shard_run._reruns.items() if k[0].strip() == source and k[1] is jx.user_ns["mesh"]]
    assert rerun.checked[0] == (type(placed), placed.sharding, placed.aval)
    jx.run_cell_magic("shard", line, source)  # ...and then knows it by those
    assert jx.user_ns["x"] is placed and rerun.live
    replicated = jax.device_put(x, NamedSharding(jx.user_ns["mesh"], P()))
    jx.push({"x": replicated})  # same shape and dtype, another layout: not the checked object
    jx.run_cell_magic("shard", line, source)
    assert jx.user_ns["x"] is not replicated and jx.user_ns["x"].sharding.spec == P("data")
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(16.0) * 2)
    jx.push({"x": jnp.arange(24.0)})  # a new shape: checked, recompiled, right
    jx.run_cell_magic("shard", line, source)
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(24.0) * 2)


def test_a_cell_fed_its_own_output_passes_straight_through_and_any_other_array_is_checked(jx, monkeypatch):
    """`x = f(x)`: each re-run reads the array its own program returned, a new object with the type,
    sharding and aval of the last one that passed (Rerun.checked), and passes it straight through,
    its deleted check included (Rerun.live). An array differing in any of them (uncommitted, another
    mesh of the same devices, a weak type, another dtype, deleted) is checked again; every run equals
    plain JAX, and a deleted one is the same UsageError as without a replay."""
    from jax.sharding import NamedSharding

    from jaxpar_magic.cell.inputs import TreeInput
    from jaxpar_magic.stages.run import shard as shard_run

    mesh(jx, "data=8")
    w = jnp.eye(4) * 0.5
    line, source = "--in x=data,None --no-show", "x = jnp.tanh(x @ w)"

    def steps(start, n: int):
        jx.push({"x": start, "w": w})
        expected = start
        for _ in range(n):
            jx.run_cell_magic("shard", line, source)
            expected = jnp.tanh(expected @ w)
        np.testing.assert_allclose(jx.user_ns["x"], expected, rtol=1e-6)
        assert jx.user_ns["x"].dtype == expected.dtype and jx.user_ns["x"].sharding.spec == P("data", None)

    steps(jnp.ones((8, 4)), 4)
    (rerun,) = [r for k, r in shard_run._reruns.items() if k[0].strip() == source and k[1] is jx.user_ns["mesh"]]
    assert rerun.live  # the last replays knew x (and w) by their facts
    full_checks = []
    real = TreeInput.matching_arrays
    monkeypatch.setattr(TreeInput, "matching_arrays", lambda tree, value: full_checks.append(tree.name) or real(tree, value))
    before = jx.user_ns["x"]
    jx.run_cell_magic("shard", line, source)  # a new x, its program's own output: no full check
    assert full_checks == [] and jx.user_ns["x"] is not before
    np.testing.assert_allclose(jx.user_ns["x"], jnp.tanh(before @ w), rtol=1e-6)
    monkeypatch.undo()
    other = jax.make_mesh((8,), ("rows",), devices=jax.devices())  # the same devices, another axis name
    with capture_output():  # the input laid out again says so
        for start in (jnp.arange(32.0).reshape(8, 4), jax.device_put(jnp.ones((8, 4)), NamedSharding(other, P("rows"))),
                      jnp.full((8, 4), 2.0, dtype=jnp.bfloat16), jnp.asarray(np.ones((8, 4))) * 1.0):
            steps(start, 2)
    weak = jax.device_put(jnp.broadcast_to(jnp.asarray(1.0), (8, 4)), NamedSharding(jx.user_ns["mesh"], P("data", None)))
    assert weak.aval.weak_type and weak.sharding == jx.user_ns["x"].sharding  # only its weak type differs
    steps(weak, 2)
    jx.user_ns["x"].delete()
    with pytest.raises(UsageError, match="was deleted"):
        jx.run_cell_magic("shard", line, source)


def test_a_split_input_known_by_identity_is_still_reshaped(jx):
    jx.push({"x": jnp.arange(float(2 * N_DEVICES))})
    for _ in range(3):  # full path, replay checking x, replay knowing x by identity
        jx.run_cell_magic("pmap", "--split x --no-show", "y = x.sum()")
        np.testing.assert_allclose(jx.user_ns["y"], np.arange(2.0 * N_DEVICES).reshape(N_DEVICES, 2).sum(axis=1))


def test_a_replay_whose_run_fails_leaves_the_namespace_and_is_forgotten():
    """An error only the run shows (a host callback raising), on the replay path: the namespace keeps
    the last outputs, the replay is forgotten, and %%pmap's note of what each device saw is added. In
    a fresh process: JAX keeps a failed callback's runtime token, which later effects barriers raise."""
    done = run_python("""
        import jax
        jax.config.update("jax_num_cpu_devices", 8)
        import jax.numpy as jnp, numpy as np
        from IPython.core.interactiveshell import InteractiveShell
        from jaxpar_magic.face import magics
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "jaxpar_magic")
        state = {"fail": False}
        def host(v):
            if state["fail"]:
                raise ValueError("the host refuses")
            return np.asarray(v) * 2
        shell.push({"x": jnp.arange(8.0), "host": host, "jax": jax})
        line, cell = "--no-show", "y = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)"
        shell.run_cell_magic("pmap", line, cell)
        shell.run_cell_magic("pmap", line, cell)  # a replay
        key = ("pmap", line, cell, ("i", True))
        assert key in magics._replays
        before = shell.user_ns["y"]
        state["fail"] = True
        try:
            shell.run_cell_magic("pmap", line, cell)
        except Exception as exc:
            assert "the host refuses" in str(exc), exc
            notes = getattr(exc, "__notes__", [])
            assert any("each device sees its own slice" in n and "x: float32[]" in n for n in notes), notes
        else:
            raise AssertionError("the failing callback raised nothing")
        assert shell.user_ns["y"] is before and key not in magics._replays
        print("checked")
    """)
    assert "checked" in done.stdout, done.stderr[-3000:]


def test_an_input_committed_to_other_devices_is_named_on_the_replay_and_the_full_path(jx):
    """jit moves no committed array: one placed on a single device, or computed by a cell over fewer
    devices, gets a UsageError naming it and its devices (JAX's own says `blocks[0][0]` of an inner
    function), and the advice given works."""
    from IPython.core.error import UsageError as IPythonUsageError

    jx.push({"x": jnp.arange(float(N_DEVICES))})
    line, cell = "--no-show", "y = x * 3"
    jx.run_cell_magic("pmap", line, cell)
    jx.run_cell_magic("pmap", line, cell)  # a replay
    before = jx.user_ns["y"]
    jx.push({"x": jax.device_put(jnp.arange(float(N_DEVICES)), jax.devices()[3])})
    for _ in range(2):  # the replay, then the full path
        with pytest.raises(IPythonUsageError, match=r"`x` is committed to device 3 \(read on line 1 .*runs on mesh "
                                                    rf"i={N_DEVICES} \(Auto axes\) on devices 0-{N_DEVICES - 1}\b"):
            jx.run_cell_magic("pmap", line, cell)
        assert jx.user_ns["y"] is before
    jx.run_cell("x = jax.tree.map(jnp.asarray, jax.device_get(x))").raise_error()  # the advice
    jx.run_cell_magic("pmap", line, cell)
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(N_DEVICES) * 3.0)

    half = N_DEVICES // 2
    mesh(jx, f"data={half} --devices {half} --name half")
    jx.push({"v": jnp.arange(16.0)})
    jx.run_cell_magic("shard", "--mesh half --in v=data --no-show", "w = v + 1")  # w: committed to half the devices
    with pytest.raises(IPythonUsageError, match=rf"`w` is on mesh data={half} \(Explicit axes\) on devices "
                                                rf"0-{half - 1} "):
        jx.run_cell_magic("pmap", "--split w --no-show", "t = w.sum()")

    mesh(jx, "data=8")
    jx.push({"a": jax.device_put(jnp.arange(16.0), jax.devices()[0])})
    with pytest.raises(IPythonUsageError, match=r"`a` is committed to device 0 "):
        jx.run_cell_magic("shard_map", "--in a=data --out b=data --no-show", "b = a * 2")


@pytest.mark.parametrize("magic, line", [
    ("pmap", "--no-show"),
    ("pmap", "--split x --no-show"),
    ("shard", "--mesh data=8 --in x=data --no-show"),
    ("shard_map", "--mesh data=8 --in x=data --out y=data --no-show"),
])
def test_a_deleted_input_is_named_on_the_replay_and_the_full_path(jx, magic, line):
    """A donated (deleted) array passes the replay's identity check no more: the magic says which
    name, on the replay and on the full path alike, and binds nothing."""
    cell, size = "y = x * 2", N_DEVICES if line == "--no-show" else 16  # one row per device, or split / sharded
    jx.push({"x": jnp.arange(float(size))})
    jx.run_cell_magic(magic, line, cell)
    jx.run_cell_magic(magic, line, cell)  # the replay knows x now
    before = jx.user_ns["y"]
    jx.user_ns["x"].delete()  # what a function with donate_argnums does to its argument
    for _ in range(2):  # the replay declines to the full path, then the full path alone
        with pytest.raises(UsageError, match=r"`x` was deleted: its device buffers are gone \(read on line 1"):
            jx.run_cell_magic(magic, line, cell)
        assert jx.user_ns["y"] is before
    jx.push({"x": jnp.ones(size)})
    jx.run_cell_magic(magic, line, cell)
    assert float(np.asarray(jx.user_ns["y"]).sum()) == 2.0 * size


def test_a_deleted_leaf_of_a_pytree_input_is_named_by_its_path(jx):
    params = {"w": jnp.ones((8, 4)), "b": jnp.zeros(4)}
    jx.push({"params": params})
    line, cell = "--mesh data=8 --no-show", "out = params['w'].sum() + params['b'].sum()"
    jx.run_cell_magic("shard", line, cell)
    params["b"].delete()
    with pytest.raises(UsageError, match=r"`params\['b'\]` was deleted"):
        jx.run_cell_magic("shard", line, cell)
    new = {"w": jnp.ones((8, 4)), "b": jnp.zeros(4)}
    jx.push({"params": new})
    new["w"].delete()  # a new object: not known by identity, checked by structure, caught at the run
    with pytest.raises(UsageError, match=r"`params\['w'\]` was deleted"):
        jx.run_cell_magic("shard", line, cell)


# --- a re-run on an earlier input shape (issue 22, item 1) ---------------------------------------

SHAPED = """\
rows = x.shape[0]
parts = [x[i:i + 4] for i in range(0, x.shape[0], 4)]
len(parts)
"""


def _expected(n: int) -> tuple[int, int]:
    """(rows, number of parts) plain Python gives for a per-device block of n rows."""
    return n, len(range(0, n, 4))


@pytest.mark.parametrize("magic, line, per_device", [
    ("shard", "--mesh data=8 --no-show", False),
    ("shard", "--mesh data=8", False),  # the view on: the full path every run
    ("shard", "--mesh auto8 --in x=data --no-show", False),  # slicing a split axis: Auto axes (Explicit refuse it)
    ("pmap", "--no-show", True),
    ("pmap", "", True),
])
def test_a_rerun_on_an_earlier_shape_binds_that_traces_python_values(jx, magic, line, per_device):
    """x of 8 rows, then 16, then 8 again: the third run must not bind the 16-row trace's `rows`,
    its list of parts or its final value (the compiled variant for 8 rows is reused by jit)."""
    mesh(jx, "data=8 --axis-types auto --name auto8")
    for n in (8, 16, 8, 16):
        x = jnp.arange(float(N_DEVICES * n)).reshape(N_DEVICES, n) if per_device else jnp.arange(float(n))
        jx.push({"x": x})
        with capture_output():
            final = jx.run_cell_magic(magic, line, SHAPED)
        rows, count = _expected(n)
        assert jx.user_ns["rows"] == rows and type(jx.user_ns["rows"]) is int
        assert len(jx.user_ns["parts"]) == count and all(p is not None for p in jx.user_ns["parts"])
        assert final == count
        first = np.asarray(jx.user_ns["parts"][0])
        expected = np.asarray(x)[..., :4] if per_device else np.asarray(x)[:4]
        np.testing.assert_array_equal(first, expected)


def test_the_twins_bind_each_shapes_own_python_values(jx):
    from jaxpar_magic import pmap_cell, shard_cell, shard_map_cell

    mesh(jx, "data=8")
    ns = jx.user_ns
    for n in (8, 16, 8):
        ns["x"] = jnp.arange(float(n))
        result = shard_cell(SHAPED, ns, mesh=ns["mesh"])
        assert (ns["rows"], len(ns["parts"]), result.final) == (n, len(range(0, n, 4)), len(range(0, n, 4)))
        ns["x"] = jnp.ones((N_DEVICES, n))
        result = pmap_cell("rows = x.shape[0]\nrows * 10", ns)
        assert (ns["rows"], result.final) == (n, 10 * n)
        ns["x"] = jnp.arange(float(N_DEVICES * n))
        result = shard_map_cell("rows = x.shape[0]\nrows * 10", ns, mesh=ns["mesh"], in_specs={"x": ("data",)})
        assert (ns["rows"], result.final) == (n, 10 * n)  # a block of n rows per device


def test_collective_cards_belong_to_the_trace_that_ran(jx):
    """--collectives: the number of calls depends on the shape; each run's cards are its own trace's."""
    source = "for k in range(x.shape[0]):\n    t = lax.psum(x[k], 'i')\n"
    for n in (1, 3, 1):
        jx.push({"x": jnp.ones((N_DEVICES, n))})
        with capture_output() as captured:
            jx.run_cell_magic("pmap", "--collectives --no-show", source)
        (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "CollectivesView"]
        assert len(view.state["cards"]) == n


def test_a_plan_after_runs_of_other_shapes_binds_its_own_trace(jx):
    mesh(jx, "data=8")
    for n in (8, 16):
        jx.push({"x": jnp.arange(float(n))})
        jx.run_cell_magic("shard", "--no-show", "rows = x.shape[0]\ny = x * 2")
    jx.push({"x": jax.ShapeDtypeStruct((8,), jnp.float32)})
    with capture_output():
        jx.run_cell_magic("shard", "--plan --no-show", "rows = x.shape[0]\ny = x * 2")
    # A plan binds only new or abstract names (issue 22, item 8): rows and y hold the 16-row run's
    # concrete values and are left alone; the plan's own trace, for 8 rows, is on `_plan`.
    assert jx.user_ns["rows"] == 16 and jx.user_ns["y"].shape == (16,)
    planned = jx.user_ns["_plan"].abstract
    assert planned["rows"] == 8 and planned["y"].shape == (8,)
