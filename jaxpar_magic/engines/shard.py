"""The `%%shard` engine: place named inputs with PartitionSpecs, compile the cell's code unchanged
under `jax.jit` with the mesh set, and let the compiler partition the work. `prepare(...)` hands the
stages a PreparedCell; stages/run/shard.py runs it, stages/plan/plan_cell.py plans it, stages/ascode/as_code.py writes it out.

Also the plain-Python twins of `%mesh` and `%sharding`: `make_mesh`, `place`, `plan`.
"""
from __future__ import annotations

from ..cell import analysis as cells
from ..cell.inputs import TreeInput, classify, input_arrays
from ..cell.layout import spec_axes
from ..cell.meshes import UnderMesh, is_explicit, lay_out_again, needs_the_mesh_set
from ..cell.prepared import PreparedCell
from ..cell.programs import CellProgram, capture_outputs, cell_function, within_mesh
from ..cell.specs import MeshShape, SpecTree, parse_mesh_shape
from ..cell.treespecs import spec_names
from ..errors import UsageError

AUTO_AXIS = "devices"  # the axis of the 1-D mesh that `NAME=8` ("split over 8 devices") builds
# That mesh's axis type: Auto. `NAME=8` and split() stand in for the old PositionalSharding, whose
# arrays the compiler laid out on its own; the --as-code snippet writes the type out.
COUNT_AXIS_TYPE = "auto"


# --- meshes ------------------------------------------------------------------------------------

#: The most positions an abstract mesh may have: its view lists every position (mesh_state), so this
#: bounds what one view sends (~0.5 MB of ids), well above any planned layout the course or the
#: tests use (4,096 positions, the sharding chapter's).
MAX_ABSTRACT_POSITIONS = 65_536


def make_mesh(shape: str | MeshShape, devices=None, axis_types: str | None = None, abstract: bool = False):
    """Plain-Python twin of `%mesh data=4 model=2`: a Mesh over exactly the devices asked for.

    Its axes are of the type `axis_types` ("auto", "explicit", "manual"); by default what
    `jax.make_mesh` gives on the installed JAX (Explicit on 0.10), so a mesh made here behaves as the
    same line in plain JAX would.
    """
    from ..cell.meshes import axis_types as types_of, build_mesh

    if isinstance(shape, str):
        shape = parse_mesh_shape(shape, "%mesh")
    if abstract:
        import jax

        if shape.size > MAX_ABSTRACT_POSITIONS:
            axes = " ".join(f"{n}={s}" for n, s in zip(shape.names, shape.sizes))
            raise UsageError(
                f"%mesh {axes} --abstract: {shape.size:,} positions; an abstract mesh here has at most "
                f"{MAX_ABSTRACT_POSITIONS:,} (its view lists every position). Use smaller axis sizes.")
        return jax.sharding.AbstractMesh(shape.sizes, shape.names, axis_types=types_of(axis_types, len(shape.names)))
    return build_mesh(shape, devices, axis_types)


def is_mesh(value) -> bool:
    import jax

    return isinstance(value, (jax.sharding.Mesh, jax.sharding.AbstractMesh))


def _mesh_sizes(mesh) -> dict[str, int]:
    return {str(n): int(s) for n, s in mesh.shape.items()}  # Mesh and AbstractMesh alike


# --- specs against a mesh and a shape ----------------------------------------------------------

def spec_mesh_axes(name: str, spec: tuple, mesh, option: str) -> list[tuple[str, ...]]:
    """The mesh axes of each entry of `spec`, each an axis of `mesh` used once, or a UsageError."""
    sizes = _mesh_sizes(mesh)
    used = set()
    per_dim = spec_axes(spec, len(spec))
    for axes in per_dim:
        for axis in axes:
            if axis not in sizes:
                raise UsageError(
                    f"{option} {name}: {axis!r} is not an axis of the mesh (its axes are "
                    f"{', '.join(f'{a}={s}' for a, s in sizes.items())}); use one of those names, or None."
                )
            if axis in used:
                raise UsageError(f"{option} {name}: mesh axis {axis!r} is used twice; each mesh axis may split one dimension.")
            used.add(axis)
    return per_dim


def check_cell(cell: cells.Cell, magic: str = "%%shard") -> None:
    """A %%shard cell computes: one that only defines functions is refused with what to do."""
    if cell.mode == "function":
        raise UsageError(
            f"{magic} runs code on sharded data; this cell only defines functions. Define them in a normal cell "
            f"and call them from the {magic} cell (the computation code stays unchanged)."
        )


