"""`%%shard`: place inputs with PartitionSpecs, run the cell's code unchanged, let the compiler
partition it. The seed's dot-product listing first, then spec syntax, meshes, --out, --report,
caching, binding, and every foreseeable mistake as a UsageError that leaves the namespace alone.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxpar_magic
from shell_helpers import N_DEVICES, shown_widgets, snapshot
from jaxpar_magic.views.summaries import expand_sharding_tiles


def shard(ip, line: str, source: str):
    return ip.run_cell_magic("shard", line, textwrap.dedent(source))


def shown(captured, kind: str) -> list[dict]:
    return [w.state for w in shown_widgets(captured) if type(w).__name__ == kind]


def run_shown(ip, line: str, source: str):
    """Run a %%shard cell; return (its value, sharding view states by name, result view states)."""
    with capture_output() as captured:
        value = shard(ip, line, source)
    views = {s["name"]: s for s in shown(captured, "ShardingView")}
    return value, views, shown(captured, "ResultView")


def mesh(ip, line: str):
    with capture_output():
        ip.run_line_magic("mesh", line + " --no-show")


SEED_DEFS = """
from jax import random

def dot(v1, v2):
    return jnp.vdot(v1, v2)
"""


def seed_vectors(ip, rows: int, cols: int):
    """The seed's data, as the seed makes it: one random matrix cut into two halves."""
    ip.run_cell(SEED_DEFS, store_history=False).raise_error()
    ip.run_cell(
        f"rng_key = random.PRNGKey(42)\n"
        f"vs = random.normal(rng_key, shape=({2 * rows}, {cols}))\n"
        f"v1s = vs[:{rows}, :]\n"
        f"v2s = vs[{rows}:, :]\n",
        store_history=False,
    ).raise_error()
    v1s, v2s = ip.user_ns["v1s"], ip.user_ns["v2s"]
    expected = np.einsum("ij,ij->i", np.asarray(v1s, np.float64), np.asarray(v2s, np.float64))
    return v1s, v2s, expected


def distinct_blocks(array) -> int:
    """How many different pieces of `array` its devices hold (replicas count once)."""
    return len({tuple((s.start, s.stop) for s in shard.index) for shard in array.addressable_shards})


def assert_eight_row_blocks(state: dict, rows: int):
    assert state["grid"][0] == N_DEVICES and all(g == 1 for g in state["grid"][1:])
    tiles = expand_sharding_tiles(state)
    assert len(tiles) == N_DEVICES
    assert [t["devices"] for t in tiles] == [[i] for i in range(N_DEVICES)]
    step = rows // N_DEVICES
    assert [t["index"][0] for t in tiles] == [[i * step, (i + 1) * step] for i in range(N_DEVICES)]


# --- the seed's listing ------------------------------------------------------------------------

def test_seed_dot_product_listing_at_its_real_size(jx):
    """(8000, 10000) random normal, split in halves; `d = jax.vmap(dot)(v1s, v2s)`, code unchanged."""
    v1s, v2s, expected = seed_vectors(jx, 4_000, 10_000)
    assert v1s.shape == v2s.shape == (4_000, 10_000)
    unsharded = jax.vmap(jx.user_ns["dot"])(v1s, v2s)
    assert len(unsharded.sharding.device_set) == 1

    mesh(jx, "data=8")
    value, views, _ = run_shown(jx, "--mesh mesh --in v1s=data v2s=data", "d = jax.vmap(dot)(v1s, v2s)\n")
    assert value is None  # an assignment, no final expression

    d = jx.user_ns["d"]
    assert d.shape == (4_000,)
    np.testing.assert_allclose(np.asarray(d), np.asarray(unsharded), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(np.asarray(d), expected, rtol=1e-4, atol=1e-2)
    assert len(d.sharding.device_set) == N_DEVICES
    assert len(d.addressable_shards) == N_DEVICES
    assert {s.data.shape for s in d.addressable_shards} == {(500,)}
    assert distinct_blocks(d) == N_DEVICES  # 8 distinct blocks

    assert set(views) == {"v1s", "v2s", "d"}
    for name in ("v1s", "v2s"):
        assert views[name]["shape"] == [4_000, 10_000]
        assert views[name]["grid"] == [8, 1]
        assert_eight_row_blocks(views[name], 4_000)
    assert views["d"]["grid"] == [8]
    assert_eight_row_blocks(views["d"], 4_000)


def test_seed_listing_small(jx):
    v1s, v2s, expected = seed_vectors(jx, 40, 100)
    mesh(jx, "data=8")
    jx.run_line_magic("sharding", "v1s")  # before: one device
    before = jaxpar_magic.show_sharding(v1s, "v1s").state
    assert expand_sharding_tiles(before)[0]["shard_shape"] == [40, 100] and before["total_devices"] == 1

    value = shard(jx, "--mesh mesh --in v1s=data v2s=data --no-show", "jax.vmap(dot)(v1s, v2s)\n")
    np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5, atol=1e-4)
    assert value.sharding.spec == P("data")
    # The inputs are rebound, placed: what %sharding shows afterwards.
    after = jaxpar_magic.show_sharding(jx.user_ns["v1s"], "v1s").state
    assert after["grid"] == [8, 1]


