"""More mistakes that reached the user as raw or misleading tracebacks (issue 33 items 10-13b, 17):
each is now what a plain cell says, or a one-paragraph UsageError that names the value and the fix,
and a failed cell leaves the namespace exactly as it was (checked by identity)."""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from shell_helpers import snapshot

AUTO = 'jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))'
EXPLICIT = 'jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))'


@pytest.fixture
def meshes(jx):
    jx.run_cell(f"ma = {AUTO}\nme = {EXPLICIT}\nx = jnp.arange(32.0).reshape(8, 4)", store_history=False).raise_error()
    return jx


def refused(ip, magic: str, line: str, source: str, error=UsageError) -> str:
    """The cell's error text; the namespace must be untouched (names and identities)."""
    before = snapshot(ip.user_ns)
    with capture_output(), pytest.raises(error) as err:
        ip.run_cell_magic(magic, line, textwrap.dedent(source))
    assert snapshot(ip.user_ns) == before
    message = str(err.value)
    if error is UsageError:
        assert "\n" not in message.strip()  # one paragraph
    return message


# --- item 10: return and yield at a cell's top level ----------------------------------------------

@pytest.mark.parametrize("statement, word", [("return y", "return"), ("yield y", "yield"),
                                             ("if y.size:\n    return y", "return")])
@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh ma --in x=data"),
    ("shard", "--mesh me --in x=data"),  # used to be an "ambiguous sharding" UsageError
    ("shard", "--mesh ma --in x=data --plan"),
    ("pmap", ""),
    ("shard_map", "--mesh ma --in x=data --out y=data"),
])
def test_return_or_yield_outside_a_function(meshes, magic, line, statement, word):
    refused(meshes, magic, line, f"y = x * 2\n{statement}\n", SyntaxError)
    plain = meshes.run_cell(f"y = x * 2\n{statement}\n", store_history=False, silent=True)
    with pytest.raises(SyntaxError) as err:
        plain.raise_error()
    assert str(err.value).startswith(f"'{word}' outside function")  # what the magic said too
    with pytest.raises(SyntaxError, match=f"'{word}' outside function") as magic_err:
        with capture_output():
            meshes.run_cell_magic(magic, line, f"y = x * 2\n{statement}\n")
    assert magic_err.value.lineno == err.value.lineno and magic_err.value.text.strip() == statement.split("\n")[-1].strip()


def test_return_inside_a_function_of_the_cell_is_fine(meshes):
    with capture_output():
        meshes.run_cell_magic("shard", "--mesh ma --in x=data --no-show", "def f(v):\n    return v * 2\ny = f(x)\n")
    assert (meshes.user_ns["y"] == meshes.user_ns["x"] * 2).all()


# --- item 12: a Python int JAX cannot take --------------------------------------------------------

@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh ma --in x=data"),
    ("shard", "--mesh ma --in x=data --plan"),
    ("pmap", ""),
    ("shard_map", "--mesh ma --in x=data --out y=data"),
])
@pytest.mark.parametrize("value", [2**64, -2**70, 2**40])
def test_a_python_int_too_large_names_the_variable(meshes, magic, line, value):
    meshes.push({"big": value})
    with pytest.raises(OverflowError, match="argument path is y"):  # plain JAX's, naming jnp.add's parameter
        jax.jit(lambda v: v + value)(meshes.user_ns["x"])
    message = refused(meshes, magic, line, "z = x * 2\ny = z + big\n")
    assert message.startswith(f"line 2 of the cell (`y = z + big`): `big` is the Python int {value}, which does not "
                              "fit JAX's int32")
    assert "`float(big)`" in message and "argument path" not in message


def test_an_int_literal_too_large_is_named_by_its_line(meshes):
    message = refused(meshes, "shard", "--mesh ma --in x=data", "y = x + 2**64\n")
    assert message.startswith(f"line 1 of the cell (`y = x + 2**64`): the Python int {2**64}, which")


# --- item 13b: an array whose type names an Explicit mesh's axes, moved to one device --------------

def test_an_explicit_array_moved_to_one_device_then_placed(meshes):
    meshes.run_cell("from jax.sharding import NamedSharding, PartitionSpec as P\n"
                    "xe = jax.device_put(x, NamedSharding(me, P('data')))\nx1 = jax.device_put(xe, jax.devices()[0])",
                    store_history=False).raise_error()
    x1 = meshes.user_ns["x1"]
    with pytest.raises(Exception) as plain:  # plain JAX: its ShardingTypeError
        jax.device_put(x1, jax.sharding.NamedSharding(meshes.user_ns["ma"], jax.sharding.PartitionSpec("data")))
    assert type(plain.value).__name__ == "ShardingTypeError"
    for mesh in ("ma", "me"):
        message = refused(meshes, "shard", f"--mesh {mesh} --in x1=data", "y = x1 * 2\n")
        assert message.startswith("--in x1: its type float32[8@data,4] still names the axes of the Explicit mesh")
        assert "`x1 = jnp.asarray(np.asarray(x1))`" in message
    meshes.run_cell("x1 = jnp.asarray(np.asarray(x1))", store_history=False).raise_error()  # the fix works
    with capture_output():
        meshes.run_cell_magic("shard", "--mesh ma --in x1=data --no-show", "y = x1 * 2\n")
    assert (meshes.user_ns["y"] == meshes.user_ns["x"] * 2).all()


# --- item 17: --out of a name the cell deletes ---------------------------------------------------

@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh ma --in x=data --out yd=data"),
    ("shard", "--mesh ma --in x=data --out yd"),  # used to bind nothing, silently
    ("shard", "--mesh ma --in x=data --out yd=data --plan"),
    ("shard_map", "--mesh ma --in x=data --out yd=data"),
])
def test_out_of_a_name_the_cell_deletes(meshes, magic, line):
    message = refused(meshes, magic, line, "yd = x * 2\nz = yd + 1\ndel yd\n")
    assert message.startswith("--out yd: 'yd' is not bound when the cell ends (line 3 of the cell, `del yd`, deletes it)")
    assert "drop yd from --out" in message


# --- a donated input read again (found by the differential test's --donate steps) -----------------

def test_a_donated_input_run_again_is_a_usage_error_not_a_crash():
    """JAX 0.10's jit crashes the process (SIGSEGV) when called with a deleted (donated) argument on
    CPU, so the magic checks before the call: the README's UsageError, in a kernel that lives on. In
    a subprocess, so that the crash it guards against cannot take pytest down."""
    from shell_helpers import in_a_fresh_shell

    done = in_a_fresh_shell("""
        from IPython.utils.capture import capture_output
        ip.run_cell("import jax, jax.numpy as jnp\\n"
                    "mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))\\n"
                    "xd = jnp.arange(32.0).reshape(8, 4)").raise_error()
        for line in ("--no-show", "--no-show", "", "--no-show --donate xd"):  # the replay, then the full path
            ip.run_cell("xd = jnp.arange(32.0).reshape(8, 4)").raise_error()
            with capture_output():
                ip.run_cell_magic("shard", "--mesh mesh --in xd=data --donate xd --no-show", "yd = xd * 2 + 1")
            assert ip.user_ns["xd"].is_deleted()
            try:
                with capture_output():
                    ip.run_cell_magic("shard", f"--mesh mesh --in xd=data {line}", "yd = xd * 2 + 1")
            except UsageError as err:
                assert str(err).startswith("`xd` was deleted"), err
            else:
                raise AssertionError("no UsageError")
        print("alive")
    """, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("alive"), (done.returncode, done.stderr[-2000:])
