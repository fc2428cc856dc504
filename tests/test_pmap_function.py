"""%%pmap in function mode: a cell of defs binds each function as its pmapped version.

The seed's data-parallel train_step is checked against `jax.pmap` and against one device's
gradient over the whole batch: the second catches gradients that come out N times too large.
"""
from __future__ import annotations

import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import jaxpar_magic
from shell_helpers import N_DEVICES, pmap, snapshot

# The engine module, found through its class: `jaxpar_magic.pmap` names the plain-Python twin.
engine = importlib.import_module(jaxpar_magic.ParallelFunction.__module__)
from jaxpar_magic.engines.pmap import mesh_for  # noqa: E402


# The seed's train step (`params @ x` there has mismatched shapes for its own data; `x @ params`
# is what it computes: a linear model's predictions for 10 samples of 3 features).
TRAIN = """
import jax
import jax.numpy as jnp
from jax import grad
import jax.lax as lax

def loss(params, batch):
    x, y = batch
    pred = x @ params
    return jnp.mean((pred - y) ** 2)

def train_step(params, batch, lr):
    grads = grad(loss)(params, batch)
    # Average gradients across devices
    grads = lax.pmean(grads, axis_name=AXES)
    new_params = params - lr * grads
    return new_params, loss(params, batch)
"""

LR = 0.1
W0 = np.array([0.5, -1.0, 2.0], np.float32)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_DEVICES, 10, 3)).astype(np.float32)
    Y = rng.normal(size=(N_DEVICES, 10)).astype(np.float32)
    return X, Y


def full_batch_step(X, Y):
    """One device, the whole batch: what data-parallel training must equal."""
    def loss(w):
        return jnp.mean((X.reshape(-1, 3) @ w - Y.reshape(-1)) ** 2)

    return W0 - LR * jax.grad(loss)(W0)


def train_source(axes: str) -> str:
    return TRAIN.replace("AXES", axes)


# --- binding ---------------------------------------------------------------------------------------

def test_defs_are_bound_as_pmapped_versions_with_the_original_at_wrapped(ip):
    source = "import jax.numpy as jnp\n\ndef double(v):\n    return v * 2\n\ndef shift(v, by):\n    return v + by\n"
    assert pmap(ip, "--no-show", source) is None
    double = ip.user_ns["double"]
    assert isinstance(double, engine.ParallelFunction)
    assert double.__name__ == "double"
    original = double.__wrapped__
    assert callable(original) and not isinstance(original, engine.ParallelFunction)
    assert original(21) == 42  # the plain per-device function
    assert ip.user_ns["jnp"] is jnp  # imports of the cell are bound too
    out = double(np.arange(N_DEVICES, dtype=np.float32))
    np.testing.assert_array_equal(out, np.arange(N_DEVICES) * 2)


def test_function_mode_with_show_prints_what_was_bound(ip):
    # Shown by default; the cell's imports are bound beside the functions.
    with capture_output() as captured:
        pmap(ip, "", "import jax\n\ndef f(v):\n    return v\n")
    assert "f: pmapped over 8 devices" in captured.stdout and "f.__wrapped__" in captured.stdout
    assert isinstance(ip.user_ns["f"], engine.ParallelFunction)


def test_a_bound_function_called_inside_a_block_cell_runs_per_device(ip):
    from jax import lax

    ip.push({"lax": lax, "x": np.arange(N_DEVICES, dtype=np.float32)})
    pmap(ip, "--no-show", "def centred(v):\n    return v - lax.pmean(v, 'i')\n")
    np.testing.assert_allclose(ip.user_ns["centred"](ip.user_ns["x"]), np.arange(N_DEVICES) - 3.5)
    pmap(ip, "--no-show", "y = centred(x) * 2")  # inside a cell it is the plain per-device function
    np.testing.assert_allclose(ip.user_ns["y"], (np.arange(N_DEVICES) - 3.5) * 2)



# --- issue 40 item 12: a %%pmap function called inside another magic ---------------------------------

SUMMED = "def summed(v):\n    return lax.psum(v, 'i') + v * 2\n"


