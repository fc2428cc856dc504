"""A user's mistake in a %%pmap cell: one UsageError that names the variable or line and the fix,
and a namespace left exactly as it was (no half-bound outputs)."""
from __future__ import annotations

import numpy as np
import pytest
from IPython.core.error import UsageError

from shell_helpers import N_DEVICES, pmap, snapshot


@pytest.fixture
def x(jx):
    value = np.arange(24, dtype=np.float32).reshape(N_DEVICES, 3)
    jx.push({"x": value})
    return value


def fails(ip, line: str, source: str, *patterns: str, error=UsageError) -> str:
    """Run a cell that must fail with `error`; check each pattern and that nothing was bound."""
    before = snapshot(ip.user_ns)
    with pytest.raises(error) as info:
        pmap(ip, line, source)
    message = str(info.value)
    for pattern in patterns:
        assert pattern in message, f"{pattern!r} not in {message!r}"
    assert snapshot(ip.user_ns) == before
    return message


# --- inputs that do not fit the devices --------------------------------------------------------------

def test_leading_axis_not_the_device_count_suggests_split(jx):
    jx.push({"batch": np.ones((16, 3), np.float32)})
    fails(jx, "--no-show", "y = batch * 2", "'batch'", "16", "8", "--split batch", "--broadcast batch")


def test_leading_axis_that_cannot_split_still_names_both_numbers(jx):
    jx.push({"batch": np.ones((6, 3), np.float32)})
    fails(jx, "--no-show", "y = batch * 2", "'batch'", "(6, 3)", "8", "--broadcast batch")


def test_scalar_array_input_suggests_broadcast(jx):
    jx.push({"scale": np.array(2.0, np.float32)})  # a 0-d array: mapped by default, has no device axis
    jx.push({"x": np.ones((N_DEVICES, 3), np.float32)})
    fails(jx, "--no-show", "y = x * scale", "'scale'", "--broadcast scale")


def test_split_that_does_not_divide(jx):
    jx.push({"batch": np.ones((10, 3), np.float32)})
    fails(jx, "--no-show --split batch", "y = batch * 2", "--split batch", "10", "8")


def test_mapped_inputs_with_different_leading_sizes(jx, x):
    jx.push({"w": np.ones((4, 3), np.float32)})
    fails(jx, "--no-show", "y = x * 2\nz = y + w", "'w'", "(4, 3)", "8")


def test_broadcast_of_a_name_the_cell_does_not_read(jx, x):
    jx.push({"w": np.ones((3, 3), np.float32)})
    fails(jx, "--no-show --broadcast w", "y = x * 2", "--broadcast w", "x")


def test_broadcast_of_an_undefined_name(jx, x):
    fails(jx, "--no-show --broadcast nope", "y = x * 2", "--broadcast nope", "not defined")


def test_merge_of_a_name_the_cell_does_not_assign(jx, x):
    fails(jx, "--no-show --merge zz", "y = x * 2", "--merge zz", "y")


# --- collectives over names the cell does not have ------------------------------------------------------

def test_unknown_literal_axis_name(jx, x):
    fails(jx, "--no-show", "y = x * 2\ns = lax.psum(y, 'j')", "line 2", "'j'", "'i'", "--axis-name j")


def test_unknown_axis_name_through_a_variable(jx, x):
    message = fails(jx, "--no-show", "ax = 'j'\ny = x * 2\ns = lax.psum(y, ax)", "line 3", "'j'", "'i'")
    assert "s = lax.psum(y, ax)" in message


def test_unknown_axis_name_over_a_mesh_lists_its_axes(jx):
    jx.push({"xm": np.ones((2, 4), np.float32)})
    fails(jx, "--no-show --mesh outer=2,inner=4", "y = lax.psum(xm, 'batch')", "'batch'", "'outer'", "'inner'")


# --- Python control flow on traced values, and the user's own errors ------------------------------------

def test_python_if_on_a_traced_value_quotes_the_users_line(jx, x):
    source = "y = x * 2\nif y.sum() > 0:\n    z = y\nelse:\n    z = -y\n"
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError) as info:
        pmap(jx, "--no-show", source)
    message = str(info.value)
    assert "line 2" in message and "`if y.sum() > 0:`" in message
    assert "jnp.where" in message
    for internal in ("jax._src", "site-packages", "Traceback", "TracerBoolConversionError", "jaxpr"):
        assert internal not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained JAX traceback
    assert snapshot(jx.user_ns) == before


def test_int_of_a_traced_value_is_explained(jx, x):
    fails(jx, "--no-show", "n = int(x.sum())\ny = x * n", "line 1", "`n = int(x.sum())`")


def test_an_error_of_the_users_own_code_propagates_unchanged(jx, x):
    jx.push({"zero": 0})
    fails(jx, "--no-show", "y = x * 2\nz = y * (1 / zero)", error=ZeroDivisionError)
    fails(jx, "--no-show", "y = x @ jnp.ones((5, 2))", error=TypeError)


def test_a_failed_cell_binds_nothing_even_after_earlier_lines_ran(jx, x):
    fails(jx, "--no-show", "a = x + 1\nb = a * 2\nc = lax.psum(b, ax_undefined)", "ax_undefined", "line 3")
    assert "a" not in jx.user_ns and "b" not in jx.user_ns


def test_the_corrected_cell_runs_after_a_failure(jx, x):
    fails(jx, "--no-show", "y = lax.psum(x, 'j')", "'j'")
    pmap(jx, "--no-show", "y = lax.psum(x, 'i')")
    np.testing.assert_array_equal(jx.user_ns["y"], np.broadcast_to(x.sum(0), x.shape))


# --- names and syntax ---------------------------------------------------------------------------------------

