"""Inputs laid out on another mesh than the cell's. On the cell's own devices (other axis types, axis
names or device order) an input is laid out again, as `jax.device_put` would, and the run says so;
on other devices it is a UsageError naming the input, both meshes and the fix. JAX's internal
argument paths (`args[0][0] of _compile.<locals>.whole_program`) never reach the user.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from shell_helpers import snapshot


def run(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return captured


@pytest.fixture
def tutorial(jx):
    """The distributed-arrays tutorial's second "shardings disagree" example: the same devices, in
    another order. Plain JAX refuses `y + z`; a cell on y's mesh lays z out again."""
    devices = jax.devices()
    permuted = [devices[i] for i in [0, 1, 2, 3, 6, 7, 4, 5]]
    m1, m2 = Mesh(devices, ("a",)), Mesh(permuted, ("a",))
    x = jnp.arange(32.0)
    y = jax.device_put(x, NamedSharding(m1, P("a")))
    z = jax.device_put(x, NamedSharding(m2, P("a")))
    with pytest.raises(ValueError, match="incompatible devices"):
        y + z  # what plain JAX says
    jx.push({"m1": m1, "m2": m2, "x": x, "y": y, "z": z})
    return jx


@pytest.mark.parametrize("magic, line, source", [
    ("shard", "--mesh m1", "w = y + z"),
    ("shard_map", "--mesh m1 --in y=a z=a --out w=a", "w = y + z"),
    ("pmap", "--split y z --merge w -a a", "w = y + z"),
])
@pytest.mark.parametrize("show", [True, False])
def test_same_devices_in_another_order_are_laid_out_again(tutorial, magic, line, source, show):
    z = tutorial.user_ns["z"]
    for _ in range(2):  # a re-run meets the same z: laid out again, and said again
        captured = run(tutorial, magic, line + ("" if show else " --no-show"), source)
        assert "`z` is laid out on another mesh a=8 (Auto axes) on devices 0, 1, 2, 3, 6, 7, 4, 5" in captured.stdout
        assert "jax.device_put(z, NamedSharding(mesh, P('a')))" in captured.stdout
        np.testing.assert_allclose(tutorial.user_ns["w"], 2 * np.arange(32.0))
        assert tutorial.user_ns["z"] is z and z.sharding.mesh == tutorial.user_ns["m2"]  # yours, unchanged


def test_the_view_title_names_what_was_laid_out_again(tutorial):
    from shell_helpers import shown_widgets

    captured = run(tutorial, "shard_map", "--mesh m1 --in y=a z=a --out w=a", "w = y + z")
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    assert view.state["title"].endswith("laid out again from another mesh: z")


def test_an_explicit_input_read_on_an_auto_mesh_of_the_same_devices(jx):
    """Other axis types only: an array made on jax.make_mesh's Explicit mesh, read by a cell on an
    Auto mesh of the same devices (names and sizes equal): it keeps its spec there."""
    explicit = jax.make_mesh((4, 2), ("data", "model"))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(explicit, P("data", "model")))
    jx.push({"x": x})
    with capture_output():
        jx.run_line_magic("mesh", "data=4 model=2 --axis-types auto --name auto --no-show")
    captured = run(jx, "shard", "--mesh auto --no-show", "y = x @ x.T")
    assert "(P('data', 'model'))" in captured.stdout and "(Explicit axes)" in captured.stdout
    np.testing.assert_allclose(jx.user_ns["y"], np.asarray(x) @ np.asarray(x).T)


def test_an_input_with_mesh_axes_the_cell_lacks_is_replicated(jx):
    other = jax.make_mesh((8,), ("g",))
    x = jax.device_put(jnp.arange(16.0), NamedSharding(other, P("g")))
    jx.push({"x": x})
    with capture_output():
        jx.run_line_magic("mesh", "a=4 b=2 --no-show")
    captured = run(jx, "shard", "--no-show", "y = x * 2")
    assert "(P())" in captured.stdout
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(16.0) * 2)


def test_a_rerun_that_meets_an_input_from_another_mesh(jx):
    """The first runs read an array of the cell's mesh (a re-run then skips every check); the next
    reads one of another mesh of the same shape: laid out again, not JAX's error."""
    with capture_output():
        jx.run_line_magic("mesh", "d=8 --no-show")
    mesh = jx.user_ns["mesh"]
    jx.push({"u": jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))})
    for _ in range(2):
        run(jx, "shard", "--no-show", "v = u * 3")
    other = jax.make_mesh((4, 2), ("a", "b"))
    jx.push({"u": jax.device_put(jnp.arange(16.0), NamedSharding(other, P(("a", "b"))))})
    captured = run(jx, "shard", "--no-show", "v = u * 3")
    assert "`u` is laid out on another mesh a=4, b=2" in captured.stdout
    np.testing.assert_allclose(jx.user_ns["v"], np.arange(16.0) * 3)


@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh m4"),
    ("shard_map", "--mesh m4"),
    ("pmap", "--devices 4"),
])
def test_other_devices_are_a_usage_error_naming_both_meshes(jx, magic, line):
    with capture_output():
        jx.run_line_magic("mesh", "d=4 --devices 4 --name m4 --no-show")
    last4 = Mesh(jax.devices()[4:], ("k",), axis_types=(AxisType.Explicit,))
    jx.push({"x": jax.device_put(jnp.arange(4.0), NamedSharding(last4, P("k")))})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError) as err:
        run(jx, magic, line + " --no-show", "y = x * 2")
    message = str(err.value)
    assert snapshot(jx.user_ns) == before
    assert "`x` is on mesh k=4 (Explicit axes) on devices 4-7" in message
    assert "this cell runs on mesh" in message and "on devices 0-3" in message
    assert "jax.device_put(x, NamedSharding(mesh, P()))" in message
    assert "args[" not in message and "<locals>" not in message and "blocks[" not in message


def test_a_pmap_function_takes_an_argument_from_an_explicit_mesh_of_other_names(jx):
    """Found by tests/test_differential.py: `x` placed by `%%shard --mesh data=8 --in x=data`
    (Explicit axes, what jax.make_mesh gives), then a `%%pmap`-defined function called on it, raised
    JAX's KeyError: 'data' from shard_map's staging. It is laid out again, as a cell's input is."""
    explicit = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(explicit, P("data")))
    jx.push({"x": x})
    run(jx, "pmap", "--no-show", "def double(v):\n    return v * 2\n")
    for _ in range(2):  # the first call compiles, the second finds the program
        with capture_output() as captured:
            out = jx.user_ns["double"](x)
        np.testing.assert_array_equal(out, 2 * np.arange(8.0))
        assert "laid out on another mesh data=8 (Explicit axes) on devices 0-7" in captured.stdout
    assert jx.user_ns["x"] is x and x.sharding.mesh == explicit  # the user's array is unchanged