def check_spec(name: str, shape: tuple, spec: tuple, mesh, option: str = "--in") -> None:
    """A spec fits a shape on a mesh, or a UsageError says which dimension and what to change."""
    sizes = _mesh_sizes(mesh)
    if len(spec) > len(shape):
        raise UsageError(
            f"{option} {name}: the spec has {len(spec)} entries but {name!r} has shape {shape} ({len(shape)} "
            f"dimension{'s' if len(shape) != 1 else ''}); give at most one entry per dimension."
        )
    for dim, axes in enumerate(spec_mesh_axes(name, spec, mesh, option)):
        count = 1
        for axis in axes:
            count *= sizes[axis]
        if count > 1 and shape[dim] % count:
            raise UsageError(
                f"{option} {name}: dimension {dim} of {name!r} has {shape[dim]} elements, which does not divide "
                f"over {' x '.join(f'{a}={sizes[a]}' for a in axes)} = {count} devices. Pick a mesh axis whose size "
                f"divides {shape[dim]}, leave that dimension unsplit (None), or pad/trim it to a multiple of {count}."
            )


def resolve_mesh(mesh_arg, namespace: dict, specs: list[dict]):
    """The mesh of a %%shard cell: a Mesh by name, an inline `data=4,model=2`, or the 1-D mesh that
    `NAME=8` asks for; with none given, the mesh `jax.set_mesh` set, else the namespace's `mesh`."""
    counted = [(n, e) for d in specs for n, spec in d.items() if isinstance(spec, tuple) for e in spec
               if isinstance(e, int)]
    counts = {e for _, e in counted}
    if mesh_arg:
        if isinstance(mesh_arg, (list, tuple)):
            mesh_arg = " ".join(mesh_arg)
        text = str(mesh_arg)
        if isinstance(mesh_arg, MeshShape) or "=" in text:  # inline, with %mesh's options (cell/specs.InlineMesh)
            shape = mesh_arg if isinstance(mesh_arg, MeshShape) else parse_mesh_shape(text, "--mesh")
            mesh = make_mesh(shape, getattr(shape, "devices", None), getattr(shape, "axis_types", None),
                             getattr(shape, "abstract", False))
        elif text in namespace and is_mesh(namespace[text]):
            mesh = namespace[text]
        else:
            raise UsageError(
                f"--mesh {text}: no mesh called {text!r} in your namespace. Build one with `%mesh data=8` (it binds "
                f"`mesh`), or describe it inline: `--mesh data=4,model=2`."
            )
        if counted:
            name, count = counted[0]
            raise UsageError(
                f"--in {name}={count}: a device count builds its own 1-D mesh, so it does not go with --mesh. Either "
                f"drop --mesh, or name an axis of the mesh ({', '.join(mesh.axis_names)}) instead, e.g. "
                f"`{name}={mesh.axis_names[0]}`."
            )
        return mesh
    if counts:
        if len(counts) > 1:
            raise UsageError(f"device counts in specs disagree ({sorted(counts)}); split every array over the same number of devices.")
        import jax

        count = counts.pop()
        have = len(jax.devices())
        if not 1 <= count <= have:
            name = next(n for n, e in counted if e == count)
            raise UsageError(
                f"--in {name}={count}: JAX has {have} device(s), so an array can be split over 1 to {have} "
                f"of them; use `{name}={have}` for all of them."
            )
        return make_mesh(MeshShape((AUTO_AXIS,), (count,)), devices=None if count == len(jax.devices()) else count,
                         axis_types=COUNT_AXIS_TYPE)
    from ..cell.meshes import default_mesh

    found = default_mesh(namespace)  # the mesh jax.set_mesh set, else the namespace's `mesh`
    if found is not None:
        return found
    raise UsageError(
        "%%shard needs a mesh: pass `--mesh NAME` (a Mesh from `%mesh data=8`), `--mesh data=8` inline, set one "
        "with `jax.set_mesh(mesh)`, or split over N devices without naming axes with `--in x=8`."
    )


def with_auto_axis(spec: tuple) -> tuple:
    return tuple(AUTO_AXIS if isinstance(e, int) else e for e in spec)


