"""Mistakes that used to reach the user as raw Python or JAX tracebacks, or as a silently dropped
layout (issue 22): each is now a one-paragraph UsageError that names the value and the fix, and the
failed cell leaves the namespace exactly as it was (checked by identity); what plain JAX accepts
works as plain JAX does."""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from shell_helpers import pmap, snapshot


@pytest.fixture
def data8(jx):
    with capture_output():
        jx.run_line_magic("mesh", "data=8")
    return jx


def refused(ip, magic: str, line: str, source: str) -> str:
    """The cell's UsageError text; the namespace must be untouched (names and identities) and the
    cell must have shown nothing."""
    before = snapshot(ip.user_ns)
    with capture_output() as captured, pytest.raises(UsageError) as err:
        ip.run_cell_magic(magic, line, textwrap.dedent(source))
    assert snapshot(ip.user_ns) == before
    assert captured.outputs == []
    message = str(err.value)
    assert "\n" not in message.strip()  # one paragraph
    return message


# --- item 6 and the --out mistakes: --out says what --in says ---------------------------------------

@pytest.mark.parametrize("option", ["--in a=data", "--out b=data"])
def test_a_dimension_the_axis_does_not_divide(data8, option):
    data8.push({"a": jnp.ones(12)})
    message = refused(data8, "shard", f"--no-show {option}", "b = a * 2\n")
    name = option.split()[1].split("=")[0]
    assert message.startswith(f"{option.split()[0]} {name}: dimension 0 of '{name}' has 12 elements")
    assert "does not divide over data=8 = 8 devices" in message


@pytest.mark.parametrize("option", ["--in a=data,data", "--out b=data,data"])
def test_an_axis_used_twice(data8, option):
    data8.push({"a": jnp.ones((8, 8))})
    message = refused(data8, "shard", f"--no-show {option}", "b = a * 2\n")
    assert "mesh axis 'data' is used twice" in message


@pytest.mark.parametrize("option", ["--in a=data,None,None", "--out b=data,None,None"])
def test_a_spec_longer_than_the_rank(data8, option):
    data8.push({"a": jnp.ones(16)})
    message = refused(data8, "shard", f"--no-show {option}", "b = a * 2\n")
    assert "the spec has 3 entries but" in message and "(1 dimension)" in message


def test_out_names_the_leaf_of_a_pytree_output(data8):
    data8.push({"a": jnp.ones(16)})
    message = refused(data8, "shard", "--no-show --out b=data", "b = {'even': a, 'odd': a[:12]}\n")
    assert message.startswith("--out b['odd']: dimension 0 of \"b['odd']\" has 12 elements")


def test_a_good_out_spec_still_lays_the_output_out(data8):
    data8.push({"a": jnp.ones(16)})
    data8.run_cell_magic("shard", "--no-show --out b=data", "b = a * 2\n")
    assert data8.user_ns["b"].sharding.spec == jax.sharding.PartitionSpec("data")


# --- dicts whose keys mix types -------------------------------------------------------------------

@pytest.mark.parametrize("magic,line", [("shard", "--no-show"), ("shard", ""), ("pmap", "--no-show"),
                                        ("shard_map", "--no-show")])
def test_a_dict_of_mixed_keys_read_as_a_constant_works_like_jit_closing_over_it(data8, magic, line):
    cfg = {0: 0.5, "lr": 0.1}
    x = jnp.arange(8.0)
    data8.push({"cfg": cfg, "x": x})
    for lr in (0.1, 0.2):  # a changed constant recompiles, as for any other constant
        cfg["lr"] = lr
        data8.push({"cfg": dict(cfg)})
        data8.run_cell_magic(magic, line, "y = x * cfg['lr'] + cfg[0]\n")
        expected = jax.jit(lambda x: x * cfg["lr"] + cfg[0])(x)
        np.testing.assert_allclose(data8.user_ns["y"], expected, rtol=1e-6)


def test_a_dict_of_mixed_keys_holding_arrays_is_named(data8):
    data8.push({"cfg": {"opt": {0: jnp.ones(8), "lr": 0.1}}})
    message = refused(data8, "shard", "--no-show", "y = cfg['opt'][0] * 2\n")
    assert message.startswith("`cfg['opt']` is a dict whose keys mix int and str (read on line 1 of the cell")
    assert "one type" in message and "{str(k): v for k, v in cfg['opt'].items()}" in message


def test_an_output_dict_of_mixed_keys(data8):
    data8.push({"x": jnp.ones(8)})
    message = refused(data8, "shard", "--no-show", "d = {0: x * 2, 'n': 1}\n")
    assert message.startswith("the cell's output `d` is a dict whose keys mix int and str")
    assert "del d" in message
    data8.run_cell_magic("shard", "--no-show", "labels = {0: 'zero', 'n': 1}\ny = x + 1\n")  # plain Python: kept
    assert data8.user_ns["labels"] == {0: "zero", "n": 1}


# --- --in NAME=@SPECS with SPECS None ----------------------------------------------------------------

@pytest.mark.parametrize("magic", ["shard", "shard_map"])
def test_a_spec_tree_that_is_none(data8, magic):
    data8.push({"params": {"w": jnp.ones(8)}, "sp": None})
    message = refused(data8, magic, "--no-show --in params=@sp", "y = params['w'] * 2\n")
    assert message.startswith("--in params=@sp: 'sp' is None, not a pytree of PartitionSpecs")
    assert "params=None" in message


# --- NumPy leaves JAX cannot trace --------------------------------------------------------------------

@pytest.mark.parametrize("leaf,expected", [
    (np.zeros(8, dtype=[("a", "i4"), ("b", "f4")]), "`state['when']['a']`"),
    (np.arange(8).astype("datetime64[s]"), "`state['when'].astype('int64')` (whole s since 1970)"),
    (np.arange(8).astype("timedelta64[ms]"), "(whole ms)"),
    (np.zeros(8, dtype="V4"), "Make it a tuple or a list"),
])
@pytest.mark.parametrize("magic", ["shard", "pmap"])
def test_structured_and_datetime_leaves_are_named(data8, leaf, expected, magic):
    data8.push({"state": {"w": jnp.ones(8), "when": leaf}})
    message = refused(data8, magic, "--no-show", "y = state['w'] * 2\n")
    assert message.startswith(f"`state['when']` is a NumPy array of {leaf.dtype}")
    assert expected in message and "blocks[0]" not in message and "args[0]" not in message


def test_bfloat16_leaves_are_still_traced(data8):
    data8.push({"state": {"w": jnp.ones(8, jnp.bfloat16)}})
    data8.run_cell_magic("shard", "--no-show", "y = state['w'] * 2\n")
    assert data8.user_ns["y"].dtype == jnp.bfloat16


# --- %%pmap --static-broadcasted-argnums with an unhashable value ------------------------------------

def test_an_unhashable_static_argument_says_what_jax_pmap_says(jx):
    pmap(jx, "--no-show --static-broadcasted-argnums 1", "def scale(v, factors):\n    return v * len(factors)\n")
    v = jnp.arange(8.0)
    jx.push({"v": v})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError) as err:
        jx.user_ns["scale"](v, [1, 2])
    message = str(err.value)
    assert "argument 'factors' (position 1) is static" in message
    assert "static arguments must be hashable, as jax.pmap requires" in message and "a list" in message
    assert snapshot(jx.user_ns) == before
    np.testing.assert_allclose(jx.user_ns["scale"](v, (1, 2)), v * 2)
