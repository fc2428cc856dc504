"""The `%%shard_map` engine: the cell is the body of a `jax.shard_map`, run under `jax.jit`.

- Each name in `--in` is split by its PartitionSpec; the cell sees its block, of the same rank.
- Each name in `--out` is assembled by its spec (blocks concatenated along the dimensions the spec
  splits, one copy kept along the mesh axes it leaves out); `--out state=@specs` gives a pytree of
  specs, one per leaf of `state` or per subtree (as `jax.shard_map`'s out_specs take a pytree prefix).
- Other arrays the cell reads are replicated: every device sees them whole (passed as `P()`
  arguments rather than closed over, so no value is baked into the program).
- An assigned array without `--out` gets `P()` when JAX's varying-axes typing proves it is the same
  on every device; otherwise the cell is refused with the axes it varies over and the spec to write.

Plain Python, no IPython. `prepare(...)` hands the stages a PreparedCell: stages/run/shard_map.py runs it
(and is the twin `shard_map_cell(source, namespace, mesh=..., in_specs=..., out_specs=...)`),
stages/plan/plan_cell.py plans it, stages/ascode/as_code.py writes it out.
"""
from __future__ import annotations

import contextlib
import io
import sys

from ..cell import analysis as cells
from ..cell.inputs import classify, input_arrays
from ..cell.meshes import is_explicit, lay_out_again, on_cell_mesh
from ..cell.prepared import PreparedCell
from ..cell.programs import CellProgram, capture_outputs, cell_function, traced, within_mesh
from ..cell.treespecs import over_spec_tree, spec_names, spec_tree_of
from ..errors import UsageError
from .shard import check_outputs, check_spec, fitted, spec_mesh_axes

FINAL = "(result)"  # the final expression's name in messages and views


def varying_axes(value) -> frozenset:
    """The mesh axes over which a value traced inside shard_map may differ between devices.

    JAX types every such value with its varying manual axes (`{V:x,y}` in `jax.typeof(v)`); the
    attribute holding them is `vma` on some JAX versions and `manual_axis_type.varying` on 0.10.
    tests/test_shard_map.py fails loudly if neither exists.
    """
    import jax

    found = frozenset()
    for leaf in jax.tree.leaves(value):
        aval = jax.typeof(leaf)
        vma = getattr(aval, "vma", None)
        if vma is None:
            vma = aval.manual_axis_type.varying
        found |= frozenset(vma)
    return found


def suggested_spec(axes: frozenset, mesh, ndim: int) -> str:
    """An --out spec that keeps a value varying over `axes` apart: those axes over its dimensions."""
    ordered = [a for a in mesh.axis_names if a in axes]
    if ndim == 0:
        return "(a scalar cannot be split: reduce it with lax.psum/pmean over " + ", ".join(ordered) + ")"
    if len(ordered) <= ndim:
        entries = ordered + ["None"] * (ndim - len(ordered))
    else:  # more varying axes than dimensions: all of them over the first dimension
        entries = ["(" + ",".join(ordered) + ")"] + ["None"] * (ndim - 1)
    return ",".join(entries)


def _assigned_on(cell: cells.Cell, name: str) -> int:
    """The last line of the cell that binds `name` (where a message should point)."""
    if name == FINAL and cell.tree.body:
        return cell.tree.body[-1].lineno
    return cell.last_assigned(name)


def _check_out_spec(cell, mesh, name, spec, leaf_ndims, varies, check_vma: bool) -> None:
    where = _assigned_on(cell, name)
    for ndim in leaf_ndims:
        if len(spec) > ndim:
            raise UsageError(
                f"--out {name}: the spec has {len(spec)} entries but each device's {name!r} has {ndim} "
                f"dimension{'s' if ndim != 1 else ''} (line {where} of the cell: `{cell.line(where)}`); give at most "
                f"one entry per dimension."
            )
    used = {axis for axes in spec_mesh_axes(name, spec, mesh, "--out") for axis in axes}
    missing = sorted(varies - used, key=list(mesh.axis_names).index)
    if check_vma and missing:
        axes = _axes_text(frozenset(missing), mesh)
        ndim = max(leaf_ndims, default=0)
        raise UsageError(
            f"--out {name}: {name!r} (line {where} of the cell: `{cell.line(where)}`) can differ between devices along "
            f"{axes}, but the spec {_spec_text(spec)} leaves {'that axis' if len(missing) == 1 else 'those axes'} "
            f"out, which would keep one device's block as if all held the same. Make it the same on every device first "
            f"(`lax.psum({name}, {missing[0]!r})` or `lax.pmean`), or assemble it along {'that axis' if len(missing) == 1 else 'them'} "
            f"too, e.g. `--out {name}={suggested_spec(varies, mesh, ndim)}`. (`--no-check-vma` turns JAX's check off; then "
            f"a wrong spec gives wrong values silently.)"
        )