def fitted(spec: tuple, leaf) -> tuple:
    """A leaf's spec: device counts named by the auto axis; a spec of `None`s only (replicated) fits
    any rank, so `--in opt_state=None` replicates every leaf of a pytree, its scalars too. A spec that
    shards and is longer than the leaf's rank (`a=data,None,None` of a vector) is still the mistake
    check_spec names. None (a leaf --in's paths leave alone) stays None: the leaf as it is laid out."""
    if spec is None:
        return None
    spec = with_auto_axis(spec)
    ndim = len(getattr(leaf, "shape", ()))
    if len(spec) > ndim and all(e is None for e in spec):
        return spec[:ndim]
    return spec


def place(value, mesh, spec, name: str = "value", namespace: dict | None = None, option: str = "place()"):
    """Put `value` on `mesh` laid out by `spec` (a PartitionSpec or our tuple form): an array, or any
    pytree (each array leaf gets `spec`; or give a pytree of specs, one per leaf). Leaves already laid
    out so are not moved; the value comes back with its own type (a Flax NNX object is laid out in
    place, as `nnx.update` does, and returned)."""
    from ..cell.inputs import TreeInput
    from ..cell.treespecs import normalize

    spec = normalize(spec)
    tree = TreeInput.of(name, value)
    if tree is None:
        raise UsageError(
            f"place({name}): {name!r} is a {type(value).__name__} with no array leaves; there is nothing to lay out."
        )
    placed = place_leaves(tree, tree.arrays(value), value, mesh, spec, namespace or {}, option)
    if tree.graphdef is None:
        return tree.rebuild(placed)
    from ..cell import nnx_graphs

    slotted = tree.tree_of(placed)  # the user's own NNX objects, laid out in place as `nnx.update` does
    nnx_graphs.write([value], nnx_graphs.joint_state([slotted]))
    return nnx_graphs.with_objects(slotted, nnx_graphs.nodes_of([value]))


def place_leaves(tree, arrays, value, mesh, spec, namespace, option: str = "--in") -> list:
    """Each traced leaf of an input placed by its spec (the leaf itself when it is already there)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ..cell.treespecs import leaf_specs

    placed = []
    for index, (leaf, leaf_spec) in enumerate(zip(arrays, leaf_specs(tree, value, spec, namespace, option,
                                                                      arrays=arrays))):
        leaf_spec = fitted(leaf_spec, leaf)
        if leaf_spec is None:  # a leaf --in's paths leave alone: as it is laid out
            placed.append(leaf)
            continue
        check_spec(tree.label(index), tuple(leaf.shape), leaf_spec, mesh, option)
        target = NamedSharding(mesh, P(*leaf_spec))
        placed.append(leaf if isinstance(leaf, jax.Array) and leaf.sharding == target else
                      _put(leaf, target, tree.label(index), option))
    return placed


def _put(leaf, target, label: str, option: str):
    """jax.device_put, with JAX's ShardingTypeError for a leaf whose type still names an Explicit
    mesh's axes (made there, then moved to one device) said as the fix."""
    import jax

    try:
        return jax.device_put(leaf, target)
    except Exception as err:
        if type(err).__name__ != "ShardingTypeError":  # jax._src.core's; no public name to catch it by
            raise
        kind = jax.typeof(leaf)
        raise UsageError(
            f"{option} {label}: its type {kind} still names the axes of the Explicit mesh it was made on (`@` marks "
            f"them), though its data has moved since ({type(leaf.sharding).__name__}), so JAX cannot lay it out "
            f"again (plain jax.device_put raises the same ShardingTypeError). Make it afresh from its values, "
            f"`{label} = jnp.asarray(np.asarray({label}))`, or lay the original out on its own mesh instead of moving it "
            f"to one device (`jax.reshard(a, P())`, or `jax.device_put(a, NamedSharding(mesh, P()))`)."
        ) from None


def plan(shape, dtype, mesh, spec):
    """An abstract array (no memory) laid out by `spec`: plan a 4,096-device layout on a laptop."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    spec = with_auto_axis(tuple(spec))
    check_spec("the planned array", tuple(shape), spec, mesh, "plan():")
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=NamedSharding(mesh, P(*spec)))


def split(value, devices: int | None = None, axis: int = 0):
    """The one-liner for PositionalSharding's users: split `axis` over `devices` devices (all by default)."""
    import jax

    count = devices or len(jax.devices())
    spec = (None,) * axis + (count,)
    mesh = make_mesh(MeshShape((AUTO_AXIS,), (count,)), devices=None if count == len(jax.devices()) else count,
                     axis_types=COUNT_AXIS_TYPE)
    return place(value, mesh, spec, option="split()")


