"""A global `jax.set_mesh(mesh)`, as JAX's current docs write it: every magic still runs its cell under
the cell's own mesh (as `with jax.set_mesh(cell_mesh):` does), and without --mesh, %%shard and
%%shard_map use the mesh `jax.set_mesh` set. Order: --mesh, then the context mesh, then `mesh`.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shell_helpers import shown_widgets


@pytest.fixture
def global_mesh(jx):
    """A global Explicit mesh of all 8 devices over one axis `g`, set the way JAX's docs set it."""
    mesh = jax.make_mesh((8,), ("g",))
    jax.set_mesh(mesh)
    jx.push({"P": P, "NamedSharding": NamedSharding})
    yield mesh
    jax.set_mesh(None)


def cell(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, captured


def test_pmap_block_mode_runs_under_its_own_mesh(jx, global_mesh):
    x = jnp.arange(8.0)
    jx.push({"x": x})
    _, captured = cell(jx, "pmap", "-a i", "total = lax.psum(x, 'i')\nshare = x / total")
    np.testing.assert_allclose(jx.user_ns["total"], np.full(8, 28.0))
    np.testing.assert_allclose(jx.user_ns["share"], np.arange(8.0) / 28.0)
    assert [type(w).__name__ for w in shown_widgets(captured)] == ["ResultView"]


def test_pmap_function_mode_runs_under_its_own_mesh(jx, global_mesh):
    cell(jx, "pmap", "-a i", "def norm(v):\n    return v / lax.psum(v, 'i')")
    np.testing.assert_allclose(jx.user_ns["norm"](jnp.arange(1.0, 9.0)), np.arange(1.0, 9.0) / 36.0)


def test_shard_map_over_another_mesh_of_the_same_size_draws_its_view(jx, global_mesh):
    with capture_output():
        jx.run_line_magic("mesh", "a=4 b=2 --no-show")
    x = jnp.arange(16.0).reshape(8, 2)
    jx.push({"x": x})
    _, captured = cell(jx, "shard_map", "--mesh mesh --in x=a,b --out y=a,b", "y = x * 2 + lax.axis_index('b')")
    expected = jax.jit(jax.shard_map(lambda v: v * 2 + lax.axis_index("b"), mesh=jx.user_ns["mesh"],
                                     in_specs=P("a", "b"), out_specs=P("a", "b")))
    with jax.set_mesh(jx.user_ns["mesh"]):
        np.testing.assert_allclose(jx.user_ns["y"], expected(jax.device_put(x, P("a", "b"))))
    kinds = [type(w).__name__ for w in shown_widgets(captured)]
    assert "ResultView" in kinds


@pytest.fixture
def m4(jx):
    """A 4-device mesh bound as `m4`: another size than the global one."""
    with capture_output():
        jx.run_line_magic("mesh", "d=4 --devices 4 --name m4 --no-show")
    return jx.user_ns["m4"]


@pytest.mark.parametrize("magic, line, source", [
    ("shard", "--mesh m4 --in x=d", "y = x * 2"),
    ("shard_map", "--mesh m4 --in x=d --out y=d", "y = x * 2"),
    ("pmap", "--devices 4 -a d", "y = x * 2"),
])
def test_a_mesh_of_another_size_than_the_global_one(jx, global_mesh, m4, magic, line, source):
    x = np.arange(4.0)  # host data (a jnp array made now would live on the global mesh's 8 devices)
    jx.push({"x": x})
    cell(jx, magic, line + " --no-show", source)
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(4.0) * 2)
    assert len(jx.user_ns["y"].sharding.device_set) == 4


@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh m4 --in x=d"),
    ("shard_map", "--mesh m4 --in x=d --out y=d"),
    ("pmap", "--devices 4 -a d"),
])
def test_as_code_on_a_mesh_of_another_size_runs_alone(jx, global_mesh, m4, magic, line):
    x = np.arange(4.0)
    jx.push({"x": x})
    _, captured = cell(jx, magic, line + " --as-code", "y = x * 2")
    scope = {"x": x}
    exec(captured.stdout, scope)  # still under the global mesh, as a user pastes it below
    np.testing.assert_allclose(scope["y"], np.arange(4.0) * 2)


