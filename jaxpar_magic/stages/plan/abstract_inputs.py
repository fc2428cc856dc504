"""What a plan compiles over and is held to: its inputs as abstract arrays laid out on the mesh, a
mesh the CPU compiler can compile for (or the smaller slice to plan instead), and the device memory
the plan is measured against, with a warning for a concrete input larger than a device.
"""
from __future__ import annotations

import math
import warnings

from ...errors import UsageError
from .hardware import Hardware, parse_memory_size
from .plan import PlanWarning, format_bytes

CPU_DEVICE_CEILING = 2048  # XLA's CPU backend: 4,096 devices fail with "Multiprocess computations aren't implemented"
_DATA_AXIS_NAMES = ("data", "batch", "dp", "replica", "replicas", "fsdp", "devices")


# --- inputs ------------------------------------------------------------------------------------

def abstract_inputs(args, mesh, names=None, leaf_labels=None) -> tuple[list, list[tuple[str, int]]]:
    """Each argument as ShapeDtypeStructs laid out on `mesh`, and the concrete arrays among them
    as (name, bytes). Arrays keep their sharding when it lives on the mesh's devices; anything
    without one is replicated, as running the program would place it."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    replicated = NamedSharding(mesh, P())
    mesh_devices = set(mesh.devices.flat)
    concrete: list[tuple[str, int]] = []
    abstract = []
    for index, arg in enumerate(args):
        name = names[index] if names is not None else f"argument {index}"

        def convert(path, leaf, name=name, index=index):
            if leaf_labels is not None:  # an engine's argument: a flat list of one input's leaves
                label = leaf_labels[index][path[0].idx]
            else:
                label = name + jax.tree_util.keystr(path)
            if isinstance(leaf, jax.ShapeDtypeStruct):
                if leaf.sharding is None:
                    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated, weak_type=leaf.weak_type)
                moved = on_this_mesh(leaf.sharding, mesh, mesh_devices)
                if moved is leaf.sharding:
                    return leaf
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=moved or replicated, weak_type=leaf.weak_type)
            if isinstance(leaf, jax.Array):
                concrete.append((label, int(leaf.nbytes)))
                moved = on_this_mesh(leaf.sharding, mesh, mesh_devices)
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=moved or replicated)
            if isinstance(leaf, (np.ndarray, np.generic)):
                concrete.append((label, int(leaf.nbytes)))
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)
            if isinstance(leaf, (bool, int, float, complex)):
                return leaf  # a Python number traces as a scalar and holds no memory
            raise UsageError(
                f"{label} is a {type(leaf).__name__}, neither an array nor a jax.ShapeDtypeStruct. A plan "
                f"takes arrays, or abstract arrays that hold no memory: `jaxpar_magic.plan(shape, dtype, mesh, "
                f"spec)` or `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`. Use other values as constants "
                f"the function closes over, not as inputs."
            )

        abstract.append(jax.tree_util.tree_map_with_path(convert, arg))
    return abstract, concrete


def on_this_mesh(sharding, mesh, mesh_devices=None):
    """`sharding` as it lays a value out on `mesh`: itself when it lives on the mesh's devices; the same
    PartitionSpec on `mesh` when it is a NamedSharding over a mesh of the same axes elsewhere (the
    simulated CPU mesh of a plan compiled for TPU devices); None otherwise (the caller replicates)."""
    from jax.sharding import Mesh, NamedSharding

    other = getattr(sharding, "mesh", None)
    same_axes = isinstance(sharding, NamedSharding) and other is not None and dict(other.shape) == dict(mesh.shape)
    if isinstance(sharding, NamedSharding) and not isinstance(other, Mesh):  # over an AbstractMesh: no devices
        return NamedSharding(mesh, sharding.spec) if same_axes else None
    devices = mesh_devices if mesh_devices is not None else set(mesh.devices.flat)
    if set(sharding.device_set) == devices:
        return sharding
    return NamedSharding(mesh, sharding.spec) if same_axes else None


# --- scale -------------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smaller_slice(sizes: dict[str, int], ceiling: int = CPU_DEVICE_CEILING) -> tuple[str, int, int] | None:
    """(axis, its size, a smaller size) that brings the mesh to at most `ceiling` devices by
    shrinking one axis, preferring a data-parallel one; None when no single axis can."""
    total = math.prod(sizes.values())
    needed = math.ceil(total / ceiling)

    def preference(name: str) -> tuple:
        return (name.lower() not in _DATA_AXIS_NAMES, -sizes[name])

    for name in sorted(sizes, key=preference):
        factor = next((d for d in _divisors(sizes[name]) if d >= needed), None)
        if factor is not None:
            return name, sizes[name], sizes[name] // factor
    return None


def check_scale(mesh) -> None:
    """A mesh the CPU backend can compile for, or a UsageError that says what to plan instead.

    Runs before anything is traced, so a too-large (even abstract) mesh costs nothing."""
    import jax

    sizes = {str(n): int(s) for n, s in mesh.shape.items()}
    total = math.prod(sizes.values())
    platform = mesh.devices.flat[0].platform if isinstance(mesh, jax.sharding.Mesh) else jax.default_backend()
    if platform != "cpu" or total <= CPU_DEVICE_CEILING:
        return
    layout = ", ".join(f"{n}={s}" for n, s in sizes.items())
    smaller = smaller_slice(sizes)
    if smaller is None:
        advice = (f"Plan a slice of at most {CPU_DEVICE_CEILING:,} devices whose per-device shapes are the "
                  f"same: shrink the axes that only replicate the weights, and the global batch with them.")
    else:
        axis, size, small = smaller
        factor = size // small
        which = "" if axis.lower() in _DATA_AXIS_NAMES else f" (if {axis!r} is that axis)"
        advice = (
            f"Plan a slice with the same per-device shapes instead: shrink the data-parallel axis, the one "
            f"that only splits the batch, e.g. to `{axis}={small}` (from {size}){which}, and divide the global "
            f"batch by {factor} with it. Every device then holds the same shards, so per-device memory and "
            f"FLOPs stay the same; arrays sharded over {axis!r} (FSDP weights) must shrink by {factor} too, "
            f"and collectives over {axis!r} run in groups {factor}x smaller."
        )
    raise UsageError(
        f"This mesh has {total:,} devices ({layout}), but XLA's CPU backend compiles for at most "
        f"{CPU_DEVICE_CEILING:,}: with 4,096 it fails with \"Multiprocess computations aren't implemented\". "
        f"{advice}"
    )


# --- device memory -----------------------------------------------------------------------------

def device_capacity(mesh, hardware: Hardware | None, device_memory=None) -> tuple[int | None, str | None]:
    """The device's memory and where that figure comes from: --device-memory, the hardware
    profile, or the device itself (its memory_stats' bytes_limit; simulated CPUs report none)."""
    if device_memory is not None:
        return parse_memory_size(device_memory), "--device-memory"
    if hardware is not None and hardware.memory:
        return hardware.memory, f"{hardware.name} profile"
    device = mesh.devices.flat[0]
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory statistics (and compile-only devices) raise rather than return None
        stats = None
    if stats and stats.get("bytes_limit"):
        kind = getattr(device, "device_kind", "") or "the device"
        return int(stats["bytes_limit"]), f"{kind}: memory_stats()['bytes_limit'], what XLA lets a program use"
    return None, None


def warn_concrete(concrete: list[tuple[str, int]], capacity: int | None) -> None:
    """A PlanWarning for each concrete input (`abstract_inputs`' second answer) larger than one
    device's memory: a plan needs only its shape and sharding."""
    if capacity is None:
        return
    for label, nbytes in concrete:
        if nbytes > capacity:
            warnings.warn(
                f"{label} is a concrete array of {format_bytes(nbytes)}, more than one device's "
                f"{format_bytes(capacity)}. A plan needs only its shape and sharding: make it with "
                f"`jaxpar_magic.plan(shape, dtype, mesh, spec)` (or a jax.ShapeDtypeStruct) and free this "
                f"array (`del`) to plan without holding it in memory.",
                PlanWarning,
                stacklevel=3,
            )
