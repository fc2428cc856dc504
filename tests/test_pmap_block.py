"""%%pmap in block mode: the cell is what ONE device runs, on all 8 simulated devices at once.

Results are compared with `jax.pmap` of the same per-device function, or with numpy by hand.
"""
from __future__ import annotations

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from jax import lax

import jaxpar_magic
from shell_helpers import N_DEVICES, pmap, shown_state
from jaxpar_magic.views import summaries, values

# The run stage's module, found through its twin: `jaxpar_magic.pmap` names function mode's twin.
engine = importlib.import_module(jaxpar_magic.pmap_cell.__module__)
from jaxpar_magic.cell.bounded_cache import CACHE_SIZE  # noqa: E402

RING = [(j, (j + 1) % N_DEVICES) for j in range(N_DEVICES)]


@pytest.fixture
def x(jx):
    value = np.arange(24, dtype=np.float32).reshape(N_DEVICES, 3)
    jx.push({"x": value})
    return value


def ref_pmap(fn, *args, **kwargs):
    """jax.pmap of the per-device function: the meaning a %%pmap cell must keep."""
    return jax.pmap(fn, axis_name="i", **kwargs)(*args)


# --- inputs, constants, outputs ------------------------------------------------------------------

def test_inputs_are_split_and_outputs_come_back_with_a_device_axis(jx, x):
    pmap(jx, "--no-show", "y = x * 2 + lax.axis_index('i')\ns = y.sum()")
    y, s = jx.user_ns["y"], jx.user_ns["s"]
    assert isinstance(y, jax.Array) and y.shape == (N_DEVICES, 3)
    np.testing.assert_array_equal(y, x * 2 + np.arange(N_DEVICES)[:, None])
    assert s.shape == (N_DEVICES,)
    np.testing.assert_array_equal(s, (x * 2 + np.arange(N_DEVICES)[:, None]).sum(1))
    assert jx.user_ns["x"] is x  # an input that is not assigned stays as it was


def test_constants_numbers_and_modules_are_read_as_they_are(jx, x):
    import math

    jx.push({"scale": 3.0, "math": math, "offset": 2})
    pmap(jx, "--no-show", "y = x * scale + math.pi + offset")
    np.testing.assert_allclose(jx.user_ns["y"], x * 3.0 + math.pi + 2, rtol=1e-6)
    assert jx.user_ns["scale"] == 3.0 and jx.user_ns["math"] is math


def test_a_name_assigned_before_it_is_read_is_not_an_input(jx):
    jx.push({"x": np.ones((6, 3), np.float32)})  # would not fit 8 devices, but the cell never reads it
    pmap(jx, "--no-show", "x = jnp.full(3, 2.0)\ny = x * lax.axis_index('i')")
    assert jx.user_ns["x"].shape == (N_DEVICES, 3)
    np.testing.assert_array_equal(jx.user_ns["y"], 2.0 * np.arange(N_DEVICES)[:, None] * np.ones((1, 3)))


def test_tuple_unpacking_binds_every_target(jx, x):
    pmap(jx, "--no-show", "lo, (hi, mid) = x.min(), (x.max(), x[1])")
    np.testing.assert_array_equal(jx.user_ns["lo"], x.min(1))
    np.testing.assert_array_equal(jx.user_ns["hi"], x.max(1))
    np.testing.assert_array_equal(jx.user_ns["mid"], x[:, 1])


def test_augmented_assignment_rebinds_the_input(jx, x):
    pmap(jx, "--no-show", "x += 1")
    assert jx.user_ns["x"] is not x
    assert jx.user_ns["x"].shape == x.shape
    np.testing.assert_array_equal(jx.user_ns["x"], x + 1)


def test_final_expression_is_returned_per_device(jx, x):
    value = pmap(jx, "--no-show", "y = x * 2\ny.sum()")
    assert value.shape == (N_DEVICES,)
    np.testing.assert_array_equal(value, (x * 2).sum(1))


def test_plain_python_values_come_back_as_they_are(jx, x):
    value = pmap(jx, "--no-show", "n = 3\ny = x * n\nn * 2")
    assert value == 6
    assert jx.user_ns["n"] == 3
    np.testing.assert_array_equal(jx.user_ns["y"], x * 3)


def test_a_cell_without_final_expression_returns_none(jx, x):
    assert pmap(jx, "--no-show", "y = x") is None


