"""`%%shard_map`: the cell is the body of a `jax.shard_map`. The examples of JAX's "Manual
parallelism with shard_map" tutorial, re-expressed as cells, give the same values and output
shardings as `jax.shard_map`; every foreseeable mistake is a UsageError; re-runs compile nothing.
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
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard_map import varying_axes
from shell_helpers import shown_widgets, snapshot


def sm(ip, line: str, source: str, show: bool = False):
    return ip.run_cell_magic("shard_map", line + ("" if show else " --no-show"), textwrap.dedent(source))


@pytest.fixture
def mesh42(jx):
    with capture_output():
        jx.run_line_magic("mesh", "x=4 y=2 --no-show")
    return jx.user_ns["mesh"]


def reference(mesh, f, in_specs, out_specs, *args, check_vma=True):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma))(*args)


def same(ours, theirs):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6)
    assert ours.shape == theirs.shape
    assert ours.sharding.is_equivalent_to(theirs.sharding, ours.ndim)


# --- the tutorial's examples -------------------------------------------------------------------

def test_block_matmul(jx, mesh42):
    a = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    b = jnp.arange(16 * 4, dtype=jnp.float32).reshape(16, 4)
    jx.push({"a": a, "b": b})
    sm(jx, "--mesh mesh --in a=x,y b=y,None --out c=x,None", "c = lax.psum(jnp.dot(a, b), 'y')")
    expected = reference(mesh42, lambda a, b: lax.psum(jnp.dot(a, b), "y"), (P("x", "y"), P("y", None)),
                         P("x", None), a, b)
    same(jx.user_ns["c"], expected)
    np.testing.assert_allclose(jx.user_ns["c"], a @ b)


@pytest.mark.parametrize("out", ["None", "x", "y", "x,y", "y,x", "(x,y),None"])
def test_psum_over_one_axis_with_each_untiling(jx, mesh42, out):
    """v is split over y only; after psum over y every device holds the same value, and --out may
    tile copies of it over any axes (or none)."""
    v = jnp.arange(8 * 8, dtype=jnp.float32).reshape(8, 8)
    jx.push({"v": v})
    sm(jx, f"--mesh mesh --in v=None,y --out s={out}", "s = lax.psum(v, 'y')")
    entries = [tuple(e.strip("()").split(",")) if e.startswith("(") else None if e == "None" else e
               for e in out.replace("(x,y)", "(x;y)").split(",")]
    spec = P(*[tuple(e[0].split(";")) if isinstance(e, tuple) else e for e in entries])
    expected = reference(mesh42, lambda v: lax.psum(v, "y"), P(None, "y"), spec, v)
    same(jx.user_ns["s"], expected)


def test_psum_over_one_axis_keeps_the_other_split(jx, mesh42):
    v = jnp.arange(8 * 8, dtype=jnp.float32).reshape(8, 8)
    jx.push({"v": v})
    sm(jx, "--mesh mesh --in v=x,y --out s=x,None", "s = lax.psum(v, 'y')")
    same(jx.user_ns["s"], reference(mesh42, lambda v: lax.psum(v, "y"), P("x", "y"), P("x", None), v))


def test_rank_preserving_gram_matrix_over_blocks(jx, mesh42):
    x = jnp.arange(16 * 4, dtype=jnp.float32).reshape(16, 4)
    jx.push({"w": x})
    sm(jx, "--mesh mesh --in w=(x,y),None", "g = lax.psum(w.T @ w, ('x', 'y'))")
    g = jx.user_ns["g"]
    assert g.shape == (4, 4)  # proven replicated: P(), no --out needed
    assert g.sharding.is_fully_replicated
    np.testing.assert_allclose(g, np.asarray(x).T @ np.asarray(x), rtol=1e-6)


def test_the_cell_sees_blocks_of_the_same_rank(jx, mesh42):
    jx.push({"a": jnp.ones((8, 16))})
    sm(jx, "--mesh mesh --in a=x,y --out shape=x,y", "shape = jnp.zeros(a.shape) + a.ndim")
    assert jx.user_ns["shape"].shape == (8, 16)  # blocks of (2, 8) assembled back
    np.testing.assert_allclose(jx.user_ns["shape"], 2.0)


def test_arrays_not_in_in_are_replicated(jx, mesh42):
    jx.push({"a": jnp.arange(8.0), "w": jnp.arange(3.0)})
    sm(jx, "--mesh mesh --in a=x --out y=x", "y = a * w.sum()")  # every device sees all of w
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(8.0) * 3.0)


def test_inline_mesh_and_plain_python_outputs(jx):
    jx.push({"a": jnp.arange(8.0)})
    sm(jx, "--mesh d=8 --in a=d --out b=d", "b = a + 1\nn = 3")
    np.testing.assert_allclose(jx.user_ns["b"], np.arange(8.0) + 1)
    assert jx.user_ns["n"] == 3


def test_all_gather_and_psum_scatter(jx):
    jx.push({"a": jnp.arange(16.0).reshape(8, 2)})
    sm(jx, "--mesh d=8 --in a=d,None --out g=d,None s=d,None",
       "g = lax.all_gather(a, 'd', tiled=True)\ns = lax.psum_scatter(g, 'd', tiled=True)")
    assert jx.user_ns["g"].shape == (64, 2)  # each device's gathered copy, assembled side by side
    np.testing.assert_allclose(jx.user_ns["s"], np.arange(16.0).reshape(8, 2) * 8)


def test_final_expression_that_is_replicated(jx, mesh42):
    jx.push({"a": jnp.arange(8.0)})
    value = sm(jx, "--mesh mesh --in a=x", "lax.psum(a.sum(), 'x')")
    assert float(value) == 28.0


def test_no_check_vma_needs_out_and_then_follows_it(jx, mesh42):
    jx.push({"a": jnp.arange(8.0)})
    with pytest.raises(UsageError, match="--no-check-vma"):
        sm(jx, "--mesh mesh --in a=x --no-check-vma", "b = a * 2")
    sm(jx, "--mesh mesh --in a=x --out b=x --no-check-vma", "b = a * 2")
    np.testing.assert_allclose(jx.user_ns["b"], np.arange(8.0) * 2)


def test_explicit_axes_mesh(jx):
    with capture_output():
        jx.run_line_magic("mesh", "x=4 y=2 --axis-types explicit --no-show")
    a = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    jx.push({"a": a, "b": jnp.ones((16, 4))})
    sm(jx, "--mesh mesh --in a=x,y b=y,None --out c=x,None", "c = lax.psum(jnp.dot(a, b), 'y')")
    np.testing.assert_allclose(jx.user_ns["c"], np.asarray(a) @ np.ones((16, 4)))


# --- mistakes ------------------------------------------------------------------------------------

def failing(ip, line: str, source: str) -> str:
    before = snapshot(ip.user_ns)
    with pytest.raises(UsageError) as err:
        sm(ip, line, source)
    assert snapshot(ip.user_ns) == before
    return str(err.value)


def test_a_varying_output_without_out_names_the_axes_and_the_spec(jx, mesh42):
    jx.push({"a": jnp.ones((8, 16)), "b": jnp.ones((16, 4))})
    message = failing(jx, "--mesh mesh --in a=x,y b=y,None", "c = jnp.dot(a, b)")
    assert "'c'" in message and "mesh axes 'x', 'y'" in message and "--out c=x,y" in message
    assert "line 1" in message and "jnp.dot(a, b)" in message


def test_an_out_spec_that_requires_replication_jax_cannot_prove(jx, mesh42):
    jx.push({"a": jnp.ones((8, 16)), "b": jnp.ones((16, 4))})
    message = failing(jx, "--mesh mesh --in a=x,y b=y,None --out c=x,None", "d = 1\nc = jnp.dot(a, b)")
    assert "--out c" in message and "mesh axis 'y'" in message and "lax.psum(c, 'y')" in message
    assert "line 2" in message


def test_an_indivisible_split_names_the_input_and_dimension(jx, mesh42):
    jx.push({"a": jnp.ones((6, 4))})
    message = failing(jx, "--mesh mesh --in a=x --out b=x", "b = a")
    assert "--in a" in message and "dimension 0" in message and "6" in message


def test_a_spec_naming_an_unknown_axis(jx, mesh42):
    jx.push({"a": jnp.ones((8, 4))})
    message = failing(jx, "--mesh mesh --in a=z --out b=x", "b = a")
    assert "'z' is not an axis of the mesh" in message


def test_a_spec_longer_than_the_rank(jx, mesh42):
    jx.push({"a": jnp.ones(8)})
    message = failing(jx, "--mesh mesh --in a=x,y --out b=x", "b = a")
    assert "2 entries" in message and "1 dimension" in message


def test_an_out_spec_longer_than_the_blocks_rank(jx, mesh42):
    jx.push({"a": jnp.ones(8)})
    message = failing(jx, "--mesh mesh --in a=x --out b=x,y", "b = a")
    assert "--out b" in message and "2 entries" in message


@pytest.mark.parametrize("line, source, words", [
    ("--mesh mesh --in q=x --out b=x", "b = a", "not an array input"),
    ("--mesh mesh --in a=x --out nope=x", "b = a", "does not assign 'nope'"),
    ("--mesh nomesh --in a=x", "b = a", "no mesh called 'nomesh'"),
    ("--mesh mesh --in a=x --out b=x", "b = lax.psum(a, 'k')", "unknown axis name 'k'"),
    ("--mesh mesh --in a=8 --out b=x", "b = a", "device count"),
    ("--mesh mesh --in a=x --out n=x", "n = 3\nb = lax.psum(a, 'x')", "plain Python value"),
])
def test_other_mistakes(jx, mesh42, line, source, words):
    jx.push({"a": jnp.ones(8), "q": 3})
    assert words in failing(jx, line, source)


def test_function_mode_is_refused_with_what_to_do(jx, mesh42):
    assert "only defines functions" in failing(jx, "--mesh mesh", "def f(x):\n    return x\n")


def test_a_psum_over_an_axis_the_value_does_not_vary_over(jx, mesh42):
    jx.push({"a": jnp.ones(8)})
    message = failing(jx, "--mesh mesh --in a=x", "t = lax.psum(a.sum(), ('x', 'y'))")
    assert "line 1" in message and "'y'" in message and "--no-check-vma" in message


def test_grouped_collectives_need_no_check_vma(jx):
    """Found by the collectives chapter: JAX raised an empty NotImplementedError."""
    jx.push({"x": jnp.arange(8.0)})
    message = failing(jx, "--mesh i=8 --in x=i --out t=i",
                      "t = lax.psum(x, 'i', axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]])")
    assert "line 1" in message and "--no-check-vma" in message
    sm(jx, "--mesh i=8 --in x=i --out t=i --no-check-vma",
       "t = lax.psum(x, 'i', axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]])")
    np.testing.assert_allclose(jx.user_ns["t"], [6.0] * 4 + [22.0] * 4)


def test_the_users_own_error_is_unchanged(jx, mesh42):
    jx.push({"a": jnp.ones(8)})
    with pytest.raises(ZeroDivisionError):
        sm(jx, "--mesh mesh --in a=x --out b=x", "b = a\n1 / 0")


# --- caching, views, the twin ----------------------------------------------------------------

def test_reruns_compile_nothing(jx, mesh42, compiles):
    jx.push({"a": jnp.ones((8, 16)), "b": jnp.ones((16, 4))})
    line, source = "--mesh mesh --in a=x,y b=y,None --out c=x,None", "c = lax.psum(jnp.dot(a, b), 'y')"
    sm(jx, line, source)
    before = compiles.count
    for _ in range(3):
        sm(jx, line, source)
    assert compiles.count == before


def test_views_show_each_devices_block_and_its_slice(jx, mesh42):
    jx.push({"a": jnp.arange(8 * 4, dtype=jnp.float32).reshape(8, 4)})
    with capture_output() as captured:
        sm(jx, "--mesh mesh --in a=x,None --out c=x,None", "c = a * 2", show=True)
    widgets = shown_widgets(captured)
    kinds = [type(w).__name__ for w in widgets]
    assert kinds == ["ResultView", "ShardingView"]
    (output,) = widgets[0].state["outputs"]
    assert output["name"] == "c" and output["shape"] == [2, 4] and output["global_shape"] == [8, 4]
    tiles = output["tiles"]
    assert [t["devices"] for t in tiles] == [[d] for d in range(8)]
    assert tiles[2]["coords"] == [1, 0] and tiles[2]["slice"] == "[2:4, 0:4]"
    assert tiles[2]["text"].startswith("[16. 18. 20. 22.")  # rows 2-3 of a, doubled
    assert widgets[1].state["name"] == "c" and widgets[1].state["spec"][0] == "x"


def test_a_replicated_output_is_one_tile(jx, mesh42):
    jx.push({"a": jnp.arange(8.0)})
    with capture_output() as captured:
        sm(jx, "--mesh mesh --in a=x", "t = lax.psum(a.sum(), 'x')", show=True)
    (output,) = shown_widgets(captured)[0].state["outputs"]
    assert output["same_on_all"] and len(output["tiles"]) == 1


def test_the_twin(mesh42):
    ns = {"lax": lax, "jnp": jnp, "a": jnp.arange(8.0)}
    result = jaxpar_magic.shard_map_cell("s = lax.psum(a, 'x')", ns, mesh=mesh42, in_specs={"a": ("x",)},
                                         out_specs={"s": ("x",)})
    np.testing.assert_allclose(ns["s"], np.tile(np.arange(2.0) + np.arange(2.0, 4.0) + np.arange(4.0, 6.0)
                                               + np.arange(6.0, 8.0), 4))
    assert result.out_specs == {"s": ("x",)}


def test_varying_axes_reads_jaxs_typing(mesh42):
    """The one place that reads JAX's varying-axes type: fails loudly if JAX renames it again."""
    seen = {}

    def body(a):
        seen["a"] = varying_axes(a)
        seen["sum"] = varying_axes(lax.psum(a, "y"))
        seen["all"] = varying_axes(lax.psum(a, ("x", "y")))
        return a

    jax.eval_shape(jax.shard_map(body, mesh=mesh42, in_specs=P(("x", "y")), out_specs=P(("x", "y"))),
                   jax.ShapeDtypeStruct((8,), jnp.float32))
    assert seen == {"a": {"x", "y"}, "sum": {"x"}, "all": set()}


def test_an_untiled_psum_scatter_of_the_wrong_length_is_explained(jx):
    """The training chapter's exercise: `lax.psum_scatter(g, 'data')` on a (16, 4) block over 8
    devices. JAX says "reduce_scatter operand scatter dimension size 16 must match shard count 8"."""
    jx.push({"xs": jnp.ones((32, 16)), "dy": jnp.ones((32, 4))})
    jx.run_line_magic("mesh", "data=8 --name flat --no-show")
    with pytest.raises(UsageError) as raised:
        jx.run_cell_magic("shard_map", "--mesh flat --in xs=data dy=data --out g=data --no-show",
                          "g = lax.psum_scatter(xs.T @ dy, 'data')")
    said = str(raised.value)
    assert "line 1 of the cell" in said and "tiled=True" in said and "must have 8 entries; it has 16" in said
    assert "g" not in jx.user_ns