def _jax_pmap_inside_jit(ip, x):
    """The oracle: plain JAX's jax.pmap called inside jax.jit (a fresh one: nothing cached)."""
    return jax.jit(lambda v: jax.pmap(ip.user_ns["summed"].__wrapped__, axis_name="i")(v))(x)


@pytest.mark.parametrize("line,source", [
    ("--mesh data=8", "y = summed(x)"),
    ("--mesh data=8 --in x=data", "y = summed(x) * 1"),
    ("--mesh data=4,model=2", "y = summed(x)"),
])
def test_a_bound_function_called_inside_a_shard_cell_runs_as_jax_pmap_inside_jit(ip, line, source):
    """It raised a UsageError that said to use `--axis-name i`, an option %%shard lacks."""
    from jax import lax

    x = jnp.arange(16.0).reshape(N_DEVICES, 2)
    ip.push({"lax": lax, "x": x, "jax": jax})
    pmap(ip, "--no-show", SUMMED)
    for _ in range(2):  # the compiled program, then its re-run
        ip.run_cell_magic("shard", f"{line} --no-show", source)
        np.testing.assert_allclose(ip.user_ns["y"], _jax_pmap_inside_jit(ip, x), rtol=1e-6)
    # Under jax.grad in the cell and in a plain jax.jit, as jax.pmap runs there.
    ip.run_cell_magic("shard", f"{line} --no-show", "dy = jax.grad(lambda v: (summed(v) ** 2).sum())(x)")
    want = jax.jit(jax.grad(lambda v: (jax.pmap(ip.user_ns["summed"].__wrapped__, axis_name="i")(v) ** 2).sum()))(x)
    np.testing.assert_allclose(ip.user_ns["dy"], want, rtol=1e-6)
    ip.run_cell("z = jax.jit(summed)(x)").raise_error()
    np.testing.assert_allclose(ip.user_ns["z"], _jax_pmap_inside_jit(ip, x), rtol=1e-6)


def test_a_bound_function_called_inside_a_shard_cell_without_a_slice_per_device_is_refused(ip):
    from jax import lax

    ip.push({"lax": lax, "x": jnp.arange(12.0)})
    pmap(ip, "--no-show", SUMMED)
    with pytest.raises(Exception):  # plain JAX raises too: 12 entries for 8 devices
        jax.jit(lambda v: jax.pmap(ip.user_ns["summed"].__wrapped__, axis_name="i")(v))(ip.user_ns["x"])
    before = snapshot(ip.user_ns)
    with pytest.raises(UsageError, match="summed: argument 'v' has shape \\(12,\\)"):
        ip.run_cell_magic("shard", "--mesh data=8 --no-show", "y = summed(x)")
    assert snapshot(ip.user_ns) == before


@pytest.mark.parametrize("magic,line", [("shard_map", "--mesh data=8 --in x=P('data') --out y=P('data')"),
                                        ("pmap", "--axis-name j")])
