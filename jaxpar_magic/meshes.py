"""Building device meshes for our cells: automatic axes, the devices the user chose."""
from __future__ import annotations

from functools import lru_cache

from .devices import select_devices
from .errors import UsageError
from .specs import MeshShape


def axis_types(kind: str, count: int):
    import jax

    try:
        member = getattr(jax.sharding.AxisType, kind.capitalize())
    except AttributeError:
        raise UsageError(f"--axis-types: {kind!r} is not an axis type; use auto, explicit or manual.") from None
    return (member,) * count


@lru_cache(maxsize=64)
def _mesh(device_ids: tuple[int, ...], shape: MeshShape, kind: str):
    import jax
    import numpy as np

    by_id = {d.id: d for d in jax.devices()}
    grid = np.array([by_id[i] for i in device_ids], dtype=object).reshape(shape.sizes)
    # Auto axes: the seeds' code (and pmap-style cells) rely on the compiler propagating shardings;
    # JAX 0.10's make_mesh defaults to Explicit, where plain code can raise ShardingTypeError.
    return jax.sharding.Mesh(grid, shape.names, axis_types=axis_types(kind, len(shape.names)))


def build_mesh(shape: MeshShape, selection=None, kind: str = "auto"):
    """A Mesh of `shape` over the chosen local devices (the first N by default)."""
    if selection is None:
        devices = select_devices(None, shape.size)
    else:
        devices = select_devices(selection)
        if len(devices) != shape.size:
            raise UsageError(
                f"the mesh {shape} needs {shape.size} devices but --devices chose {len(devices)}; "
                "make the product of the axis sizes equal the number of devices."
            )
    return _mesh(tuple(d.id for d in devices), shape, kind)


def single_axis(axis_name: str, selection=None):
    """The 1-D mesh of a plain `%%pmap` cell: every chosen device along one named axis."""
    devices = select_devices(selection)
    return _mesh(tuple(d.id for d in devices), MeshShape((axis_name,), (len(devices),)), "auto")
