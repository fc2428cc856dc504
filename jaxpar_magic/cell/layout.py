"""Where every piece of an array lives: tiles computed from shape, mesh and PartitionSpec alone.

Pure arithmetic over the mesh, so a 4,096-device plan of a 10^12-element abstract array costs
the same as 8 devices and a tiny array: nothing here touches array data.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class Tile:
    block: tuple[int, ...]  # the block's position along each array dimension
    index: tuple[tuple[int, int], ...]  # [start, stop) along each dimension
    devices: tuple[int, ...]  # every device holding this block (several when replicated)

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.index)


def spec_axes(spec, ndim: int) -> list[tuple[str, ...]]:
    """A PartitionSpec as one tuple of mesh axis names per array dimension (padded with ())."""
    entries = list(spec) + [None] * (ndim - len(spec))
    out = []
    for entry in entries:
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        else:
            out.append(tuple(entry))
    return out


def same_layout(sharding, placed, ndim: int) -> bool:
    """Whether `sharding` lays an array of `ndim` dimensions out as `placed` does, however each
    spells its PartitionSpec: `P()`, `P(None)` and `P(None, None)` are one layout of a 2-D array,
    as are `P('data')`, `P(('data',))` and `P('data', None)`. An array on an Explicit mesh comes out
    of a program spelled in full (`P(None, None)`) where `--in x=P()` placed it: the same layout.

    Equal shardings answer at once; NamedShardings on one mesh and memory kind compare their specs
    per dimension (and what they leave unreduced or reduced); any other pair asks JAX whether they
    put the same data on the same devices."""
    if sharding == placed:
        return True
    if sharding is None or placed is None:
        return False
    import jax

    named = jax.sharding.NamedSharding
    if isinstance(sharding, named) and isinstance(placed, named):
        a, b = sharding.spec, placed.spec
        return (sharding.mesh == placed.mesh and sharding.memory_kind == placed.memory_kind
                and spec_axes(a, ndim) == spec_axes(b, ndim)
                and getattr(a, "unreduced", None) == getattr(b, "unreduced", None)
                and getattr(a, "reduced", None) == getattr(b, "reduced", None))
    return sharding.is_equivalent_to(placed, ndim)


def named_tiles(shape, axis_names, axis_sizes, device_ids, spec) -> list[Tile]:
    """Tiles of an array of `shape` laid out by `spec` over a mesh (device ids in row-major order).

    JAX's rule, reproduced: along a dimension split over axes (a, b), the block index is the
    mixed-radix number of the device's (a, b) coordinates, a major; blocks have ceil(n / blocks)
    elements (the last one may be short); devices that differ only in unused axes share a block.
    """
    ndim = len(shape)
    per_dim = spec_axes(spec, ndim)
    position = {name: i for i, name in enumerate(axis_names)}
    blocks_per_dim = []
    for axes in per_dim:
        count = 1
        for a in axes:
            count *= axis_sizes[position[a]]
        blocks_per_dim.append(count)
    sizes = [-(-n // b) if b else n for n, b in zip(shape, blocks_per_dim)]
    holders: dict[tuple[int, ...], list[int]] = {}
    for flat, coords in enumerate(itertools.product(*(range(s) for s in axis_sizes))):
        block = []
        for axes in per_dim:
            index = 0
            for a in axes:
                index = index * axis_sizes[position[a]] + coords[position[a]]
            block.append(index)
        holders.setdefault(tuple(block), []).append(device_ids[flat])
    tiles = []
    for block, devices in sorted(holders.items()):
        index = tuple(
            (min(b * s, n), min((b + 1) * s, n)) for b, s, n in zip(block, sizes, shape)
        )
        tiles.append(Tile(block, index, tuple(devices)))
    return tiles


def tiles_from_index_map(shape, index_map) -> list[Tile]:
    """Tiles of any sharding JAX can describe (`sharding.devices_indices_map(shape)`)."""
    by_index: dict[tuple, list[int]] = {}
    for device, index in index_map.items():
        key = tuple(
            (s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape)
        )
        by_index.setdefault(key, []).append(device.id)
    starts = [sorted({key[d][0] for key in by_index}) for d in range(len(shape))]
    tiles = []
    for key, devices in sorted(by_index.items()):
        block = tuple(starts[d].index(key[d][0]) for d in range(len(shape)))
        tiles.append(Tile(block, key, tuple(sorted(devices))))
    return tiles