def test_undefined_name(jx, x):
    fails(jx, "--no-show", "y = x * 2\nz = y + undefined_thing", "'undefined_thing'", "line 2",
          "z = y + undefined_thing")


def test_syntax_error(jx, x):
    fails(jx, "--no-show", "y = x * 2\nz = (y +\n", "line 2")


def test_global_statement(jx, x):
    fails(jx, "--no-show", "global y\ny = x", "line 1", "global")


# --- the magic line -----------------------------------------------------------------------------------------

def test_more_devices_than_exist(jx, x):
    fails(jx, "--no-show --devices 16", "y = x", "16", "8")


def test_a_device_id_that_does_not_exist(jx, x):
    fails(jx, "--no-show --devices 0 99", "y = x", "99")


def test_devices_that_are_not_numbers(jx, x):
    fails(jx, "--no-show --devices gpu0", "y = x", "--devices")


def test_unknown_option(jx, x):
    fails(jx, "--no-show --axis-names i", "y = x")


@pytest.mark.parametrize("spec", ["outer2", "a=0", "a=2,a=4", "a=x", "1a=8", "a=-2"])
def test_malformed_mesh(jx, x, spec):
    fails(jx, f"--no-show --mesh {spec}", "y = x", "--mesh")


def test_duplicate_mesh_axis_names_the_axis(jx, x):
    fails(jx, "--no-show --mesh a=2,a=4", "y = x", "'a'", "twice")


@pytest.mark.parametrize("spec, product", [("a=3,b=2", 6), ("a=4,b=4", 16), ("a=2,b=2", 4)])
def test_mesh_product_not_the_device_count(jx, spec, product):
    sizes = tuple(int(part.split("=")[1]) for part in spec.split(","))
    jx.push({"xm": np.ones(sizes + (3,), np.float32)})  # shaped for the mesh: the mesh is what's wrong
    fails(jx, f"--no-show --mesh {spec}", "y = xm * 2", str(product), str(N_DEVICES))


def test_mesh_size_not_the_number_of_chosen_devices(jx):
    jx.push({"xm": np.ones((2, 4, 3), np.float32)})
    fails(jx, "--no-show --devices 4 --mesh a=2,b=4", "y = xm * 2", "8", "4")


# --- function mode --------------------------------------------------------------------------------------------

def test_function_argument_with_the_wrong_leading_axis_names_it(jx):
    pmap(jx, "--no-show", "def f(params, data):\n    return params * data.sum()\n")
    with pytest.raises(UsageError) as info:
        jx.user_ns["f"](np.ones((4, 3), np.float32), np.ones((N_DEVICES, 2), np.float32))
    message = str(info.value)
    assert "'params'" in message and "(4, 3)" in message and "8" in message and "None" in message


def test_function_with_an_unknown_axis_name(jx):
    pmap(jx, "--no-show", "def f(v):\n    return lax.psum(v, 'j')\n")
    with pytest.raises(UsageError, match="'j'"):
        jx.user_ns["f"](np.ones(N_DEVICES, np.float32))


def test_function_with_python_if_on_a_traced_value(jx):
    pmap(jx, "--no-show", "def f(v):\n    if v > 0:\n        return v\n    return -v\n")
    with pytest.raises(UsageError) as info:
        jx.user_ns["f"](np.ones(N_DEVICES, np.float32))
    assert "`if v > 0:`" in str(info.value)


def test_mapped_inputs_that_disagree_and_fit_no_device_count(jx):
    jx.push({"a": np.ones((16, 3), np.float32), "b": np.ones((4, 3), np.float32)})
    fails(jx, "--no-show", "y = a.sum() + b.sum()", "'a' has 16", "'b' has 4", f"{N_DEVICES} devices")


def test_an_error_of_the_users_code_is_unchanged_and_says_what_each_device_saw(jx):
    jx.push({"readings": np.arange(N_DEVICES, dtype=np.float32)})
    before = snapshot(jx.user_ns)
    with pytest.raises(IndexError) as info:  # each device holds a scalar: indexing it is the user's bug
        pmap(jx, "--no-show", "z = readings[:3] + 1")
    assert "readings: float32[] (its slice of float32[8])" in "\n".join(info.value.__notes__)
    assert snapshot(jx.user_ns) == before


@pytest.mark.parametrize("line, patterns", [
    ("--in-axes None", ("--in-axes None", "block mode", "`--broadcast NAME`")),
    ("--out-axes 1", ("--out-axes 1", "block mode", "jnp.moveaxis(y, 0, 1)")),
    ("--donate-argnums 0", ("--donate-argnums 0", "defines no function")),
    ("--static-broadcasted-argnums 0", ("--static-broadcasted-argnums 0", "defines no function")),
    ("--in-axes None --plan", ("--in-axes None", "`--broadcast NAME`")),
    ("--in-axes None --as-code", ("--in-axes None", "`--broadcast NAME`")),
])
def test_a_function_mode_option_on_a_block_is_refused_not_dropped(jx, line, patterns):
    """Issue 33 item 6: `--in-axes None` on a block used to split x by rows all the same."""
    jx.push({"xb": np.arange(32.0, dtype=np.float32).reshape(8, 4)})
    fails(jx, line + " --no-show", "yb = xb + 0", *patterns)
    assert "yb" not in jx.user_ns


def test_in_axes_zero_on_a_block_is_what_a_block_does(jx):
    jx.push({"xb": np.arange(32.0, dtype=np.float32).reshape(8, 4)})
    pmap(jx, "--in-axes 0 --out-axes 0 --no-show", "yb = xb * 2")
    np.testing.assert_array_equal(np.asarray(jx.user_ns["yb"]), np.arange(32.0).reshape(8, 4) * 2)