def _axes_text(axes: frozenset, mesh, bare: bool = False) -> str:
    names = ", ".join(repr(a) for a in mesh.axis_names if a in axes)
    if bare:
        return names
    return f"mesh axis {names}" if len(axes) == 1 else f"mesh axes {names}"


def _spec_text(spec) -> str:
    def one(entry):
        if entry is None:
            return "None"
        if isinstance(entry, str):
            return repr(entry)
        return "(" + ", ".join(repr(e) for e in entry) + ")"

    return "P(" + ", ".join(one(e) for e in spec) + ")"


def _leaf_specs(given, value, leaves: list) -> "list[tuple] | str":
    """`--out name=@specs`: the spec (our tuple form) of each traced leaf of `value`, in the order the
    program returns them (`leaves`, the same tracers), from the pytree of specs `given` (the output's
    structure, or a prefix of it); where the structures do not match, what JAX says about it."""
    import jax

    spec_of: dict[int, tuple] = {}

    def cover(path, entries, subtree):
        for leaf in jax.tree.leaves(subtree):
            spec_of[id(leaf)] = entries

    try:
        over_spec_tree(cover, given, value)
    except (ValueError, TypeError) as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    missing = [k for k, leaf in enumerate(leaves) if id(leaf) not in spec_of]
    return f"leaf {missing[0]} has no spec" if missing else [spec_of[id(leaf)] for leaf in leaves]


def _checked_leaf_specs(cell, mesh, name: str, per_leaf, leaves: list, check_vma: bool) -> list[tuple]:
    """Each leaf's spec from `--out name=@specs`, checked as a single --out spec is, leaf by leaf."""
    if isinstance(per_leaf, str):
        raise UsageError(
            f"--out {name}: the specs' structure does not match what the cell assigns to {name!r} ({per_leaf}). Give "
            f"a pytree with {name!r}'s structure (or a prefix of it) whose leaves are PartitionSpecs, e.g. "
            f"`jax.tree.map(lambda leaf: P(), {name})`, or one spec for every leaf (`{name}=data,None`)."
        )
    for spec, (varies, ndim) in zip(per_leaf, leaves):
        _check_out_spec(cell, mesh, name, spec, [ndim], varies, check_vma)
    return list(per_leaf)


def _chosen_specs(cell, mesh, found: dict, out_specs: dict, check_vma: bool, probed) -> tuple[dict, object]:
    """Each output's spec: its --out spec (checked against what it varies over), else P() when JAX's
    varying-axes typing proves it the same on every device; anything else is a UsageError that says
    the spec to write (`probed`: the probe's CellTrace). Returns (name -> spec entries, the final
    expression's PartitionSpec or None)."""
    from jax.sharding import PartitionSpec as P

    final_spec = None
    chosen = {}
    for name, (varies, ndims, leaves, per_leaf) in found.items():
        if name in out_specs and not isinstance(out_specs[name], tuple):  # a pytree of specs: one per leaf
            chosen[name] = _checked_leaf_specs(cell, mesh, name, per_leaf, leaves, check_vma)
        elif name in out_specs:
            _check_out_spec(cell, mesh, name, out_specs[name], ndims, varies, check_vma)
            chosen[name] = out_specs[name]
        elif not check_vma:
            raise UsageError(
                f"{name!r} is computed on the devices but has no --out spec, and with --no-check-vma JAX cannot prove it "
                f"is the same on every device. Say how to assemble it, e.g. `--out {name}="
                f"{suggested_spec(frozenset(mesh.axis_names), mesh, max(ndims, default=0))}` (or `{name}=None` if it "
                f"is the same everywhere)." if name != FINAL else
                "the cell's final expression is computed on the devices, and with --no-check-vma JAX cannot prove it is "
                "the same on every device. Assign it to a name and give that name an --out spec."
            )
        elif varies:
            where = _assigned_on(cell, name)
            axes = _axes_text(varies, mesh)
            if name == FINAL:
                raise UsageError(
                    f"the cell's final expression (line {where}: `{cell.line(where)}`) differs between devices along "
                    f"{axes}, so it has no single value to return. Assign it to a name and give it an --out "
                    f"spec, e.g. `total = ...` with `--out total={suggested_spec(varies, mesh, max(ndims, default=0))}`."
                )
            raise UsageError(
                f"{name!r} (line {where} of the cell: `{cell.line(where)}`) differs between devices along "
                f"{axes}: JAX's varying-axes typing tracks that, and it cannot be returned as one replicated value. "
                f"Say how to assemble its blocks with `--out {name}={suggested_spec(varies, mesh, max(ndims, default=0))}`, "
                f"make it the same everywhere with `lax.psum`/`lax.pmean` over {_axes_text(varies, mesh, bare=True)}, "
                f"or, if it is a per-device temporary, list what the cell returns with --out (the names it leaves out "
                f"are not returned)."
            )
        else:
            chosen[name] = ()  # proven the same on every device: P()
        if name == FINAL:
            final_spec = P(*chosen.pop(FINAL))
    for name in out_specs:
        if name not in found and name in cell.writes and name not in probed.static_outputs:
            raise cells.unbound_output(cell, name)  # assigned, then deleted
        if name not in found:
            why = ("is a plain Python value, not computed on the devices" if name in probed.static_outputs
                   else "is not assigned by the cell")
            raise UsageError(
                f"--out {name}: {name!r} {why}; --out assembles arrays the cell computes "
                f"({', '.join(n for n in found if n != FINAL) or 'none'})."
            )
    return chosen, final_spec


