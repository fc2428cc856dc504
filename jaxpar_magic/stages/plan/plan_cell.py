"""The plan stage's entry: each engine's prepared cell compiled over abstract inputs, never run
(`plan_block`, `plan_shard`, `plan_shard_map`), and their plain-Python twin
`plan_cell(source, namespace, magic="shard", ...)`, which plans a cell the way `%%shard --plan`,
`%%pmap --plan` or `%%shard_map --plan` does and returns the `Plan` (stages/plan/plan_program.py), whose numbers are
attributes to assert on in a script or a test."""
from __future__ import annotations

from ...errors import UsageError


def engine_spec(spec):
    """A spec in the form the engines take: a PartitionSpec as our tuple form, a pytree of
    PartitionSpecs as one spec per leaf (treespecs.normalize)."""
    from ...cell.treespecs import normalize

    return normalize(spec)


def plan_cell(source: str, namespace: dict, *, magic: str = "shard", mesh=None, in_specs=None, out_specs=None,
              axis_name: str = "i", devices=None, broadcast=(), split=(), merge=(), check_vma: bool = True,
              hardware=None, device_memory=None, topology: str | None = None, bind: bool = True,
              status: bool = False, compiler: str = "auto", donate=(), outputs=None):
    """Compile `source` as `magic`'s cell for its mesh without running it.

    `hardware` is a profile name ("tpu-v5e"), "custom:flops=...,hbm=...,bw=...,memory=..." or a
    `hardware.Hardware`; `device_memory` bytes or a size ("16GiB"); `topology` the physical slice
    ("4x8", see stages/plan/topology.py) the mesh is laid onto, by default as jax.make_mesh would.
    `compiler`: "auto" compiles with XLA:TPU for compile-only devices of that slice when the profile
    is a TPU, `topology` is given and libtpu is installed (stages/plan/target.py), else with XLA:CPU;
    "tpu" or "cpu" insist. With `bind`, the names the cell assigns go into `namespace` as
    ShapeDtypeStructs (plain values as they are), so the next cell can be planned from them, except
    names that hold concrete values (`bindable`): a plan never replaces data. Every assigned name is
    on the plan's `abstract`, the ones not bound on its `left_alone`. With `status`, a wait over a
    second shows a status line in the cell (the magics, whose view then takes its place); the
    plain-Python twin shows none, since nothing it returns would replace the line. `donate` (a
    %%shard cell's --donate names): inputs whose buffers the program may reuse for its outputs, planned
    with that aliasing as jax.jit's donate_argnums compiles it (the plan's `donated` names them).
    """
    import contextlib

    from ...views.progress import disabled

    with contextlib.nullcontext() if status else disabled():
        plan = _plan_cell(source, namespace, magic, mesh, in_specs, out_specs, axis_name, devices, broadcast, split,
                          merge, check_vma, hardware, device_memory, topology, compiler, tuple(donate),
                          tuple(outputs) if outputs is not None else None)
    plan.bindings, plan.left_alone = bindable(plan.abstract, namespace)
    if bind:
        namespace.update(plan.bindings)  # one step
    return plan


def is_abstract(value) -> bool:
    """A value a plan may replace: a plan's earlier output, whose leaves are ShapeDtypeStructs (at
    least one) and plain Python scalars. Anything else is the user's: arrays, objects, functions and
    classes, partials, None, and empty containers."""
    import jax

    leaves = jax.tree_util.tree_leaves(value)
    shapes = [isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves]
    return any(shapes) and all(s or type(leaf) in _PLAIN for s, leaf in zip(shapes, leaves))


_PLAIN = (bool, int, float, complex, str)


def bindable(planned: dict, namespace: dict) -> tuple[dict, tuple[str, ...]]:
    """(what a plan binds, the names it leaves alone). A name is bound when it is new or what it holds
    is abstract (is_abstract: a plan's earlier output); a name holding anything else (arrays, a model,
    numbers, a function, None) keeps it, never replaced by a stand-in."""
    bound, left = {}, []
    for name, value in planned.items():
        if name not in namespace or is_abstract(namespace[name]):
            bound[name] = value
        else:
            left.append(name)
    return bound, tuple(sorted(left))