# --- the cell's program ------------------------------------------------------------------------

def check_outputs(cell: cells.Cell, outputs) -> None:
    """Each name --out lists is one the cell assigns."""
    for name in outputs or ():
        if name not in cell.writes:
            raise UsageError(
                f"--out {name}: the cell does not assign {name!r}; --out lists what the cell returns, among the names "
                f"it assigns ({', '.join(cell.writes) or 'none'})."
            )


def _compile(cell, inputs, namespace, mesh, out_specs, outputs=None, donate=(), sources=None) -> CellProgram:
    """`sources`: name -> how the line wrote an output's spec tree (`@specs`), for its messages."""
    sources = sources or {}
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    donated = tuple(i for i, tree in enumerate(inputs) if tree.name in donate)
    fn = cell_function(cell, inputs, namespace, write_back=True,
                       donated=any(inputs[i].graphdef is not None for i in donated), outputs=outputs)

    # --out on Explicit axes is a reshard (with_sharding_constraint only asserts the layout there).
    constrain = jax.reshard if is_explicit(mesh) else jax.lax.with_sharding_constraint

    def constrained(name, value, spec):
        """The output laid out by its --out spec (one for every leaf, or a pytree of specs matching the
        output or a prefix of it), each traced leaf checked as --in checks an input: JAX would silently
        replicate a dimension the spec's axes do not divide."""
        from ..cell.treespecs import over_spec_tree, spec_tree_mismatch

        def one(path, leaf, entries):
            if not isinstance(leaf, jax.core.Tracer):
                return leaf
            check_spec(name + jax.tree_util.keystr(path), tuple(leaf.shape), entries, mesh, "--out")
            return constrain(leaf, NamedSharding(mesh, P(*entries)))

        if isinstance(spec, tuple):
            return jax.tree_util.tree_map_with_path(lambda path, leaf: one(path, leaf, spec), value)

        def subtree(prefix, entries, sub):
            return jax.tree_util.tree_map_with_path(lambda path, leaf: one(prefix + path, leaf, entries), sub)

        try:
            return over_spec_tree(subtree, spec, value)
        except (ValueError, TypeError) as err:  # the spec tree's structure is not a prefix of the output's
            raise spec_tree_mismatch("--out", name, sources.get(name, "the specs"), err) from None

    def whole_program(*args):
        with within_mesh(mesh):
            outs, final = fn(*args)
            for name in (*(outputs or ()), *out_specs):
                if name not in outs:  # assigned, then deleted: never silently bind nothing
                    raise cells.unbound_output(cell, name)
            for name, spec in out_specs.items():
                outs[name] = constrained(name, outs[name], spec)
            return capture_outputs(outs, final, lambda v: v)

    # --donate: as jax.jit(donate_argnums=...), one argument (the list of its leaves) per input.
    program = CellProgram(jitted=jax.jit(whole_program, donate_argnums=donated) if donated else jax.jit(whole_program),
                          donated=donated)
    if needs_the_mesh_set(mesh):  # Explicit axes: called with the mesh set, as plain JAX must be
        program.jitted = UnderMesh(program.jitted, mesh)
    return program


def check_donated(donate, inputs) -> None:
    """Each name --donate gives is an input the cell reads (its buffers are what is donated)."""
    names = [tree.name for tree in inputs]
    for name in donate:
        if name not in names:
            raise UsageError(
                f"--donate {name}: the cell does not read {name!r} as an input; --donate names inputs whose buffers "
                f"the cell's program may reuse for its outputs, as jax.jit's donate_argnums does (this cell's inputs: "
                f"{', '.join(names) or 'none'})."
            )