def test_seed_listing_without_a_mesh_split_over_8(jx):
    """`--in v1s=8`: PositionalSharding's one-liner, no mesh and no axis names."""
    _, _, expected = seed_vectors(jx, 40, 100)
    _, views, _ = run_shown(jx, "--in v1s=8 v2s=8", "d = jax.vmap(dot)(v1s, v2s)\n")
    d = jx.user_ns["d"]
    np.testing.assert_allclose(np.asarray(d), expected, rtol=1e-5, atol=1e-4)
    assert len(d.sharding.device_set) == N_DEVICES and distinct_blocks(d) == 8
    assert_eight_row_blocks(views["v1s"], 40)
    assert_eight_row_blocks(views["d"], 40)
    assert "mesh" not in jx.user_ns  # nothing to name, nothing bound


def test_split_twin(jx):
    _, _, expected = seed_vectors(jx, 40, 100)
    v1sp = jaxpar_magic.split(jx.user_ns["v1s"])
    v2sp = jaxpar_magic.split(jx.user_ns["v2s"])
    assert_eight_row_blocks(jaxpar_magic.show_sharding(v1sp, "v1sp").state, 40)
    d = jax.jit(jax.vmap(jx.user_ns["dot"]))(v1sp, v2sp)
    np.testing.assert_allclose(np.asarray(d), expected, rtol=1e-5, atol=1e-4)
    assert distinct_blocks(d) == N_DEVICES


def test_split_other_axis_and_fewer_devices():
    x = jnp.arange(32.0).reshape(4, 8)
    cols = jaxpar_magic.split(x, axis=1)
    assert cols.sharding.spec == P(None, "devices")
    assert {s.data.shape for s in cols.addressable_shards} == {(4, 1)}
    four = jaxpar_magic.split(jnp.arange(8.0), devices=4)
    assert len(four.sharding.device_set) == 4
    with pytest.raises(UsageError, match="does not divide"):
        jaxpar_magic.split(jnp.arange(6.0))


def test_shard_cell_twin_matches_the_magic(jx):
    _, _, expected = seed_vectors(jx, 40, 100)
    ns = dict(jx.user_ns)
    result = jaxpar_magic.shard_cell(
        "d = jax.vmap(dot)(v1s, v2s)\n", ns, mesh=jaxpar_magic.make_mesh("data=8"),
        in_specs={"v1s": ("data",), "v2s": ("data",)},
    )
    np.testing.assert_allclose(np.asarray(ns["d"]), expected, rtol=1e-5, atol=1e-4)
    assert result.placed["v1s"] is ns["v1s"]
    assert ns["d"].sharding.spec == P("data")


# --- spec syntax on a 2-D mesh -------------------------------------------------------------------

@pytest.fixture
def grid(jx):
    mesh(jx, "data=4 model=2")
    jx.user_ns["w"] = jnp.arange(64.0).reshape(8, 8)
    return jx.user_ns["mesh"]


@pytest.mark.parametrize(
    "spec, expected, grid_shape",
    [
        ("data", P("data"), [4, 1]),
        ("data,None", P("data", None), [4, 1]),
        ("None,model", P(None, "model"), [1, 2]),
        ("(data,model),None", P(("data", "model"), None), [8, 1]),
        ("P('data', 'model')", P("data", "model"), [4, 2]),
        ("P('model', None)", P("model", None), [2, 1]),
        ("P(None, ('model', 'data'))", P(None, ("model", "data")), [1, 8]),
    ],
)
def test_spec_syntax_variants(jx, grid, spec, expected, grid_shape):
    _, views, _ = run_shown(jx, f"--in w={spec}", "y = w * 2\n")
    placed = jx.user_ns["w"]
    assert placed.sharding == NamedSharding(grid, expected)
    assert views["w"]["grid"] == grid_shape
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) * 2)