def test_plain_python_twin_runs_without_ipython(x):
    ns = {"x": x, "lax": lax}
    result = engine.pmap_cell("y = lax.psum(x, 'i')\ny[0]", ns)
    np.testing.assert_array_equal(ns["y"], np.broadcast_to(x.sum(0), x.shape))
    assert result.final_per_device and result.has_final
    np.testing.assert_array_equal(result.final, np.full(N_DEVICES, x[:, 0].sum()))


def test_bind_false_leaves_the_namespace_alone(x):
    ns = {"x": x}
    result = engine.pmap_cell("y = x + 1", ns, bind=False)
    assert set(ns) - {"__builtins__"} == {"x"}
    np.testing.assert_array_equal(result.outputs["y"], x + 1)


# --- collectives, compared with jax.pmap ------------------------------------------------------------

COLLECTIVES = {
    "psum": ("y = lax.psum(x, 'i')", lambda v: lax.psum(v, "i")),
    "pmean": ("y = lax.pmean(x, 'i')", lambda v: lax.pmean(v, "i")),
    "pmax": ("y = lax.pmax(x, 'i')", lambda v: lax.pmax(v, "i")),
    "pmin": ("y = lax.pmin(x, 'i')", lambda v: lax.pmin(v, "i")),
    "ppermute ring": (
        "y = lax.ppermute(x, 'i', perm=[(j, (j + 1) % 8) for j in range(8)])",
        lambda v: lax.ppermute(v, "i", perm=RING),
    ),
    "all_gather": ("y = lax.all_gather(x, 'i')", lambda v: lax.all_gather(v, "i")),
    "axis_index": ("y = x * lax.axis_index('i')", lambda v: v * lax.axis_index("i")),
    "psum groups": (
        "y = lax.psum(x, 'i', axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]])",
        lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
    ),
}

BY_HAND = {
    "psum": lambda x: np.broadcast_to(x.sum(0), x.shape),
    "pmean": lambda x: np.broadcast_to(x.mean(0), x.shape),
    "pmax": lambda x: np.broadcast_to(x.max(0), x.shape),
    "pmin": lambda x: np.broadcast_to(x.min(0), x.shape),
    "ppermute ring": lambda x: np.roll(x, 1, axis=0),  # device j+1 receives device j's block
    "all_gather": lambda x: np.broadcast_to(x, (N_DEVICES,) + x.shape),
    "axis_index": lambda x: x * np.arange(N_DEVICES)[:, None],
    "psum groups": lambda x: np.concatenate([np.broadcast_to(x[:4].sum(0), (4, 3)),
                                             np.broadcast_to(x[4:].sum(0), (4, 3))]),
}


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_collective_matches_jax_pmap_and_numpy(jx, x, name):
    source, per_device = COLLECTIVES[name]
    pmap(jx, "--no-show", source)
    y = np.asarray(jx.user_ns["y"])
    np.testing.assert_allclose(y, ref_pmap(per_device, x), rtol=1e-6)
    np.testing.assert_allclose(y, BY_HAND[name](x), rtol=1e-6)


def test_vmap_and_grad_inside_a_cell_match_jax_pmap(jx, x):
    jx.push({"w": np.linspace(-1, 1, 24, dtype=np.float32).reshape(N_DEVICES, 3)})
    source = """
    g = jax.grad(lambda v: jnp.sum(jnp.sin(v * w)))(x)
    d = jax.vmap(lambda a, b: a * b + 1)(x, w)
    g_total = lax.psum(g, 'i')
    """
    pmap(jx, "--no-show", source)

    def per_device(xx, ww):
        g = jax.grad(lambda v: jnp.sum(jnp.sin(v * ww)))(xx)
        return g, jax.vmap(lambda a, b: a * b + 1)(xx, ww), lax.psum(g, "i")

    g, d, total = ref_pmap(per_device, x, jx.user_ns["w"])
    np.testing.assert_allclose(jx.user_ns["g"], g, rtol=1e-6)
    np.testing.assert_allclose(jx.user_ns["d"], d, rtol=1e-6)
    np.testing.assert_allclose(jx.user_ns["g_total"], total, rtol=1e-5)
    np.testing.assert_allclose(jx.user_ns["g"], jx.user_ns["w"] * np.cos(x * jx.user_ns["w"]), rtol=1e-5)


