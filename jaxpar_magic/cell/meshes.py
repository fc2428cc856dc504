"""Building device meshes for our cells: automatic axes, the devices the user chose."""
from __future__ import annotations

from functools import lru_cache

from ..errors import UsageError
from .devices import select_devices
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
    """A Mesh of `shape` over the chosen devices (all of them unless --devices says otherwise).

    The sizes must multiply to the number of devices: `jax.make_mesh((2, 2))` on 8 devices silently
    takes a subset, which is never what a demo of "all my devices" means.
    """
    import jax

    devices = select_devices(selection) if selection is not None else jax.devices()
    if len(devices) != shape.size:
        chosen = "--devices chose" if selection is not None else "JAX has"
        raise UsageError(
            f"the mesh {shape} has {shape.size} devices but {chosen} {len(devices)}. Make the axis sizes "
            f"multiply to {len(devices)} (e.g. {_suggest(shape, len(devices))}), or pick {shape.size} devices "
            f"with `--devices {shape.size}` (the first {shape.size}) or `--devices ID ID ...`."
        )
    return _mesh(tuple(d.id for d in devices), shape, kind)


def _suggest(shape: MeshShape, count: int) -> str:
    if len(shape.names) == 1:
        return f"{shape.names[0]}={count}"
    rest = count // shape.sizes[0] if count % shape.sizes[0] == 0 else None
    if rest:
        return ",".join([f"{shape.names[0]}={shape.sizes[0]}", f"{shape.names[1]}={rest}"] +
                        [f"{n}=1" for n in shape.names[2:]])
    return f"{shape.names[0]}={count}," + ",".join(f"{n}=1" for n in shape.names[1:])


def single_axis(axis_name: str, selection=None):
    """The 1-D mesh of a plain `%%pmap` cell: every chosen device along one named axis."""
    devices = select_devices(selection)
    return _mesh(tuple(d.id for d in devices), MeshShape((axis_name,), (len(devices),)), "auto")