def _check_names(cell, namespace, mesh, in_specs, out_specs, abstract=False):
    """Inputs and outputs named on the line against the cell and the mesh; returns (inputs,
    constants, out specs with device counts turned into the auto axis)."""
    inputs, constants = classify(cell, namespace, abstract=abstract)
    names = [t.name for t in inputs]
    for name, spec in in_specs.items():
        if name not in namespace:
            raise UsageError(f"--in {name}: {name!r} is not defined; --in names arrays (or pytrees of arrays) from "
                             f"your namespace.")
        if name not in names:
            if TreeInput.of(name, namespace[name], abstract=True) is None:
                raise UsageError(
                    f"--in {name}: {name!r} is a {type(namespace[name]).__name__}, not an array or a pytree of arrays "
                    f"(it has no array leaves), so there is nothing to shard. Convert it first "
                    f"(`{name} = jnp.asarray({name})`) or drop it from --in."
                )
            raise UsageError(
                f"--in {name}: the cell does not read {name!r} before assigning it; --in names the cell's inputs "
                f"({', '.join(names) or 'none'})."
            )
    out_specs = {n: with_auto_axis(s) if isinstance(s, tuple) else s for n, s in out_specs.items()}
    for name in out_specs:
        if name not in cell.writes:
            raise UsageError(
                f"--out {name}: the cell does not assign {name!r}; --out constrains names the cell assigns "
                f"({', '.join(cell.writes) or 'none'})."
            )
        if isinstance(out_specs[name], tuple):  # a pytree of specs (@NAME) is checked leaf by leaf when traced
            spec_mesh_axes(name, out_specs[name], mesh, "--out")  # axes of the mesh, each used once, as --in
    # `@NAME` specs, --in's and --out's, are read on every run: a re-run after `specs = ...` compiles anew.
    return inputs, constants + spec_names(in_specs) + spec_names(out_specs), out_specs


def _out_spec_trees(out_specs: dict, namespace: dict) -> dict:
    """--out specs with each `@NAME` (or a pytree given to the twin) read from the namespace: one spec
    per leaf of the output, or per subtree where the spec tree is a prefix of it."""
    from ..cell.treespecs import spec_tree_of

    return {name: spec if isinstance(spec, tuple) else spec_tree_of(spec, namespace, name, "--out")
            for name, spec in out_specs.items()}


def prepare(cell: cells.Cell, namespace: dict, mesh, in_specs: dict, out_specs: dict, *,
            describe: bool = False, abstract: bool | None = None, outputs=None, donate=()) -> PreparedCell:
    """The %%shard engine's prepare step: names and specs against the cell and the mesh, and each
    input's leaves as the program takes them: placed by --in (a run), or, with `describe` (--plan,
    --as-code), ShapeDtypeStructs laid out by --in, so nothing is allocated or moved. `abstract`
    (default: `describe`) lets inputs be ShapeDtypeStructs themselves (--plan). `outputs` (--out's
    names): the only names the cell returns; None, all it assigns. `donate` (--donate): inputs whose
    buffers the program may reuse, as jax.jit's donate_argnums."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ..cell.treespecs import leaf_specs

    check_outputs(cell, outputs)
    abstract = describe if abstract is None else abstract
    inputs, constants, out_specs = _check_names(cell, namespace, mesh, in_specs, out_specs, abstract=abstract)
    args, specs = [], []
    for tree, arrays in zip(inputs, input_arrays(inputs, namespace)):
        value = namespace[tree.name]
        if tree.name not in in_specs:
            args.append(arrays)
            specs.append((None,) * len(arrays))
            continue
        per_leaf = [fitted(spec, leaf) for spec, leaf in zip(leaf_specs(tree, value, in_specs[tree.name], namespace,
                                                                        arrays=arrays), arrays)]
        if describe:  # (a leaf whose spec is None, left alone by --in's paths, is described as it is)
            for index, (leaf, spec) in enumerate(zip(arrays, per_leaf)):
                if spec is not None:
                    check_spec(tree.label(index), tuple(leaf.shape), spec, mesh)
            arrays = [leaf if spec is None else
                      jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, P(*spec)))
                      for leaf, spec in zip(arrays, per_leaf)]
        else:
            arrays = place_leaves(tree, arrays, value, mesh, in_specs[tree.name], namespace)
        args.append(arrays)
        specs.append(tuple(per_leaf))
    # Inputs on another mesh of these devices: laid out again (--in ones are placed already); described
    # (--plan, --as-code): only noted.
    resolved = _out_spec_trees(out_specs, namespace)  # @NAME read now: a missing name fails before tracing
    args, moved = lay_out_again(inputs, args, specs, mesh, move=not describe)
    check_donated(donate, inputs)
    prepared = PreparedCell("shard", cell, mesh, inputs, constants, args, tuple(specs), out_specs,
                            options={"outputs": outputs, "donate": tuple(donate)}, moved=moved)
    sources = {name: str(spec) for name, spec in out_specs.items() if isinstance(spec, SpecTree)}
    prepared.compile = lambda record=None: _compile(cell, inputs, namespace, mesh, resolved, outputs, tuple(donate),
                                                    sources)
    return prepared