# --- --broadcast, --split, --merge --------------------------------------------------------------------

def test_broadcast_gives_every_device_the_whole_array(jx, x):
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    jx.push({"w": w})
    pmap(jx, "--no-show --broadcast w", "y = x @ w")
    np.testing.assert_allclose(jx.user_ns["y"], ref_pmap(lambda a, b: a @ b, x, w, in_axes=(0, None)))
    np.testing.assert_allclose(jx.user_ns["y"], x @ w)


def test_split_gives_each_device_a_block_of_rows(jx):
    batch = np.arange(64, dtype=np.float32).reshape(32, 2)
    jx.push({"batch": batch})
    pmap(jx, "--no-show --split batch", "y = batch * 10 + lax.axis_index('i')\nrows = batch.shape[0]")
    y = jx.user_ns["y"]
    assert y.shape == (N_DEVICES, 4, 2)  # 8 devices x 4 rows each
    assert jx.user_ns["rows"] == 4
    blocks = batch.reshape(N_DEVICES, 4, 2)
    np.testing.assert_array_equal(y, blocks * 10 + np.arange(N_DEVICES)[:, None, None])


def test_merge_flattens_device_and_block_axes(jx):
    batch = np.arange(64, dtype=np.float32).reshape(32, 2)
    jx.push({"batch": batch})
    pmap(jx, "--no-show --split batch --merge y", "y = batch * 10 + lax.axis_index('i')\nz = batch.sum()")
    assert jx.user_ns["y"].shape == (32, 2)
    expected = batch * 10 + np.repeat(np.arange(N_DEVICES), 4)[:, None]
    np.testing.assert_array_equal(jx.user_ns["y"], expected)
    assert jx.user_ns["z"].shape == (N_DEVICES,)  # not merged: one value per device


# --- which devices, which mesh --------------------------------------------------------------------------

def _device_ids(array) -> set[int]:
    return {d.id for d in array.sharding.device_set}


def test_devices_first_n(jx):
    x4 = np.arange(8, dtype=np.float32).reshape(4, 2)
    jx.push({"x4": x4})
    pmap(jx, "--no-show --devices 4", "y = lax.psum(x4, 'i')")
    y = jx.user_ns["y"]
    np.testing.assert_array_equal(y, np.broadcast_to(x4.sum(0), (4, 2)))
    assert _device_ids(y) == {0, 1, 2, 3}


def test_devices_by_id(jx):
    x4 = np.arange(8, dtype=np.float32).reshape(4, 2)
    jx.push({"x4": x4})
    pmap(jx, "--no-show --devices 0 2 4 6", "y = lax.psum(x4, 'i')\nk = lax.axis_index('i')")
    y = jx.user_ns["y"]
    np.testing.assert_array_equal(y, np.broadcast_to(x4.sum(0), (4, 2)))
    np.testing.assert_array_equal(jx.user_ns["k"], np.arange(4))
    assert _device_ids(y) == {0, 2, 4, 6}


def test_mesh_collectives_over_each_axis_and_both(jx):
    xm = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    jx.push({"xm": xm})
    source = """
    a = lax.psum(xm, 'outer')
    b = lax.psum(xm, 'inner')
    c = lax.psum(xm, ('outer', 'inner'))
    m = lax.pmean(xm, ('outer', 'inner'))
    io = lax.axis_index('outer')
    ii = lax.axis_index('inner')
    """
    pmap(jx, "--no-show --mesh outer=2,inner=4", source)
    ns = jx.user_ns
    for name in "abcm":
        assert ns[name].shape == (2, 4, 3), name
    for o in range(2):
        for i in range(4):
            np.testing.assert_array_equal(ns["a"][o, i], sum(xm[oo, i] for oo in range(2)))
            np.testing.assert_array_equal(ns["b"][o, i], sum(xm[o, ii] for ii in range(4)))
            total = sum(xm[oo, ii] for oo in range(2) for ii in range(4))
            np.testing.assert_array_equal(ns["c"][o, i], total)
            np.testing.assert_allclose(ns["m"][o, i], total / 8, rtol=1e-6)
            assert int(ns["io"][o, i]) == o
            assert int(ns["ii"][o, i]) == i