def test_unnamed_array_inputs_stay_as_they_are(jx, grid):
    b = jnp.ones((8, 8))
    jx.user_ns["b"] = b
    before = b.sharding
    _, views, _ = run_shown(jx, "--in w=data,None", "y = w + b\n")
    assert jx.user_ns["b"] is b and b.sharding == before
    assert "b" not in views
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) + 1)


def test_out_constrains_the_output_sharding(jx, grid):
    shard(jx, "--in w=data,None --out y=model --no-show", "y = jnp.sum(w, axis=0)\n")
    y = jx.user_ns["y"]
    assert y.sharding.spec == P("model")
    np.testing.assert_array_equal(np.asarray(y), np.arange(64.0).reshape(8, 8).sum(0))
    # Without --out, the compiler's choice differs: here a replicated result.
    shard(jx, "--in w=data,None --no-show", "z = jnp.sum(w, axis=0)\n")
    assert jx.user_ns["z"].sharding.spec != P("model")


def test_out_with_a_device_count(jx):
    jx.user_ns["v"] = jnp.arange(16.0)
    shard(jx, "--in v=8 --out s=8 --no-show", "s = jnp.cumsum(v)\n")
    assert distinct_blocks(jx.user_ns["s"]) == 8


def test_inline_mesh(jx):
    jx.user_ns["w"] = jnp.arange(64.0).reshape(8, 8)
    shard(jx, "--mesh data=4,model=2 --in w=data,model --no-show", "y = w * 2\n")
    placed = jx.user_ns["w"].sharding
    assert dict(placed.mesh.shape) == {"data": 4, "model": 2}
    assert placed.mesh.axis_types == jax.make_mesh((4, 2), ("data", "model")).axis_types  # as %mesh: Explicit
    assert placed.spec == P("data", "model")
    assert "mesh" not in jx.user_ns


def test_mesh_by_another_name(jx):
    mesh(jx, "rows=8 --name m8")
    jx.user_ns["w"] = jnp.ones((8, 2))
    shard(jx, "--mesh m8 --in w=rows --no-show", "y = w + 1\n")
    assert jx.user_ns["y"].sharding.mesh == jx.user_ns["m8"]


def test_without_mesh_flag_the_namespace_mesh_is_used(jx, grid):
    shard(jx, "--in w=model --no-show", "y = w\n")
    assert jx.user_ns["w"].sharding.mesh == grid


def test_final_expression_is_returned_and_shown(jx, grid):
    jx.user_ns["P"] = P
    value, views, _ = run_shown(jx, "--in w=data,None", "jnp.matmul(w.T, w, out_sharding=P())\n")
    np.testing.assert_allclose(np.asarray(value), np.asarray(jnp.arange(64.0).reshape(8, 8).T @ jnp.arange(64.0).reshape(8, 8)))
    assert "(result)" in views


def test_python_values_assigned_in_the_cell_come_back_as_they_are(jx, grid):
    shard(jx, "--in w=data --no-show", "label = 'rows'\ny = w * 2\n")
    assert jx.user_ns["label"] == "rows"


# --- --report -----------------------------------------------------------------------------------

def report(jx, line: str, source: str) -> dict:
    _, _, results = run_shown(jx, line + " --report", source)
    (state,) = results
    return state


def test_report_shows_the_all_reduce_the_compiler_inserted_for_a_sum(jx, grid):
    state = report(jx, "--in w=data,None", "t = jnp.sum(w, axis=0)\n")
    ops = [c["op"] for c in state["collectives"]]
    assert "all-reduce" in ops  # the cell wrote no collective
    reduce = next(c for c in state["collectives"] if c["op"] == "all-reduce")
    assert reduce["bytes"] > 0
    assert reduce["source_line"] == "t = jnp.sum(w, axis=0)"
    assert state["report"]["compile_ms"] is not None and state["report"]["run_ms"] >= 0
    assert [a["name"] for a in state["axes"]] == ["data", "model"]