def test_a_bound_function_called_in_per_device_code_of_other_axes_is_a_usage_error(ip, magic, line):
    """Plain JAX refuses jax.pmap inside jax.shard_map; it was a bare AssertionError. The message names
    the function and a fix that works: the cell's mesh axis named as the function's."""
    from jax.sharding import PartitionSpec as P

    from jax import lax

    x = jnp.arange(16.0).reshape(N_DEVICES, 2)
    ip.push({"lax": lax, "x": x})
    pmap(ip, "--no-show", SUMMED)
    mesh = jax.make_mesh((N_DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match="context mesh"):  # plain JAX: jax.pmap inside jax.shard_map
        jax.jit(jax.shard_map(lambda v: jax.pmap(ip.user_ns["summed"].__wrapped__, axis_name="i")(v), mesh=mesh,
                              in_specs=P("data"), out_specs=P("data")))(x)
    before = snapshot(ip.user_ns)
    with pytest.raises(UsageError, match=r"`summed` is a %%pmap function .* axis 'i'.*--mesh i=8") as raised:
        ip.run_cell_magic(magic, f"{line} --no-show", "y = summed(x)")
    assert "\n" not in str(raised.value)
    assert snapshot(ip.user_ns) == before
    # The fix it names: the cell's mesh axis called 'i', where `summed` runs its per-device code.
    fixed = "--mesh i=8 --in x=P('i') --out y=P('i')" if magic == "shard_map" else ""
    ip.run_cell_magic(magic, f"{fixed} --no-show", "y = summed(x)")
    np.testing.assert_allclose(ip.user_ns["y"], _jax_pmap_inside_jit(ip, x), rtol=1e-6)

# --- the seed's train_step ----------------------------------------------------------------------------

def test_train_step_with_per_device_params_equals_jax_pmap_and_the_full_batch(ip, data):
    X, Y = data
    pmap(ip, "--no-show --axis-name batch", train_source("'batch'"))
    train_step = ip.user_ns["train_step"]
    params = np.tile(W0, (N_DEVICES, 1))  # (8, 3): one copy per device
    new_params, loss = train_step(params, (X, Y), LR)
    assert new_params.shape == (N_DEVICES, 3) and loss.shape == (N_DEVICES,)

    ref_params, ref_loss = jax.pmap(train_step.__wrapped__, axis_name="batch", in_axes=(0, 0, None))(
        params, (X, Y), LR)
    np.testing.assert_allclose(new_params, ref_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)

    expected = full_batch_step(X, Y)
    for row in np.asarray(new_params):
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)
    per_device_loss = ((np.einsum("dnk,k->dn", X, W0) - Y) ** 2).mean(1)
    np.testing.assert_allclose(loss, per_device_loss, rtol=1e-5)


def test_train_step_with_broadcast_params_is_not_n_times_too_large(ip, data):
    # Under shard_map's default checks, grad w.r.t. a replicated input is summed over devices
    # before our pmean: the step would be 8 times too large. jax.pmap has no such sum.
    X, Y = data
    pmap(ip, "--no-show --axis-name batch --in-axes (None,0,None)", train_source("'batch'"))
    train_step = ip.user_ns["train_step"]
    new_params, loss = train_step(W0, (X, Y), LR)
    ref_params, _ = jax.pmap(train_step.__wrapped__, axis_name="batch", in_axes=(None, 0, None))(W0, (X, Y), LR)
    np.testing.assert_allclose(new_params, ref_params, rtol=1e-5, atol=1e-6)
    expected = full_batch_step(X, Y)
    assert new_params.shape == (N_DEVICES, 3)
    for row in np.asarray(new_params):
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)


def test_train_step_in_axes_written_as_the_help_suggests(ip, data):
    # The help and our own error message write the literal quoted: `--in-axes "(0, None)"`.
    X, Y = data
    pmap(ip, '--no-show --axis-name batch --in-axes "(None, 0, None)"', train_source("'batch'"))
    new_params, _ = ip.user_ns["train_step"](W0, (X, Y), LR)
    np.testing.assert_allclose(new_params[0], full_batch_step(X, Y), rtol=1e-5, atol=1e-6)


def test_train_step_over_a_mesh_averages_over_both_axes(ip, data):
    X, Y = data
    pmap(ip, "--no-show --mesh data=2,model=4", train_source("('data', 'model')"))
    train_step = ip.user_ns["train_step"]
    assert train_step.axis_names == ("data", "model")
    params = np.tile(W0, (2, 4, 1))
    new_params, loss = train_step(params, (X.reshape(2, 4, 10, 3), Y.reshape(2, 4, 10)), LR)
    assert new_params.shape == (2, 4, 3) and loss.shape == (2, 4)
    expected = full_batch_step(X, Y)
    for row in np.asarray(new_params).reshape(-1, 3):
        np.testing.assert_allclose(row, expected, rtol=1e-5, atol=1e-6)


def test_python_float_arguments_are_broadcast(ip):
    pmap(ip, "--no-show", "def scale(v, s):\n    return v * s\n")
    v = np.arange(N_DEVICES, dtype=np.float32)
    np.testing.assert_allclose(ip.user_ns["scale"](v, 2.5), v * 2.5)
    np.testing.assert_allclose(ip.user_ns["scale"](v, 3), v * 3)