def _compile(cell, inputs, specs, out_specs, namespace, mesh, check_vma, record=None, outputs=None) -> CellProgram:
    """Discover what the cell returns (a trace without running), then build jit(shard_map)."""
    import jax
    from jax.sharding import PartitionSpec as P

    fn = cell_function(cell, inputs, namespace, outputs=outputs)
    program = CellProgram(jitted=None)
    program.recording = record(fn, inputs, mesh.axis_names) if record is not None else None  # --collectives
    found: dict = {}  # name -> (varying axes, leaf ndims, (axes, ndim) per leaf, --out @specs per leaf)
    probed = []  # the probe's CellTrace: which outputs the devices compute, for these input shapes

    def probe(*blocks):
        outs, final = fn(*blocks)
        device, final_value, trace = capture_outputs(outs, final, lambda v: v)
        probed[:] = [trace]
        for name, value in list(device.items()) + ([(FINAL, final_value)] if traced(final) else []):
            leaves = jax.tree.leaves(value)
            given = out_specs.get(name) if name != FINAL else None
            found[name] = (varying_axes(value) if check_vma else frozenset(), [leaf.ndim for leaf in leaves],
                           [(varying_axes(leaf) if check_vma else frozenset(), leaf.ndim) for leaf in leaves],
                           None if given is None or isinstance(given, tuple) else _leaf_specs(given, outs[name], leaves))
        return ()

    in_specs = tuple([P(*s) for s in leaf_specs] for leaf_specs in specs)  # per input, one spec per leaf
    explicit = is_explicit(mesh)

    def on_blocks(mapped):
        def whole(*args):
            with within_mesh(mesh):
                if explicit:  # Explicit axes: inputs must already carry the spec shard_map is given
                    args = [jax.reshard(a, s) for a, s in zip(args, in_specs)]
                return mapped(*args)
        return whole

    args = [[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays] for arrays in input_arrays(inputs, namespace)]
    # The probe traces the cell once more than plain JAX would: what it prints is printed by the real
    # trace that follows (once, as jit(shard_map) prints it), unless the probe or the checks fail first.
    with on_cell_mesh(mesh), printed_only_on_error():
        jax.eval_shape(on_blocks(jax.shard_map(probe, mesh=mesh, in_specs=in_specs, out_specs=(),
                                               check_vma=check_vma)), *args)
        chosen, final_spec = _chosen_specs(cell, mesh, found, out_specs, check_vma, probed[0])

    device_specs = {n: P(*chosen[n]) if isinstance(chosen[n], tuple) else [P(*s) for s in chosen[n]]
                    for n in probed[0].device_outputs}  # a list: one spec per leaf (--out name=@specs)

    k = len(mesh.axis_names)

    def body(*blocks):
        if program.recording is None:
            outs, final = fn(*blocks)
            return capture_outputs(outs, final, lambda v: v)
        (outs, final), records = program.recording(*blocks)
        stacked = jax.tree.map(lambda a: a.reshape((1,) * k + a.shape), records)  # one row per device
        return (*capture_outputs(outs, final, lambda v: v, program.recording.sites), stacked)

    result_specs = (device_specs, final_spec if final_spec is not None else P(), P())  # P(): the leafless CellTrace
    if program.recording is not None:
        result_specs += (P(*mesh.axis_names),)
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=result_specs, check_vma=check_vma)
    program.jitted = jax.jit(on_blocks(mapped))
    program.assembled = {n: chosen[n] for n in probed[0].device_outputs}  # a tuple, or a list of one per leaf
    return program