def test_report_shows_a_collective_for_a_matmul_over_a_sharded_contracting_dim(jx, grid):
    jx.user_ns["x"] = jnp.ones((4, 8))
    jx.user_ns["P"] = P  # Explicit axes: the sharded contraction says how its result is laid out
    state = report(jx, "--in x=None,data w=data,None", "y = jnp.matmul(x, w, out_sharding=P())\n")
    colls = [c for c in state["collectives"] if c["op"] in ("all-reduce", "reduce-scatter")]
    assert colls and all(c["bytes"] > 0 for c in colls)
    np.testing.assert_allclose(np.asarray(jx.user_ns["y"]), np.ones((4, 8)) @ np.arange(64.0).reshape(8, 8))


def test_report_of_an_embarrassingly_parallel_cell_has_no_collectives(jx, grid):
    state = report(jx, "--in w=data,model", "y = jnp.sin(w) * 2\n")
    assert state["collectives"] == []


def test_no_report_no_result_view(jx, grid):
    _, _, results = run_shown(jx, "--in w=data,None", "t = jnp.sum(w, axis=0)\n")
    assert results == []


def test_no_show_still_reports(jx, grid):
    with capture_output() as captured:
        shard(jx, "--in w=data,None --report --no-show", "t = jnp.sum(w, axis=0)\n")
    assert shown(captured, "ShardingView") == []
    assert len(shown(captured, "ResultView")) == 1


# --- compiling once ------------------------------------------------------------------------------

def test_an_unchanged_rerun_does_not_recompile(jx, grid, compiles):
    line, source = "--in w=data,None --no-show", "t = jnp.sum(w * 3, axis=0)\n"
    shard(jx, line, source)
    first = compiles.count
    assert first >= 1
    shard(jx, line, source)
    shard(jx, line, source)
    assert compiles.count == first
    np.testing.assert_array_equal(np.asarray(jx.user_ns["t"]), np.arange(64.0).reshape(8, 8).sum(0) * 3)


def test_rerun_with_report_does_not_recompile(jx, grid, compiles):
    line, source = "--in w=data,None --no-show --report", "t = jnp.sum(w * 5, axis=0)\n"
    with capture_output():
        shard(jx, line, source)
    first = compiles.count
    with capture_output():
        shard(jx, line, source)
    assert compiles.count == first


def test_a_changed_constant_takes_effect(jx, grid):
    jx.user_ns["scale"] = 2.0
    source = "y = w * scale\n"
    shard(jx, "--in w=data --no-show", source)
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) * 2)
    jx.user_ns["scale"] = 3.0
    shard(jx, "--in w=data --no-show", source)
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) * 3)


def test_a_redefined_function_takes_effect(jx, grid):
    jx.run_cell("def f(a):\n    return a + 1\n").raise_error()
    shard(jx, "--in w=data --no-show", "y = f(w)\n")
    jx.run_cell("def f(a):\n    return a - 1\n").raise_error()
    shard(jx, "--in w=data --no-show", "y = f(w)\n")
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) - 1)


# --- binding -------------------------------------------------------------------------------------

def test_placed_inputs_are_rebound_sharded(jx, grid):
    original = jx.user_ns["w"]
    shard(jx, "--in w=data,None --no-show", "y = w * 2\n")
    placed = jx.user_ns["w"]
    assert placed is not original
    assert placed.sharding == NamedSharding(grid, P("data", None))
    np.testing.assert_array_equal(np.asarray(placed), np.asarray(original))
    # A re-run moves nothing: the placed array is used as it is.
    shard(jx, "--in w=data,None --no-show", "y = w * 2\n")
    assert jx.user_ns["w"] is placed


def test_a_failing_cell_rebinds_nothing(jx, grid):
    jx.user_ns["v"] = jnp.ones((8, 3))
    before = snapshot(jx.user_ns)
    with pytest.raises(TypeError):  # the user's own shape mistake propagates as it is
        shard(jx, "--in w=data v=data --no-show", "y = w @ v.T\n")
    assert snapshot(jx.user_ns) == before
    assert len(jx.user_ns["w"].sharding.device_set) == 1


def test_an_error_in_the_users_code_propagates_unchanged(jx, grid):
    before = snapshot(jx.user_ns)
    with pytest.raises(ZeroDivisionError):
        shard(jx, "--in w=data --no-show", "y = w * (1 // 0)\n")
    assert snapshot(jx.user_ns) == before


# --- mistakes: a UsageError with the fix, the namespace exactly as it was ------------------------

def usage_error(jx, line: str, source: str) -> str:
    before = snapshot(jx.user_ns)
    with capture_output() as captured, pytest.raises(UsageError) as err:
        shard(jx, line, source)
    assert snapshot(jx.user_ns) == before
    assert captured.outputs == []
    return str(err.value)