def test_without_mesh_the_context_mesh_comes_before_the_namespace_mesh(jx, global_mesh):
    with capture_output():
        jx.run_line_magic("mesh", "a=4 b=2 --no-show")  # the namespace's `mesh`: not the one used
    x = jnp.arange(16.0)
    jx.push({"x": x})
    cell(jx, "shard", "--in x=g --no-show", "y = x + 1\naxes = jax.sharding.get_abstract_mesh().axis_names")
    assert jx.user_ns["y"].sharding.mesh == global_mesh
    assert jx.user_ns["axes"] == ("g",)
    cell(jx, "shard_map", "--in x=g --out z=g --no-show", "z = x * lax.axis_size('g')")
    np.testing.assert_allclose(jx.user_ns["z"], np.arange(16.0) * 8)


@pytest.mark.parametrize("magic, line", [("shard", "--in x=g"), ("shard_map", "--in x=g --out y=g")])
def test_as_code_says_it_took_the_context_mesh(jx, global_mesh, magic, line):
    """Without --mesh the snippet is on the mesh jax.set_mesh set, and says so: not 'your mesh
    `mesh`' when the namespace's `mesh` is another mesh, which the cell did not use."""
    with capture_output():
        jx.run_line_magic("mesh", "a=4 b=2 --no-show")
    x = np.arange(16.0)
    jx.push({"x": x})
    _, captured = cell(jx, magic, line + " --as-code", "y = x * 2")
    text = " ".join(captured.stdout.split())
    assert "The mesh jax.set_mesh set (g=8: all 8 devices)" in text
    assert "Your mesh `mesh`" not in text
    scope = {"x": x}
    exec(captured.stdout, scope)
    np.testing.assert_allclose(scope["y"], np.arange(16.0) * 2)
    assert tuple(scope["y"].sharding.mesh.axis_names) == ("g",)


def test_mesh_flag_comes_before_the_context_mesh(jx, global_mesh):
    x = jnp.arange(16.0)
    jx.push({"x": x})
    cell(jx, "shard", "--mesh a=4,b=2 --in x=a --no-show",
         "y = x + 1\naxes = jax.sharding.get_abstract_mesh().axis_names")
    assert jx.user_ns["axes"] == ("a", "b")  # inside the cell, the cell's mesh is the context mesh
    assert tuple(jx.user_ns["y"].sharding.mesh.axis_names) == ("a", "b")


def test_namespace_mesh_is_used_when_no_mesh_is_set(jx):
    with capture_output():
        jx.run_line_magic("mesh", "a=8 --no-show")
    jx.push({"x": jnp.arange(8.0)})
    cell(jx, "shard", "--in x=a --no-show", "y = x + 1")
    assert jx.user_ns["y"].sharding.mesh is jx.user_ns["mesh"]


def test_a_rerun_follows_a_new_context_mesh(jx, global_mesh):
    """A --no-show re-run replays its program; once another mesh is set, it takes the new one."""
    jx.push({"x": jnp.arange(16.0)})
    for _ in range(2):
        cell(jx, "shard", "--no-show", "y = x * 3")
        assert jx.user_ns["y"].sharding.mesh == global_mesh
    other = jax.make_mesh((4, 2), ("a", "b"))
    jax.set_mesh(other)
    cell(jx, "shard", "--no-show", "y = x * 3")
    assert jx.user_ns["y"].sharding.mesh == other
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(16.0) * 3)
    jax.set_mesh(None)
    with pytest.raises(Exception, match="needs a mesh"):
        cell(jx, "shard", "--no-show", "y = x * 3")


def test_the_context_mesh_is_left_as_it_was(jx, global_mesh, m4):
    jx.push({"x": np.arange(4.0)})
    cell(jx, "shard", "--mesh m4 --in x=d --no-show", "y = x * 2")
    cell(jx, "pmap", "--devices 4 --no-show", "y = x * 2")
    assert jax.sharding.get_mesh() == global_mesh


@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh m4 --in x=d"),
    ("shard_map", "--mesh m4 --in x=d --out y=d"),
    ("pmap", "--devices 4 -a d"),
])
def test_plan_on_a_mesh_of_another_size(jx, global_mesh, m4, magic, line):
    jx.push({"x": np.arange(4.0, dtype=np.float32)})
    _, captured = cell(jx, magic, line + " --plan --no-show", "y = x * 2")
    assert captured.stdout.startswith("planned")
    assert isinstance(jx.user_ns["y"], jax.ShapeDtypeStruct) and jx.user_ns["y"].shape == (4,)