def _plan_cell(source, namespace, magic, mesh, in_specs, out_specs, axis_name, devices, broadcast, split, merge,
               check_vma, hardware, device_memory, topology, compiler, donate=(), outputs=None):
    from .hardware import Hardware, parse_hardware, parse_memory_size
    from .target import choose
    from .topology import with_topology
    from ...cell.programs import analyse_cached

    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    elif hardware is not None and not isinstance(hardware, Hardware):
        raise UsageError(
            f"plan_cell(hardware={hardware!r}): expected a profile name such as \"tpu-v5e\" or \"h100\", a custom "
            f"profile (\"custom:flops=1e15,hbm=3.3e12,bw=4.5e11,memory=80GiB\"), or a Hardware from "
            f"jaxpar_magic.stages.plan.hardware.PROFILES.")
    if topology is not None:
        hardware = with_topology(hardware, topology)
    if isinstance(device_memory, str):
        device_memory = parse_memory_size(device_memory)
    # One analysis (and so one filename, which keys the kept compiles) per cell text: the magic's cell ends in
    # a newline that a plan_cell string usually lacks, and both must find the same kept plan.
    cell = analyse_cached(source.rstrip() + "\n", f"{magic}-plan")
    if cell.mode == "function":
        raise UsageError(
            "--plan compiles a cell's computation; this cell only defines functions. Plan a cell that calls them."
        )
    if donate and magic != "shard":
        raise UsageError(f"plan_cell(magic={magic!r}, donate={list(donate)!r}): --donate plans a %%shard cell's "
                         f"inputs given to its program; plan this cell with magic=\"shard\", or without donate.")
    if magic == "pmap":
        from ...engines.pmap import mesh_for

        target = choose(mesh_for(axis_name, devices, mesh), hardware, compiler)
        plan = plan_block(cell, namespace, target.mesh, broadcast=tuple(broadcast), split=tuple(split),
                          merge=tuple(merge), hardware=hardware, device_memory=device_memory, target=target)
    elif magic in ("shard", "shard_map"):
        from ...engines.shard import is_mesh, resolve_mesh

        in_specs = {n: engine_spec(s) for n, s in (in_specs or {}).items()}
        out_specs = {n: engine_spec(s) for n, s in (out_specs or {}).items()}
        if not is_mesh(mesh):
            mesh = resolve_mesh(mesh, namespace, [in_specs, out_specs])
        target = choose(mesh, hardware, compiler)
        if magic == "shard":
            plan = plan_shard(cell, namespace, target.mesh, in_specs, out_specs, hardware, device_memory, target,
                              donate, outputs)
        else:
            plan = plan_shard_map(cell, namespace, target.mesh, in_specs, out_specs, check_vma, hardware,
                                  device_memory, target, outputs)
    else:
        raise UsageError(f"plan_cell(magic={magic!r}): plan a 'shard', 'pmap' or 'shard_map' cell.")
    return plan


def plan_block(cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(), hardware=None,
               device_memory=None, target=None):
    """The --plan stage of a block-mode cell: its program compiled over abstract inputs (each mapped
    input one slice per device, as a global array split over the mesh), never run."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from .plan_program import plan_program
    from ...engines.pmap import prepare

    prepared = prepare(cell, namespace, mesh, broadcast=broadcast, split=split, merge=merge, abstract=True)
    per_device = NamedSharding(mesh, P(*mesh.axis_names))
    prepared.arguments = [
        a if t.name in broadcast else [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=per_device) for leaf in a]
        for t, a in zip(prepared.inputs, prepared.arguments)]
    k = len(mesh.axis_names)
    merged = NamedSharding(mesh, P(tuple(mesh.axis_names)))

    def merge_output(name, leaf):
        """--merge: the device and block axes flattened into one, split over all mesh axes."""
        if name not in merge:
            return leaf
        rows = _product(leaf.shape[:k + 1])
        return jax.ShapeDtypeStruct((rows,) + tuple(leaf.shape[k + 1:]), leaf.dtype, sharding=merged)

    return plan_program(prepared, hardware=hardware, device_memory=device_memory, set_mesh=False,
                        reshape=merge_output, target=target)


def _product(sizes) -> int:
    total = 1
    for s in sizes:
        total *= int(s)
    return total


def plan_shard(cell, namespace: dict, mesh, in_specs: dict, out_specs: dict, hardware=None,
               device_memory=None, target=None, donate=(), outputs=None):
    """The --plan stage: the same program, compiled over abstract inputs laid out by --in, never run.
    Inputs named in --in are described by their spec, not placed: nothing is allocated. `donate`
    (--donate): compiled with those inputs donated, as the run compiles them. `outputs` (--out's names):
    the only names the program returns, as in the run (the others are temporaries)."""
    from .plan_program import plan_program
    from ...engines.shard import prepare

    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, describe=True, donate=tuple(donate),
                       outputs=outputs)
    plan = plan_program(prepared, hardware=hardware, device_memory=device_memory, set_mesh=False, target=target)
    plan.donated = tuple(donate)
    return plan


def plan_shard_map(cell, namespace: dict, mesh, in_specs: dict, out_specs: dict, check_vma: bool = True,
                   hardware=None, device_memory=None, target=None, outputs=None):
    """The --plan stage: the same jit(shard_map), compiled over abstract inputs, never run; `outputs`
    (--out's names) the only names it returns, as in the run."""
    from ...errors import explaining
    from .plan_program import plan_program
    from ...engines.shard_map import prepare

    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, check_vma=check_vma, abstract=True,
                       outputs=outputs)
    with explaining(cell.filename, mesh.axis_names):  # discovering the outputs traces the cell
        program = prepared.program()
    prepared.compile = lambda record=None: program
    return plan_program(prepared, hardware=hardware, device_memory=device_memory, set_mesh=False, target=target)