def test_axis_not_in_mesh(jx, grid):
    message = usage_error(jx, "--in w=rows,None", "y = w * 2\n")
    assert "'rows' is not an axis of the mesh" in message
    assert "data=4" in message and "model=2" in message


def test_dimension_not_divisible_names_dimension_and_sizes(jx, grid):
    jx.user_ns["odd"] = jnp.ones((6, 8))
    message = usage_error(jx, "--in odd=data,None", "y = odd * 2\n")
    assert "dimension 0" in message and "6 elements" in message and "data=4" in message
    assert "multiple of 4" in message


def test_dimension_not_divisible_over_two_axes(jx, grid):
    jx.user_ns["r"] = jnp.ones((4, 8))
    message = usage_error(jx, "--in r=(data,model),None", "y = r\n")
    assert "dimension 0" in message and "4 elements" in message and "8 devices" in message


def test_more_spec_entries_than_dimensions(jx, grid):
    jx.user_ns["v"] = jnp.ones(8)
    message = usage_error(jx, "--in v=data,model", "y = v\n")
    assert "2 entries" in message and "(8,)" in message and "1 dimension" in message


def test_one_mesh_axis_twice(jx, grid):
    message = usage_error(jx, "--in w=data,data", "y = w\n")
    assert "'data' is used twice" in message


def test_explicit_axes_ambiguity_in_our_words(jx):
    mesh(jx, "data=4 model=2")  # Explicit: the default, as jax.make_mesh's
    jx.user_ns["a"] = jnp.arange(64.0).reshape(8, 8)
    message = usage_error(jx, "--in a=data,model", "b = a @ a.T\n")
    assert "Explicit" in message and "ambiguous" in message
    assert "line 1" in message and "a @ a.T" in message
    assert "--axis-types auto" in message and "jax.reshard" in message and "out_sharding" in message
    assert "Traceback" not in message


def test_the_same_cell_works_on_an_auto_mesh(jx):
    mesh(jx, "data=4 model=2 --axis-types auto")
    jx.user_ns["a"] = jnp.arange(64.0).reshape(8, 8)
    shard(jx, "--in a=data,model --no-show", "b = a @ a.T\n")
    a = np.arange(64.0).reshape(8, 8)
    np.testing.assert_allclose(np.asarray(jx.user_ns["b"]), a @ a.T)


def test_input_not_an_array(jx, grid):
    jx.user_ns["n"] = [1.0, 2.0]
    message = usage_error(jx, "--in n=data", "y = jnp.asarray(n)\n")
    assert "'n' is a list, not an array" in message and "jnp.asarray(n)" in message


def test_in_name_not_defined(jx, grid):
    message = usage_error(jx, "--in ghost=data", "y = w\n")
    assert "'ghost' is not defined" in message


def test_in_name_not_read_by_the_cell(jx, grid):
    jx.user_ns["unused"] = jnp.ones(8)
    message = usage_error(jx, "--in unused=data", "y = w * 2\n")
    assert "does not read 'unused'" in message and "w" in message


def test_in_name_assigned_before_it_is_read(jx, grid):
    message = usage_error(jx, "--in w=data", "w = jnp.zeros(8)\ny = w + 1\n")
    assert "does not read 'w' before assigning it" in message


def test_out_name_not_assigned(jx, grid):
    message = usage_error(jx, "--in w=data --out z=model", "y = w * 2\n")
    assert "does not assign 'z'" in message and "y" in message


def test_out_axis_not_in_mesh(jx, grid):
    message = usage_error(jx, "--in w=data --out y=rows", "y = w * 2\n")
    assert "'rows' is not an axis" in message


def test_no_mesh_anywhere(jx):
    jx.user_ns["w"] = jnp.ones(8)
    message = usage_error(jx, "--in w=data", "y = w\n")
    assert "%mesh data=8" in message and "--in x=8" in message


def test_mesh_name_that_is_not_a_mesh(jx):
    jx.user_ns["w"] = jnp.ones(8)
    message = usage_error(jx, "--mesh nothing --in w=data", "y = w\n")
    assert "no mesh called 'nothing'" in message


def test_inline_mesh_of_the_wrong_size(jx):
    jx.user_ns["w"] = jnp.ones(8)
    message = usage_error(jx, "--mesh data=4 --in w=data", "y = w\n")
    assert "4 devices" in message and "8" in message


