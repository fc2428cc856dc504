"""cell/layout.py's tile arithmetic against JAX itself.

`named_tiles` claims to reproduce where JAX puts every block of an array laid out by a
PartitionSpec over a mesh, from shape, mesh and spec alone (that is what lets a 4,096-device plan
cost nothing). Here hypothesis draws shapes, meshes over the 8 simulated devices (in random device
orders) and specs, and every tile is checked against `jax.device_put(...).addressable_shards`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from shell_helpers import N_DEVICES
from jaxpar_magic.cell.layout import named_tiles, spec_axes, tiles_from_index_map
from jaxpar_magic.views.summaries import expand_sharding_tiles, sharding_state

MESH_SHAPES = [(8,), (2, 4), (4, 2), (2, 2, 2)]
AXIS_NAMES = {1: ("a",), 2: ("a", "b"), 3: ("a", "b", "c")}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layouts(draw):
    """(mesh, shape, spec): a mesh over all 8 devices, and an array shape each spec entry divides."""
    sizes = draw(st.sampled_from(MESH_SHAPES))
    names = AXIS_NAMES[len(sizes)]
    order = draw(st.permutations(range(N_DEVICES)))
    devices = {d.id: d for d in jax.devices()}
    grid = np.array([devices[i] for i in order], dtype=object).reshape(sizes)
    mesh = Mesh(grid, names)

    ndim = draw(st.integers(1, 3))
    unused = list(names)
    entries = []
    for _ in range(ndim):
        kind = draw(st.sampled_from(["none", "one", "tuple"]))
        if kind == "one" and unused:
            axis = draw(st.sampled_from(unused))
            unused.remove(axis)
            entries.append(axis)
        elif kind == "tuple" and unused:
            picked = draw(st.lists(st.sampled_from(unused), min_size=1, max_size=len(unused), unique=True))
            for axis in picked:
                unused.remove(axis)
            entries.append(tuple(picked))
        else:
            entries.append(None)
    # A shorter spec than the array's rank is allowed: the missing trailing entries mean None.
    keep = draw(st.integers(0, ndim))
    if any(e is not None for e in entries[keep:]):
        keep = ndim
    spec = tuple(entries[:keep])

    size_of = dict(zip(names, sizes))
    shape = []
    for axes in spec_axes(spec, ndim):
        blocks = math.prod(size_of[a] for a in axes)
        shape.append(blocks * draw(st.integers(1, 3)))
    return mesh, tuple(shape), spec


def place(mesh, shape, spec):
    x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape)
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def as_pairs(index: tuple[slice, ...], shape) -> tuple[tuple[int, int], ...]:
    return tuple((s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape))


def jax_layout(array) -> dict[int, tuple[tuple[int, int], ...]]:
    """device id -> [start, stop) per dimension, as JAX placed the array."""
    return {shard.device.id: as_pairs(shard.index, array.shape) for shard in array.addressable_shards}


@SETTINGS
@given(layouts())
def test_named_tiles_agree_with_jax_device_put(layout):
    mesh, shape, spec = layout
    array = place(mesh, shape, spec)
    ids = [int(d.id) for d in mesh.devices.flat]
    tiles = named_tiles(shape, tuple(mesh.axis_names), tuple(mesh.devices.shape), ids, spec)

    placed = jax_layout(array)
    ours = {device: tile.index for tile in tiles for device in tile.devices}
    assert ours == placed  # every device, and the very slice JAX gave it

    # Each tile is one distinct block: its devices hold the same data, distinct tiles differ.
    assert len({t.index for t in tiles}) == len(tiles)
    assert sorted(d for t in tiles for d in t.devices) == sorted(ids)
    for tile in tiles:
        assert tile.shard_shape == tuple(array.sharding.shard_shape(shape))
        data = {shard.device.id: np.asarray(shard.data) for shard in array.addressable_shards}
        expected = np.asarray(array)[tuple(slice(a, b) for a, b in tile.index)]
        for device in tile.devices:
            np.testing.assert_array_equal(data[device], expected)

    # Block coordinates: one per dimension, counting blocks along that dimension.
    for tile in tiles:
        for dim, (block, (start, _)) in enumerate(zip(tile.block, tile.index)):
            assert start == block * tile.shard_shape[dim]


@SETTINGS
@given(layouts())
def test_sharding_state_of_a_real_array_agrees_with_jax(layout):
    mesh, shape, spec = layout
    array = place(mesh, shape, spec)
    state = sharding_state("x", array)

    placed = jax_layout(array)
    tiles = expand_sharding_tiles(state)
    from_state = {d: tuple(tuple(i) for i in tile["index"]) for tile in tiles for d in tile["devices"]}
    assert from_state == placed
    assert state["shape"] == list(shape)
    assert state["total_devices"] == N_DEVICES
    assert [a["name"] for a in state["mesh_axes"]] == list(mesh.axis_names)
    assert [a["size"] for a in state["mesh_axes"]] == list(mesh.devices.shape)

    per_dim = spec_axes(spec, len(shape))
    size_of = dict(zip(mesh.axis_names, mesh.devices.shape))
    assert state["grid"] == [math.prod(size_of[a] for a in axes) for axes in per_dim]
    assert len(tiles) == math.prod(state["grid"])
    used = {a for axes in per_dim for a in axes}
    assert state["replicated_over"] == [a for a in mesh.axis_names if a not in used]
    copies = math.prod(size_of[a] for a in state["replicated_over"])
    assert all(len(tile["devices"]) == copies for tile in tiles)
    for tile in tiles:
        assert tile["shard_shape"] == [b - a for a, b in tile["index"]]


@SETTINGS
@given(layouts())
def test_tiles_from_jax_index_map_match_the_named_arithmetic(layout):
    """The generic path (any sharding JAX describes) and the NamedSharding arithmetic agree."""
    mesh, shape, spec = layout
    sharding = NamedSharding(mesh, P(*spec))
    ids = [int(d.id) for d in mesh.devices.flat]
    named = named_tiles(shape, tuple(mesh.axis_names), tuple(mesh.devices.shape), ids, spec)
    generic = tiles_from_index_map(shape, sharding.devices_indices_map(shape))
    assert [(t.block, t.index, tuple(sorted(t.devices))) for t in named] == [
        (t.block, t.index, t.devices) for t in generic
    ]


def test_named_tiles_need_no_devices_at_4096():
    """The arithmetic runs for a pod-sized mesh with plain integers: nothing is allocated."""
    tiles = named_tiles((2**20, 2**20), ("x", "y", "z"), (16, 16, 16), list(range(4096)), (("x", "y"), "z"))
    assert len(tiles) == 4096
    assert {t.shard_shape for t in tiles} == {(2**12, 2**16)}
    first, last = tiles[0], tiles[-1]
    assert first.index == ((0, 4096), (0, 65536)) and first.devices == (0,)
    assert last.index == ((2**20 - 4096, 2**20), (2**20 - 65536, 2**20)) and last.devices == (4095,)


@pytest.mark.parametrize("spec", [(), (None, None), ("a",), (None, ("b", "a"))])
def test_unused_axes_hold_copies(spec):
    ids = list(range(8))
    tiles = named_tiles((4, 8), ("a", "b"), (2, 4), ids, spec)
    per_dim = spec_axes(spec, 2)
    used = {a for axes in per_dim for a in axes}
    copies = math.prod(s for n, s in (("a", 2), ("b", 4)) if n not in used)
    assert all(len(t.devices) == copies for t in tiles)
    assert len(tiles) * copies == 8