def test_mesh_ppermute_within_rows(jx):
    xm = np.arange(8, dtype=np.float32).reshape(2, 4)
    jx.push({"xm": xm})
    pmap(jx, "--no-show --mesh outer=2,inner=4", "y = lax.ppermute(xm, 'inner', [(j, (j + 1) % 4) for j in range(4)])")
    np.testing.assert_array_equal(jx.user_ns["y"], np.roll(xm, 1, axis=1))


def test_pytree_inputs(jx, x):
    pair = (x, x + 100)
    params = {"w": np.ones((N_DEVICES, 3), np.float32), "b": np.arange(N_DEVICES, dtype=np.float32)}
    jx.push({"pair": pair, "params": params})
    pmap(jx, "--no-show", "s = pair[0] * pair[1]\nout = (x * params['w']).sum() + params['b']\nboth = (pair[0], params['b'])")
    np.testing.assert_array_equal(jx.user_ns["s"], x * (x + 100))
    np.testing.assert_array_equal(jx.user_ns["out"], x.sum(1) + np.arange(N_DEVICES))
    first, b = jx.user_ns["both"]
    np.testing.assert_array_equal(first, x)
    np.testing.assert_array_equal(b, np.arange(N_DEVICES))


# --- the compile cache -------------------------------------------------------------------------------

def test_a_changed_constant_takes_effect_on_the_next_run(jx, x):
    jx.push({"scale": 2.0})
    pmap(jx, "--no-show", "y = x * scale")
    np.testing.assert_array_equal(jx.user_ns["y"], x * 2.0)
    jx.push({"scale": 5.0})
    pmap(jx, "--no-show", "y = x * scale")
    np.testing.assert_array_equal(jx.user_ns["y"], x * 5.0)


def test_a_new_helper_at_a_dead_helpers_address_takes_effect(jx, x):
    # Rebinding a name frees the old object, and CPython soon gives a new object the same id().
    # A cache keyed on id() without holding the object would then run the stale helper.
    import gc

    def make(k):
        def helper(v):
            return v * k
        return helper

    jx.user_ns["helper"] = make(2)
    pmap(jx, "--no-show", "y = helper(x)")
    np.testing.assert_array_equal(jx.user_ns["y"], x * 2)
    dead_id = id(jx.user_ns["helper"])
    jx.user_ns["helper"] = None  # the only reference we hold goes away
    gc.collect()
    alive = []  # keeps non-matching helpers alive so each new one gets a fresh address
    for k in range(3, 20_000):
        helper = make(k)
        if id(helper) == dead_id:
            break
        alive.append(helper)
    else:  # the old helper is still alive somewhere (a cache holding it): no stale id possible
        return
    jx.user_ns["helper"] = helper
    pmap(jx, "--no-show", "y = helper(x)")
    np.testing.assert_array_equal(jx.user_ns["y"], x * k)


def test_an_unchanged_rerun_does_not_compile_again(jx, x, compiles):
    from IPython.utils.capture import capture_output

    source = "y = lax.psum(x, 'i') * 7.5\nz = y - x"
    with capture_output():
        pmap(jx, "", source)  # default: shown, so the view's own reads are counted too
    assert compiles.count >= 1
    compiles.count = 0
    with capture_output():
        pmap(jx, "", source)
    assert compiles.count == 0
    pmap(jx, "--no-show", source)
    assert compiles.count == 0


def test_a_changed_shape_or_cell_compiles_again(jx, x, compiles):
    source = "y = lax.psum(x, 'i') * 8.5"
    pmap(jx, "--no-show", source)
    compiles.count = 0
    jx.push({"x": np.ones((N_DEVICES, 5), np.float32)})
    pmap(jx, "--no-show", source)
    assert compiles.count >= 1
    np.testing.assert_array_equal(jx.user_ns["y"], np.full((N_DEVICES, 5), 8 * 8.5))
    compiles.count = 0
    pmap(jx, "--no-show", source + " + 1")
    assert compiles.count >= 1
    np.testing.assert_array_equal(jx.user_ns["y"], np.full((N_DEVICES, 5), 8 * 8.5 + 1))


