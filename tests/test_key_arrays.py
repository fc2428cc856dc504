"""Typed PRNG key arrays (`jax.random.key`, dtype key<fry>) through every engine and stage (issue 33
item 8): the values are plain JAX's, and the views show a key array's dtype and shape, with its key
data (a few uint32 words) as the tile's text."""
from __future__ import annotations

import textwrap

import jax
import numpy as np
import pytest
from IPython.utils.capture import capture_output

from shell_helpers import shown_widgets

FOLD = "fold = jax.vmap(lambda k: jax.random.fold_in(k, 1))"


@pytest.fixture
def keys(jx):
    jx.run_cell(textwrap.dedent(f"""
        mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
        ks = jax.random.split(jax.random.key(0), 8)
        {FOLD}
    """), store_history=False).raise_error()
    return jx


def expected_fold():
    return jax.random.key_data(jax.vmap(lambda k: jax.random.fold_in(k, 1))(jax.random.split(jax.random.key(0), 8)))


def run(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, {type(w).__name__: w.state for w in shown_widgets(captured)}


def assert_keys_equal(actual, expected_data):
    assert jax.dtypes.issubdtype(actual.dtype, jax.dtypes.prng_key), actual.dtype
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(actual)), np.asarray(expected_data))


def test_pmap_view_of_a_key_output(keys):
    _, views = run(keys, "pmap", "", "y = jax.random.fold_in(ks, 1)")
    assert_keys_equal(keys.user_ns["y"], expected_fold())
    (out,) = views["ResultView"]["outputs"]
    assert (out["name"], out["dtype"], out["shape"]) == ("y", "key<fry>", [])
    first = np.asarray(expected_fold())[0]
    assert out["tiles"][0]["text"] == f"[{first[0]} {first[1]}]"  # its key data: two uint32 words


@pytest.mark.parametrize("show", ["", "--no-show"])
def test_shard_map_key_output(keys, show):
    _, views = run(keys, "shard_map", f"--mesh mesh --in ks=data --out y=data {show}", "y = fold(ks)")
    assert_keys_equal(keys.user_ns["y"], expected_fold())
    if show != "--no-show":
        (out,) = views["ResultView"]["outputs"]
        assert (out["dtype"], out["shape"], out["global_shape"]) == ("key<fry>", [1], [8])
        assert [t["slice"] for t in out["tiles"]][:2] == ["[0:1]", "[1:2]"]


def test_shard_key_output(keys):
    _, views = run(keys, "shard", "--mesh mesh --in ks=data", "y = fold(ks)")
    assert_keys_equal(keys.user_ns["y"], expected_fold())


@pytest.mark.parametrize("magic, line, source", [
    ("shard", "--mesh mesh --in ks=data", "y = fold(ks)"),
    ("shard_map", "--mesh mesh --in ks=data --out y=data", "y = fold(ks)"),
    ("pmap", "", "y = jax.random.fold_in(ks, 1)"),
])
def test_plan_of_a_key_output(keys, magic, line, source):
    _, views = run(keys, magic, f"--plan {line}", source)
    (out,) = views["PlanView"]["outputs"]
    assert (out["name"], out["dtype"], out["shape"]) == ("y", "key<fry>", [8])
    planned = keys.user_ns["y"]
    assert isinstance(planned, jax.ShapeDtypeStruct) and planned.dtype == keys.user_ns["ks"].dtype


def test_plan_of_an_abstract_key_input(keys):
    keys.push({"ak": jax.ShapeDtypeStruct((8,), keys.user_ns["ks"].dtype)})
    _, views = run(keys, "shard", "--plan --mesh mesh --in ak=data", "y = fold(ak)")
    assert views["PlanView"]["outputs"][0]["dtype"] == "key<fry>"


def test_collectives_of_a_cell_with_keys(keys):
    """A key output beside a recorded psum (pmap), and an all_gather of keys (shard_map): counted,
    not recorded, as a card says."""
    _, views = run(keys, "pmap", "--collectives",
                   "y = jax.random.fold_in(ks, 1)\ns = jax.lax.psum(jax.random.key_data(y), 'i')")
    assert_keys_equal(keys.user_ns["y"], expected_fold())
    np.testing.assert_array_equal(np.asarray(keys.user_ns["s"])[0], np.asarray(expected_fold()).sum(0, dtype=np.uint32))
    assert [c["recorded"] for c in views["CollectivesView"]["cards"]] == [True]

    _, views = run(keys, "shard_map", "--mesh mesh --in ks=data --out y=data --collectives",
                   "g = jax.lax.all_gather(ks, 'data', tiled=True)\ny = fold(g)[:1]")
    first = np.asarray(expected_fold())[:1]
    assert_keys_equal(keys.user_ns["y"], np.repeat(first, 8, axis=0))
    (card,) = views["CollectivesView"]["cards"]
    assert card["recorded"] is False and "PRNG key" in card["why_not"]


def test_a_jax_error_about_keys_in_pmap_is_jaxs_own(keys):
    """JAX cannot lower an all_gather of scalar keys (plain jax.pmap neither): its error, not ours
    about a dtype NumPy cannot read."""
    with pytest.raises(ValueError, match="verifier"):
        run(keys, "pmap", "--no-show", "g = jax.lax.all_gather(ks, 'i')")
    with pytest.raises(ValueError, match="verifier"):
        jax.pmap(lambda k: jax.lax.all_gather(k, "i"), axis_name="i")(keys.user_ns["ks"])
