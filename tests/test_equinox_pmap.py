"""Equinox in %%pmap, as `eqx.filter_pmap` takes it: array leaves are mapped or broadcast by
in_axes, every other leaf (the model's activation function) is static. And outputs with leaves that
are not arrays (an `eqx.nn.MLP`, a dict holding a string or a function) work with the view on, in
%%pmap and %%shard_map, the view showing their array leaves, as --no-show already did.
"""
from __future__ import annotations

import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output
from jax import lax

from shell_helpers import shown_widgets


def run(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, captured


def same_arrays(a, b):
    left, right = jax.tree.leaves(eqx.filter(a, eqx.is_array)), jax.tree.leaves(eqx.filter(b, eqx.is_array))
    assert len(left) == len(right)
    for x, y in zip(left, right):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


@pytest.fixture
def eq(jx):
    model = eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))
    xs = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    jx.push({"eqx": eqx, "model": model, "xs": xs})
    return jx


STEP = """\
def step(m, x):
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(x) ** 2))(m)
    grads = lax.pmean(grads, 'i')
    return lax.pmean(loss, 'i'), eqx.apply_updates(m, jax.tree.map(lambda g: -0.1 * g, grads))
"""


def plain_step(m, x):
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(x) ** 2))(m)
    grads = lax.pmean(grads, "i")
    return lax.pmean(loss, "i"), eqx.apply_updates(m, jax.tree.map(lambda g: -0.1 * g, grads))


def test_function_mode_takes_a_module_as_eqx_filter_pmap_does(eq):
    run(eq, "pmap", "-a i --in-axes '(None, 0)' --out-axes None", STEP)
    model, xs = eq.user_ns["model"], eq.user_ns["xs"]
    reference = eqx.filter_pmap(plain_step, in_axes=(None, 0), out_axes=None, axis_name="i")
    expected_loss, expected = reference(model, xs)
    for _ in range(2):  # a second call reuses the program
        loss, new = eq.user_ns["step"](model, xs)
        np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-6)
        assert isinstance(new, eqx.nn.MLP) and new.activation is model.activation
        same_arrays(new, expected)


def test_function_mode_maps_a_module_stacked_per_device(eq):
    """in_axes 0 maps every array leaf of the module, as eqx.if_array(0) does."""
    model = eq.user_ns["model"]
    stacked = jax.tree.map(lambda a: jnp.stack([a] * 8) if eqx.is_array(a) else a, model)
    eq.push({"stacked": stacked})
    run(eq, "pmap", "-a i", "def forward(m, x):\n    return m(x)")
    out = eq.user_ns["forward"](stacked, eq.user_ns["xs"])
    np.testing.assert_allclose(out, jax.vmap(model)(eq.user_ns["xs"]), rtol=1e-6)


@pytest.mark.parametrize("show", ["--show", "--no-show"])
def test_block_mode_returns_a_module_with_the_view_on(eq, show):
    _, captured = run(eq, "pmap", f"-a i --broadcast model {show}", """\
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(xs) ** 2))(model)
        grads = lax.pmean(grads, 'i')
        model = eqx.apply_updates(model, jax.tree.map(lambda g: -0.1 * g, grads))
    """)
    new = eq.user_ns["model"]
    assert isinstance(new, eqx.nn.MLP)
    assert new.layers[0].weight.shape == (8, 8, 4)  # every device's copy, on the leading axis
    if show == "--show":
        (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
        names = [o["name"] for o in view.state["outputs"]]
        assert "model.layers[0].weight" in names and not any("activation" in n for n in names)


def test_outputs_holding_a_string_or_a_function_with_the_view_on(jx):
    jx.push({"x": jnp.arange(8.0)})
    _, captured = run(jx, "pmap", "-a i", "d = {'a': x * 2, 'label': 'twice', 'f': jnp.sin}")
    d = jx.user_ns["d"]
    assert d["label"] == "twice" and d["f"] is jnp.sin
    np.testing.assert_allclose(d["a"], np.arange(8.0) * 2)
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    assert [o["name"] for o in view.state["outputs"]] == ["d['a']"]


def test_shard_map_outputs_holding_a_string_or_a_module_with_the_view_on(eq):
    with capture_output():
        eq.run_line_magic("mesh", "d=8 --no-show")
    _, captured = run(eq, "shard_map", "--in xs=d --out y=d same", """\
        y = {'a': xs * 2, 'label': 'twice'}
        same = model
    """)
    assert eq.user_ns["y"]["label"] == "twice" and isinstance(eq.user_ns["same"], eqx.nn.MLP)
    np.testing.assert_allclose(eq.user_ns["y"]["a"], np.asarray(eq.user_ns["xs"]) * 2)
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    names = [o["name"] for o in view.state["outputs"]]
    assert "y['a']" in names and "y['label']" not in names