def test_the_cache_is_bounded_and_drops_the_least_recently_used(jx, x, compiles):
    engine.clear_cache()
    cache = engine._block_cache
    cells = [f"y = x + {k}" for k in range(CACHE_SIZE + 2)]
    for source in cells:
        pmap(jx, "--no-show", source)
        assert len(cache) <= CACHE_SIZE
    assert len(cache) == CACHE_SIZE
    compiles.count = 0
    pmap(jx, "--no-show", cells[-1])  # still cached
    assert compiles.count == 0
    pmap(jx, "--no-show", cells[0])  # evicted first: it compiles again, and still runs
    assert compiles.count >= 1
    np.testing.assert_array_equal(jx.user_ns["y"], x)


# --- the result view's state ------------------------------------------------------------------------

def _numbers(text: str) -> list[float]:
    return [float(t) for t in re.findall(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?", text)]


def test_view_state_tiles_same_on_all_and_collectives(jx, x):
    source = """
    y = x * 2
    s = lax.psum(x, 'i')
    r = lax.ppermute(x, 'i', perm=[(j, (j + 1) % 8) for j in range(8)])
    """
    value, state = shown_state(jx, "--show", source)
    assert value is None
    assert "8" in state["title"]
    assert state["axes"] == [{"name": "i", "size": N_DEVICES}]
    assert state["device_ids"] == list(range(N_DEVICES))
    outputs = {o["name"]: o for o in state["outputs"]}
    assert list(outputs) == ["y", "s", "r"]

    y = outputs["y"]
    assert (y["shape"], y["dtype"], y["same_on_all"], y["omitted"]) == ([3], "float32", False, 0)
    assert len(y["tiles"]) == N_DEVICES
    for k, tile in enumerate(y["tiles"]):
        assert tile["devices"] == [k]
        assert list(tile["coords"]) == [k]
        assert _numbers(tile["text"]) == list(x[k] * 2)

    s = outputs["s"]
    assert s["same_on_all"] is True
    assert len(s["tiles"]) == 1
    assert s["tiles"][0]["devices"] == list(range(N_DEVICES))
    assert s["same_text"] == f"same on all {N_DEVICES} devices"
    assert _numbers(s["tiles"][0]["text"]) == list(x.sum(0))

    colls = {c["op"]: c for c in state["collectives"]}
    assert set(colls) == {"all-reduce", "collective-permute"}
    reduce, permute = colls["all-reduce"], colls["collective-permute"]
    assert reduce["groups"] in ([], [list(range(N_DEVICES))])
    assert reduce["bytes"] == 12 and reduce["shape"] == "f32[3]"
    assert reduce["source_line"] == "s = lax.psum(x, 'i')"
    assert {tuple(p) for p in permute["pairs"]} == set(RING)
    assert permute["pairs_omitted"] == 0
    assert permute["source_line"].startswith("r = lax.ppermute(")
    assert state["report"] is None


def test_view_state_on_a_mesh_shows_rows_and_columns_as_groups(jx):
    xm = np.arange(8, dtype=np.float32).reshape(2, 4)
    jx.push({"xm": xm})
    _, state = shown_state(jx, "--show --mesh outer=2,inner=4", "a = lax.psum(xm, 'inner')\nb = lax.psum(xm, 'outer')")
    assert state["axes"] == [{"name": "outer", "size": 2}, {"name": "inner", "size": 4}]
    by_line = {c["source_line"]: c for c in state["collectives"]}
    inner = by_line["a = lax.psum(xm, 'inner')"]
    outer = by_line["b = lax.psum(xm, 'outer')"]
    assert sorted(map(sorted, inner["groups"])) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sorted(map(sorted, outer["groups"])) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    tiles = {o["name"]: o for o in state["outputs"]}["a"]["tiles"]
    assert [list(t["coords"]) for t in tiles] == [[o, i] for o in range(2) for i in range(4)]


def test_final_expression_appears_in_the_view(jx, x):
    value, state = shown_state(jx, "--show", "x.sum()")
    names = [o["name"] for o in state["outputs"]]
    assert names == ["(result)"]
    np.testing.assert_array_equal(value, x.sum(1))


def test_report_fills_compile_run_and_flops(jx, x):
    _, state = shown_state(jx, "--show --report", "y = jnp.tanh(x) @ jnp.ones((3, 3)) + lax.psum(x, 'i')")
    report = state["report"]
    assert report is not None
    for key in ("compile_ms", "run_ms", "flops"):
        assert isinstance(report[key], (int, float)), key
        assert report[key] >= 0, key
    assert report["compile_ms"] > 0  # this cell ran for the first time: it was compiled
    assert report["flops"] > 0


def test_report_without_view_prints_figures(jx, x):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        pmap(jx, "--no-show --report", "y = lax.psum(x, 'i') + 0.25")
    assert "compile" in captured.stdout and "run" in captured.stdout and "all-reduce" in captured.stdout


# --- bounded at scale ---------------------------------------------------------------------------------

def test_per_device_summary_ships_at_most_16_tiles_of_4096_devices():
    ids = list(range(4096))
    coords = [(i // 64, i % 64) for i in ids]
    stacked = jnp.arange(4096 * 3, dtype=jnp.float32).reshape(4096, 3)
    summary = values.per_device_summary("w", stacked, 1, ids, coords)
    assert summary["same_on_all"] is False
    assert len(summary["tiles"]) <= 16
    assert summary["omitted"] == 4096 - len(summary["tiles"])
    assert all(len(t["devices"]) == 1 for t in summary["tiles"])
    assert summary["tiles"][1]["devices"] == [1] and list(summary["tiles"][1]["coords"]) == [0, 1]
    assert _numbers(summary["tiles"][1]["text"]) == [3.0, 4.0, 5.0]


def test_per_device_summary_same_on_all_4096_is_one_tile_with_few_ids():
    ids = list(range(4096))
    stacked = jnp.ones((4096, 3), jnp.float32)
    summary = values.per_device_summary("w", stacked, 1, ids, [(i,) for i in ids])
    assert summary["same_on_all"] is True
    assert len(summary["tiles"]) == 1
    assert len(summary["tiles"][0]["devices"]) <= 16
    assert summary["same_text"] == "same on all 4096 devices"


def test_per_device_summary_shows_a_few_values_of_a_wide_block():
    ids = list(range(8))
    stacked = jnp.arange(8 * 1000, dtype=jnp.float32).reshape(8, 1000)
    summary = values.per_device_summary("w", stacked, 1, ids, [(i,) for i in ids])
    text = summary["tiles"][0]["text"]
    assert len(_numbers(text)) <= summaries.VALUES_PER_TILE
    assert "…" in text
    assert summary["shape"] == [1000]


def test_merge_with_the_view_shows_each_devices_block(jx):
    batch = np.arange(64, dtype=np.float32).reshape(32, 2)
    jx.push({"batch": batch})
    _, state = shown_state(jx, "--split batch --merge y", "y = batch * 2")
    assert jx.user_ns["y"].shape == (32, 2)  # merged back for the user
    (out,) = state["outputs"]
    assert out["name"] == "y" and out["shape"] == [4, 2]  # the view shows one device's block
    assert len(out["tiles"]) == N_DEVICES and out["tiles"][1]["text"].startswith("[16. 18.")


def test_a_ppermute_is_described_by_its_sends_not_as_a_group(jx):
    jx.push({"x": np.arange(N_DEVICES, dtype=np.float32)})
    _, state = shown_state(jx, "", f"y = lax.ppermute(x, 'i', [(k, (k + 1) % {N_DEVICES}) for k in range({N_DEVICES})])")
    (permute,) = [c for c in state["collectives"] if c["op"] == "collective-permute"]
    assert permute["groups_text"] == f"{N_DEVICES} sends between pairs of devices"
    assert permute["pairs"][:2] == [[0, 1], [1, 2]]


def test_rerun_with_new_values_of_the_same_shape_uses_them(jx):
    jx.push({"x": np.arange(N_DEVICES, dtype=np.float32)})
    pmap(jx, "--no-show", "y = lax.psum(x, 'i')")
    jx.push({"x": np.ones(N_DEVICES, dtype=np.float32)})
    pmap(jx, "--no-show", "y = lax.psum(x, 'i')")
    np.testing.assert_array_equal(jx.user_ns["y"], np.full(N_DEVICES, float(N_DEVICES)))


def test_rerun_with_a_wrong_shape_still_gets_the_usage_error(jx):
    jx.push({"x": np.arange(N_DEVICES, dtype=np.float32)})
    pmap(jx, "--no-show", "y = x + 1")
    jx.push({"x": np.arange(N_DEVICES + 1, dtype=np.float32)})
    with pytest.raises(UsageError, match="leading axis"):
        pmap(jx, "--no-show", "y = x + 1")