def test_device_counts_that_disagree(jx):
    jx.user_ns["a"] = jnp.ones(8)
    jx.user_ns["b"] = jnp.ones(8)
    message = usage_error(jx, "--in a=8 b=4", "y = a + b\n")
    assert "disagree" in message


def test_a_device_count_beside_a_named_mesh_blames_what_the_user_wrote(jx):
    mesh(jx, "data=8")
    jx.user_ns["v"] = jnp.ones(8)
    message = usage_error(jx, "--mesh mesh --in v=8", "y = v + 1\n")
    # `v=8` builds its own 1-D mesh; with --mesh the user must name an axis of that mesh instead.
    # The internal axis name that `v=8` stands for is not something the user wrote.
    assert "'devices'" not in message
    assert "v=8" in message and "data" in message


@pytest.mark.parametrize("count", [16, 0])
def test_a_device_count_the_process_cannot_give(jx, count):
    jx.user_ns["v"] = jnp.ones(16)
    message = usage_error(jx, f"--in v={count}", "y = v + 1\n")
    assert message.startswith("--in v")  # the option the user wrote, not --devices
    assert "--devices" not in message and "--simulate 0" not in message
    assert "8" in message


def test_malformed_spec_on_the_line(jx, grid):
    message = usage_error(jx, "--in w=__import__('os').system('x')", "y = w\n")
    assert message.startswith("--in")


def test_undefined_name_in_the_cell(jx, grid):
    message = usage_error(jx, "--in w=data", "y = w * missing\n")
    assert "'missing' is not defined" in message and "line 1" in message


def test_a_cell_that_only_defines_functions(jx, grid):
    message = usage_error(jx, "", "def g(x):\n    return x\n")
    assert "only defines functions" in message


# --- the short path of an identical re-run ---------------------------------------------------------

def test_rerun_after_rebinding_a_placed_input_places_the_new_array(jx, grid):
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w * 2\n")
    placed = jx.user_ns["w"]
    assert placed.sharding.spec == P("data", None)
    fresh = jnp.ones((8, 8))  # same shape and dtype, but not placed
    jx.user_ns["w"] = fresh
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w * 2\n")
    assert jx.user_ns["w"] is not fresh and jx.user_ns["w"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(jx.user_ns["y"], np.full((8, 8), 2.0))


def test_rerun_sees_new_values_of_an_unnamed_input(jx, grid):
    jx.user_ns["b"] = jnp.zeros(8)
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w.sum(axis=1) + b\n")
    jx.user_ns["b"] = jnp.full(8, 100.0)
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w.sum(axis=1) + b\n")
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(64.0).reshape(8, 8).sum(axis=1) + 100.0)


def test_rerun_takes_the_full_path_when_a_builtin_gets_shadowed(jx, grid):
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w * len([1, 2])\n")
    np.testing.assert_array_equal(jx.user_ns["y"], np.arange(64.0).reshape(8, 8) * 2)
    jx.user_ns["len"] = lambda seq: 10  # now a constant of the cell, not the builtin
    shard(jx, "--no-show --mesh mesh --in w=data,None", "y = w * len([1, 2])\n")
    np.testing.assert_array_equal(jx.user_ns["y"], np.arange(64.0).reshape(8, 8) * 10)


@pytest.mark.parametrize("axis", ["data", "i"])
def test_a_collective_in_a_shard_cell_says_what_to_do_in_shard(jx, axis):
    """Issue 40 item 12: it said to use `--axis-name` (which %%shard lacks), or to use 'data' when
    'data' was the axis it could not find. Plain jax.jit raises too: no axis is mapped there."""
    from jax import lax

    x = jnp.arange(16.0).reshape(N_DEVICES, 2)
    mesh = jax.make_mesh((N_DEVICES,), ("data",))
    with jax.set_mesh(mesh), pytest.raises(NameError, match="unbound axis name"):
        jax.jit(lambda v: lax.psum(v, axis))(x)
    jx.push({"x": x})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError, match=rf"collective over the axis '{axis}' in a %%shard cell") as raised:
        shard(jx, "--mesh data=8 --no-show", f"y = lax.psum(x, {axis!r})")
    message = str(raised.value)
    assert "--axis-name" not in message and "jnp.sum(x, axis=0)" in message and "%%shard_map" in message
    assert snapshot(jx.user_ns) == before