@contextlib.contextmanager
def printed_only_on_error():
    """What the code inside prints is held back, and written out only if it raises."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stdout(held):
            yield
    except BaseException:
        sys.stdout.write(held.getvalue())
        raise


def prepare(cell: cells.Cell, namespace: dict, mesh, in_specs: dict, out_specs: dict, *, check_vma: bool = True,
            abstract: bool = False, outputs=None) -> PreparedCell:
    """The %%shard_map engine's prepare step: names and specs against the cell and the mesh, one block
    spec per leaf of each input (inputs not in --in are replicated: P()), and the arguments (with
    `abstract`, for --plan, ShapeDtypeStructs laid out by those specs)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ..cell.treespecs import leaf_specs

    cells.check_axis_names(cell.source, tuple(mesh.axis_names))
    inputs, constants = classify(cell, namespace, {"--in": tuple(in_specs)}, abstract)
    specs, args = [], []
    for tree, arrays in zip(inputs, input_arrays(inputs, namespace)):
        value = namespace[tree.name]
        if tree.name not in in_specs:
            per_leaf = ((),) * len(tree.positions)
        else:
            per_leaf = tuple(fitted(() if spec is None else spec, leaf)  # None: a leaf --in's paths leave whole
                             for spec, leaf in zip(leaf_specs(tree, value, in_specs[tree.name], namespace,
                                                              arrays=arrays), arrays))
            for index, (leaf, spec) in enumerate(zip(arrays, per_leaf)):
                check_spec(tree.label(index), tuple(leaf.shape), spec, mesh, "--in")
        if abstract:
            arrays = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, P(*spec)))
                      for leaf, spec in zip(arrays, per_leaf)]
        specs.append(per_leaf)
        args.append(arrays)
    args, moved = lay_out_again(inputs, args, specs, mesh)  # inputs on another mesh of these devices
    for name, spec in out_specs.items():
        if name not in cell.writes:
            raise UsageError(
                f"--out {name}: the cell does not assign {name!r}; --out assembles names the cell assigns "
                f"({', '.join(cell.writes) or 'none'})."
            )
    check_outputs(cell, outputs)
    specs = tuple(specs)
    # `@specs` (or a pytree given to the twin) read now: one spec per leaf of the output, or per subtree
    trees = {name: spec if isinstance(spec, tuple) else spec_tree_of(spec, namespace, name, "--out")
             for name, spec in out_specs.items()}
    read = constants + spec_names(in_specs) + spec_names(out_specs)
    prepared = PreparedCell("shard_map", cell, mesh, inputs, read, args, specs,
                            dict(out_specs), {"check_vma": check_vma, "outputs": outputs}, moved=moved)
    prepared.compile = lambda record=None: _compile(cell, inputs, specs, trees, namespace, mesh, check_vma,
                                                    record, outputs)
    return prepared


def check_cell(cell: cells.Cell, in_specs: dict, out_specs: dict) -> None:
    """What a %%shard_map line and cell must be before anything is traced."""
    if cell.mode == "function":
        raise UsageError(
            "%%shard_map runs the cell as the body of a shard_map over blocks of named arrays; this cell only defines "
            "functions. Call them from a %%shard_map cell whose --in names the arrays to split, or decorate them "
            "yourself with `jax.shard_map(f, mesh=mesh, in_specs=..., out_specs=...)`."
        )
    for name, spec in list(in_specs.items()) + list(out_specs.items()):
        if isinstance(spec, tuple) and any(isinstance(e, int) for e in spec):
            raise UsageError(
                f"{name}: a device count in a spec builds its own 1-D mesh in %%shard; %%shard_map names the mesh's axes. "
                "Pass `--mesh devices=8` and write the axis name instead."
            )


