"""The `%%pmap` engine: per-device code over a mesh, as `jit(shard_map(...))` with pmap's meaning.

Plain Python, no IPython. This module is the engine's prepare step: `prepare(cell, namespace,
mesh, ...)` checks a block-mode cell against the mesh and hands every stage a PreparedCell whose
`compile()` builds the program. The stages consume it: stages/run/pmap.py runs it (and stages/run/pmap_function.py
is function mode, our `jax.pmap`), stages/plan/plan_cell.py plans it, stages/ascode/as_code.py writes it out.

pmap semantics, kept exactly:
- a mapped input carries one leading axis per mesh axis; each device sees its slice without it;
- outputs come back with those leading axes;
- `shard_map` runs with `check_vma=False`, as `jax.pmap` does on JAX 0.10. With the default
  checks, grad of a per-device loss with respect to a *replicated* input is summed across devices
  automatically, and a following `lax.pmean` makes gradients N times too large.
"""
from __future__ import annotations

from ..cell import analysis as cells
from ..cell.inputs import classify, input_arrays
from ..cell.meshes import lay_out_again
from ..cell.prepared import PreparedCell
from ..cell.programs import CellProgram, capture_outputs, cell_function
from ..errors import UsageError
from .pmap_inputs import check_same_leading, mapped_arrays


def _squeeze(k):
    import jax

    return lambda tree: jax.tree.map(lambda a: a.reshape(a.shape[k:]), tree)


def _expand(k):
    import jax
    import jax.numpy as jnp

    return lambda tree: jax.tree.map(lambda a: jnp.asarray(a).reshape((1,) * k + jnp.shape(a)), tree)


def _compile_block(cell, inputs, broadcast, mesh, namespace, record=None) -> CellProgram:
    import jax
    from jax.sharding import PartitionSpec as P

    fn = cell_function(cell, inputs, namespace)
    k = len(mesh.axis_names)
    squeeze, expand = _squeeze(k), _expand(k)
    mapped_flags = [tree.name not in broadcast for tree in inputs]
    program = CellProgram(jitted=None)
    # --collectives: `record` (the record stage's) evaluates the same cell so that every collective
    # also hands out a small preview of its input and output, as extra outputs of this one program.
    program.recording = record(fn, inputs, mesh.axis_names) if record is not None else None

    def per_device(*blocks):
        values = [squeeze(b) if mapped else b for b, mapped in zip(blocks, mapped_flags)]
        if program.recording is None:
            outs, final = fn(*values)
            return capture_outputs(outs, final, expand)
        (outs, final), records = program.recording(*values)
        return (*capture_outputs(outs, final, expand, program.recording.sites), expand(records))

    axes = P(*mesh.axis_names)
    in_specs = tuple(axes if m else P() for m in mapped_flags)
    program.jitted = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=axes, check_vma=False))
    return program


def prepare(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(),
            abstract: bool = False) -> PreparedCell:
    """The %%pmap engine's prepare step: names against the cell, mapped inputs against the mesh.

    Every array leaf of a mapped input is checked (and with --split, reshaped) to carry one slice
    per device on its leading axes; broadcast inputs go whole. With `abstract` (--plan, --as-code)
    ShapeDtypeStructs count as arrays and are reshaped without computing anything."""
    from jax.sharding import PartitionSpec as P

    broadcast, split, merge = tuple(broadcast), tuple(split), tuple(merge)
    cells.check_axis_names(cell.source, tuple(mesh.axis_names))
    inputs, constants = classify(cell, namespace, {"--broadcast": broadcast, "--split": split}, abstract)
    for name in merge:
        if name not in cell.writes:
            raise UsageError(
                f"--merge {name}: the cell does not assign {name!r}; --merge takes outputs the cell assigns "
                f"({', '.join(cell.writes) or 'none'})."
            )
    arrays = input_arrays(inputs, namespace)
    # Inputs that disagree with each other are named together, before either is held to the mesh.
    check_same_leading([(t, a) for t, a in zip(inputs, arrays) if t.name not in broadcast and t.name not in split],
                        mesh.devices.size)
    args = [a if t.name in broadcast else mapped_arrays(t, a, mesh, t.name in split) for t, a in zip(inputs, arrays)]
    mapped = tuple(P(*mesh.axis_names))
    leaf_specs = tuple((() if t.name in broadcast else mapped,) * len(a) for t, a in zip(inputs, args))
    args, moved = lay_out_again(inputs, args, leaf_specs, mesh)  # inputs on another mesh of these devices
    prepared = PreparedCell("pmap", cell, mesh, inputs, constants, args, leaf_specs,
                            options={"broadcast": broadcast, "split": split, "merge": merge}, moved=moved)
    prepared.compile = lambda record=None: _compile_block(cell, inputs, frozenset(broadcast), mesh, namespace, record)
    return prepared


def mesh_for(axis_name: str = "i", devices=None, mesh=None):
    """The mesh a cell runs over: `mesh` (a Mesh, or 'outer=2,inner=4'), else one named axis."""
    from ..cell.meshes import build_mesh, single_axis
    from ..cell.specs import MeshShape, parse_mesh_shape

    if mesh is None:
        return single_axis(axis_name, devices)
    if isinstance(mesh, (str, list)):
        mesh = parse_mesh_shape(mesh)
    if isinstance(mesh, MeshShape):
        return build_mesh(mesh, devices, "auto")  # Auto, as jax.pmap's own mesh
    return mesh




def check_block_options(in_axes=0, out_axes=0, static_broadcasted_argnums=(), donate_argnums=()) -> None:
    """pmap's function-mode arguments have no meaning for a block-mode cell (it defines no function):
    refuse them, naming what block mode spells instead, rather than drop them silently."""
    if in_axes != 0:
        raise UsageError(
            f"--in-axes {in_axes!r}: --in-axes is jax.pmap's in_axes for a cell that defines a function (function "
            f"mode). This cell runs its code on each device (block mode): every input is split along its first axis, "
            f"and `--broadcast NAME` gives an input whole to every device (in_axes=None). Write `--broadcast` with "
            f"the names to keep whole, or define a function in the cell and call it."
        )
    if out_axes != 0:
        raise UsageError(
            f"--out-axes {out_axes!r}: --out-axes is jax.pmap's out_axes for a cell that defines a function (function "
            f"mode). This cell runs its code on each device (block mode): each output comes back stacked along a new "
            f"first axis (out_axes=0), and `--merge NAME` joins that axis with the next. Move the axis afterwards "
            f"(`jnp.moveaxis(y, 0, {out_axes})`), or define a function in the cell and call it."
        )
    for flag, value in (("--static-broadcasted-argnums", static_broadcasted_argnums),
                        ("--donate-argnums", donate_argnums)):
        if value not in ((), None):
            raise UsageError(
                f"{flag} {value!r}: {flag} names a function's arguments, and this cell defines no function (block "
                f"mode). Define the function in a %%pmap cell of its own with {flag}, then call it."
            )