def test_plain_python_twin_is_callable_after_a_cell_ran(ip):
    # `jaxpar_magic.pmap` is documented as the twin of %%pmap in function mode. Importing the
    # engine submodule of the same name (every %%pmap cell does) must not turn it into a module.
    from jax import lax

    pmap(ip, "--no-show", "def f(v):\n    return v\n")  # a cell imports the engine
    twin = jaxpar_magic.pmap
    assert callable(twin), type(twin)
    f = twin(lambda v: lax.psum(v, "k"), axis_name="k")
    np.testing.assert_array_equal(f(np.arange(N_DEVICES, dtype=np.float32)), np.full(N_DEVICES, 28.0))


def test_parallel_function_twin_over_a_given_mesh():
    from jax import lax

    mesh = mesh_for(mesh="a=2,b=4")
    f = jaxpar_magic.ParallelFunction(lambda v: lax.psum(v, ("a", "b")), mesh)
    np.testing.assert_array_equal(f(np.ones((2, 4), np.float32)), np.full((2, 4), 8.0))


# --- pmap's options -------------------------------------------------------------------------------------

def test_in_axes_and_out_axes(ip):
    from jax import lax

    ip.push({"lax": lax})
    pmap(ip, "--no-show --in-axes 1 --out-axes 1", "def g(v):\n    return v * 2 + lax.axis_index('i')\n")
    v = np.arange(3 * N_DEVICES, dtype=np.float32).reshape(3, N_DEVICES)
    out = ip.user_ns["g"](v)
    ref = jax.pmap(ip.user_ns["g"].__wrapped__, axis_name="i", in_axes=1, out_axes=1)(v)
    assert out.shape == (3, N_DEVICES)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out, v * 2 + np.arange(N_DEVICES)[None, :])


def test_out_axes_none_returns_one_replicated_value(ip):
    from jax import lax

    ip.push({"lax": lax})
    pmap(ip, "--no-show --out-axes None", "def total(v):\n    return lax.psum(v, 'i')\n")
    out = ip.user_ns["total"](np.arange(N_DEVICES, dtype=np.float32))
    ref = jax.pmap(ip.user_ns["total"].__wrapped__, axis_name="i", out_axes=None)(np.arange(N_DEVICES, dtype=np.float32))
    assert out.shape == ref.shape == ()
    assert float(out) == 28.0


def test_static_broadcasted_argnums(ip):
    source = "def repeat(v, n):\n    for _ in range(n):\n        v = v * 2\n    return v\n"
    pmap(ip, "--no-show --static-broadcasted-argnums (1,)", source)
    v = np.ones(N_DEVICES, np.float32)
    out = ip.user_ns["repeat"](v, 3)
    ref = jax.pmap(ip.user_ns["repeat"].__wrapped__, static_broadcasted_argnums=(1,))(v, 3)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(out, np.full(N_DEVICES, 8.0))
    np.testing.assert_array_equal(ip.user_ns["repeat"](v, 1), np.full(N_DEVICES, 2.0))


def test_donate_argnums_reuses_the_input_buffer(ip):
    pmap(ip, "--no-show --donate-argnums 0", "def double(v):\n    return v * 2\n")
    double = ip.user_ns["double"]
    first = double(np.arange(N_DEVICES, dtype=np.float32))  # laid out over the devices already
    second = double(first)
    np.testing.assert_array_equal(second, np.arange(N_DEVICES) * 4)
    assert first.is_deleted()


@pytest.mark.parametrize("option", ["--in-axes", "--out-axes", "--static-broadcasted-argnums", "--donate-argnums"])
@pytest.mark.parametrize("text", [
    "__import__('os').getcwd()",
    "\"__import__('os').getcwd()\"",
    "open('x')",
])
def test_option_literals_are_never_evaluated(ip, option, text):
    before = snapshot(ip.user_ns)
    modules = set(sys.modules)
    with pytest.raises(UsageError, match=option):
        pmap(ip, f"--no-show {option} {text}", "def h(v):\n    return v\n")
    assert snapshot(ip.user_ns) == before
    assert set(sys.modules) == modules
