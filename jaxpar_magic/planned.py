"""The plain-Python twin of `--plan`: `plan_cell(source, namespace, magic="shard", ...)` plans a cell
the way `%%shard --plan`, `%%pmap --plan` or `%%shard_map --plan` does and returns the `Plan`
(planning.py), whose numbers are attributes to assert on in a script or a test."""
from __future__ import annotations

from .errors import UsageError


def engine_spec(spec):
    """A spec in the form the engines take: a PartitionSpec as our tuple form, a pytree of
    PartitionSpecs as one spec per leaf (treespecs.normalize)."""
    from .treespecs import normalize

    return normalize(spec)


def plan_cell(source: str, namespace: dict, *, magic: str = "shard", mesh=None, in_specs=None, out_specs=None,
              axis_name: str = "i", devices=None, broadcast=(), split=(), merge=(), check_vma: bool = True,
              hardware=None, device_memory=None, topology: str | None = None, bind: bool = True,
              status: bool = False):
    """Compile `source` as `magic`'s cell for its mesh without running it.

    `hardware` is a profile name ("tpu-v5e"), "custom:flops=...,hbm=...,bw=...,memory=..." or a
    `hardware.Hardware`; `device_memory` bytes or a size ("16GiB"); `topology` the physical slice
    ("4x8", see topology.py) the mesh is laid onto, by default as jax.make_mesh would. With `bind`, the names the cell
    assigns go into `namespace` as ShapeDtypeStructs (plain values as they are), so the next cell
    can be planned from them. With `status`, a wait over a second shows a status line in the cell
    (the magics, whose view then takes its place); the plain-Python twin shows none, since nothing
    it returns would replace the line.
    """
    import contextlib

    from .progress import disabled

    with contextlib.nullcontext() if status else disabled():
        return _plan_cell(source, namespace, magic, mesh, in_specs, out_specs, axis_name, devices, broadcast, split,
                          merge, check_vma, hardware, device_memory, topology, bind)


def _plan_cell(source, namespace, magic, mesh, in_specs, out_specs, axis_name, devices, broadcast, split, merge,
               check_vma, hardware, device_memory, topology, bind):
    from .hardware import parse_hardware, parse_memory_size
    from .topology import with_topology
    from .runner import analyse_cached

    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    if topology is not None:
        hardware = with_topology(hardware, topology)
    if isinstance(device_memory, str):
        device_memory = parse_memory_size(device_memory)
    cell = analyse_cached(source, f"{magic}-plan")
    if cell.mode == "function":
        raise UsageError(
            "--plan compiles a cell's computation; this cell only defines functions. Plan a cell that calls them."
        )
    if magic == "pmap":
        from .pmapping import mesh_for, plan_block

        plan = plan_block(cell, namespace, mesh_for(axis_name, devices, mesh), broadcast=tuple(broadcast),
                          split=tuple(split), merge=tuple(merge), hardware=hardware, device_memory=device_memory)
    elif magic in ("shard", "shard_map"):
        from .shard import is_mesh, resolve_mesh

        in_specs = {n: engine_spec(s) for n, s in (in_specs or {}).items()}
        out_specs = {n: engine_spec(s) for n, s in (out_specs or {}).items()}
        if not is_mesh(mesh):
            mesh = resolve_mesh(mesh, namespace, [in_specs, out_specs])
        if magic == "shard":
            from .shard import plan_shard

            plan = plan_shard(cell, namespace, mesh, in_specs, out_specs, hardware, device_memory)
        else:
            from .shardmap import plan_shard_map

            plan = plan_shard_map(cell, namespace, mesh, in_specs, out_specs, check_vma, hardware, device_memory)
    else:
        raise UsageError(f"plan_cell(magic={magic!r}): plan a 'shard', 'pmap' or 'shard_map' cell.")
    if bind:
        namespace.update(plan.bindings)  # one step
    return plan
