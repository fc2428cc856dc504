"""Placed inputs are compared as layouts, not as spellings (issue 39): on an Explicit mesh a cell
that rebinds `x` placed by `--in x=P()` gets it back spelled `P(None, None)`, the same layout, and its
re-runs must take the short path, whichever way the line spells the spec.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic.stages.run.shard as shard_run
from jaxpar_magic.cell.layout import same_layout


@pytest.fixture
def full_paths(monkeypatch):
    """How many runs of %%shard took the full path (prepare, place, look the program up)."""
    calls = []
    original = shard_run._full_path

    def counted(*args, **kwargs):
        calls.append(args[0].source)
        return original(*args, **kwargs)

    monkeypatch.setattr(shard_run, "_full_path", counted)
    return calls


def make_mesh(ip, kind: str):
    with capture_output():
        ip.run_line_magic("mesh", f"data=4 model=2 --axis-types {kind} --no-show")
    return ip.user_ns["mesh"]


SPELLINGS = {
    # the line's spec -> the PartitionSpec a 2-D input is placed by
    "x=P()": P(), "x=P(None)": P(), "x=P(None, None)": P(), "x=None,None": P(),
    "x=data": P("data"), "x=P('data')": P("data"), "x=P(('data',), None)": P("data"), "x=data,None": P("data"),
    "x=None,model": P(None, "model"), "x=P(None, ('model',))": P(None, "model"),
    "x=(data,model),None": P(("data", "model")),
}


@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_cell_that_rebinds_its_placed_input_reruns_on_the_short_path(jx, full_paths, compiles, kind, spelling):
    mesh = make_mesh(jx, kind)
    x0 = jnp.arange(64.0).reshape(8, 8)
    jx.push({"x": x0})
    line = f"--mesh mesh --in {spelling} --no-show"
    jx.run_cell_magic("shard", line, "x = x * 2 + 1\n")
    compiled = compiles.count
    for _ in range(3):
        jx.run_cell_magic("shard", line, "x = x * 2 + 1\n")
    assert len(full_paths) == 1, f"{len(full_paths)} full paths for four runs"
    assert compiles.count == compiled
    plain = jax.jit(lambda v: v * 2 + 1)
    expected = jax.device_put(x0, NamedSharding(mesh, SPELLINGS[spelling]))
    for _ in range(4):
        expected = plain(expected)
    x = jx.user_ns["x"]
    np.testing.assert_array_equal(np.asarray(x), np.asarray(expected))
    assert x.sharding.is_equivalent_to(NamedSharding(mesh, SPELLINGS[spelling]), 2)


def test_an_input_in_another_layout_still_takes_the_full_path(jx, full_paths):
    mesh = make_mesh(jx, "explicit")
    jx.push({"x": jnp.arange(64.0).reshape(8, 8)})
    line = "--mesh mesh --in x=P() --no-show"
    jx.run_cell_magic("shard", line, "y = x * 2\n")
    jx.push({"x": jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data")))})
    jx.run_cell_magic("shard", line, "y = x * 2\n")
    assert len(full_paths) == 2  # split over data, where --in says replicated: placed again
    assert jx.user_ns["x"].sharding.spec == P()
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(64.0).reshape(8, 8) * 2)


def test_same_layout_reads_specs_per_dimension(jx):
    mesh = make_mesh(jx, "explicit")
    other = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)

    def named(spec, on=mesh):
        return NamedSharding(on, spec)

    assert same_layout(named(P()), named(P(None, None)), 2)
    assert same_layout(named(P("data")), named(P(("data",), None)), 2)
    assert same_layout(named(P(("data", "model"))), named(P(("data", "model"), None)), 2)
    assert not same_layout(named(P("data")), named(P(None, "data")), 2)
    assert not same_layout(named(P("data", "model")), named(P("model", "data")), 2)
    assert not same_layout(named(P(("data", "model"))), named(P(("model", "data"))), 2)
    assert not same_layout(named(P()), named(P(), other), 2)  # other device order
    assert not same_layout(named(P()), None, 2)
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert same_layout(single, single, 2) and not same_layout(named(P()), single, 2)
