"""What the layout explorer lets you change, read from a %%shard cell and its namespace: every array
leaf the cell reads (its input, path, shape, dtype and current spec), the mesh's shapes over the same
devices, and a layout (mesh shape, axis types, one spec per leaf, target) as a hashable key with the
`%%shard --plan` line that reproduces it.

No planning here (stages/explore/explorer.py plans a layout through plan_cell); no IPython.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...cell.layout import spec_axes
from ...cell.specs import MeshShape, parse_mesh_shape, parse_spec
from ...errors import UsageError

#: TPU slice shapes Google Cloud offers (stages/plan/plan_program.py's tpu_compile_error lists the same).
SLICES = {"2d": ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
          "3d": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8")}


@dataclass(frozen=True)
class Leaf:
    """One array leaf of an input the cell reads: `params['w1']` is input `params`, path `['w1']`."""

    input: str
    path: str  # "" for a bare array
    shape: tuple[int, ...]
    dtype: str

    @property
    def label(self) -> str:
        return self.input + self.path


Spec = tuple  # one tuple of mesh axis names per dimension, () for an unsplit one: (('data',), ())


@dataclass(frozen=True)
class Layout:
    """Everything that decides a plan of the cell: the explorer's cache key."""

    shape: MeshShape
    types: tuple[str, ...]  # "auto" | "explicit" | "manual", one per axis
    specs: tuple[Spec, ...]  # one per leaf, in the explorer's leaf order
    hardware: str | None = None
    topology: str | None = None

    def with_spec(self, index: int, spec: Spec) -> "Layout":
        specs = list(self.specs)
        specs[index] = spec
        return replace(self, specs=tuple(specs))


# --- specs ---------------------------------------------------------------------------------------

def canonical(spec, ndim: int, where: str) -> Spec:
    """A spec as one tuple of axis names per dimension (padded to `ndim`): `P('data', None)`,
    `"data,None"`, `"P(('data','model'), None)"`, `[["data"], []]` (the view's form) all read."""
    from jax.sharding import PartitionSpec

    if isinstance(spec, str):
        spec = parse_spec(spec, where)
        if not isinstance(spec, tuple):
            raise UsageError(f"{where}: `@NAME` spec trees are for the line; choose one leaf's spec, e.g. "
                             f"\"P('data', None)\".")
    elif isinstance(spec, PartitionSpec):
        spec = tuple(spec)
    elif spec is None:
        spec = ()
    elif not isinstance(spec, (tuple, list)):
        raise UsageError(f"{where}: {spec!r} is not a spec; give a PartitionSpec, or a string as in --in "
                         f"(\"P('data', None)\" or \"data,None\").")
    if len(spec) > ndim:
        raise UsageError(f"{where}: the spec {format_spec(_entries(spec, where))} has {len(spec)} entries but the "
                         f"array has {ndim} dimension{'s' if ndim != 1 else ''}; give at most one entry per dimension.")
    entries = _entries(spec, where)
    return entries + ((),) * (ndim - len(entries))


def _entries(spec, where: str) -> Spec:
    """The spec's entries as axis tuples (cell/layout.spec_axes), each checked first: a user's choice."""
    for entry in spec:
        if not (entry is None or isinstance(entry, str)
                or isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry)):
            raise UsageError(f"{where}: {entry!r} is not a spec entry; use a mesh axis name, None, or a tuple of axis "
                             f"names like ('data', 'model').")
    return tuple(spec_axes(spec, len(spec)))


def engine_form(spec: Spec) -> tuple:
    """Our spec as the engines take it (cell/specs.py): None, a name, or a tuple of names per entry."""
    return tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in spec)


def partition_spec(spec: Spec):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*engine_form(spec))


def format_spec(spec: Spec) -> str:
    """`P('data',None)`: no spaces, so the line's words stay whole."""
    def one(axes):
        if not axes:
            return "None"
        if len(axes) == 1:
            return f"'{axes[0]}'"
        return "(" + ",".join(f"'{a}'" for a in axes) + ")"
    return "P(" + ",".join(one(a) for a in spec) + ")"


def check(leaf: Leaf, spec: Spec, sizes: dict) -> None:
    """`spec` fits `leaf` on a mesh of `sizes`: known axes, each used once, sizes that divide."""
    used = set()
    for dim, axes in enumerate(spec):
        for axis in axes:
            if axis not in sizes:
                mesh = ", ".join(f"{a}={s}" for a, s in sizes.items())
                raise UsageError(f"{leaf.label}: {axis!r} is not an axis of the mesh ({mesh}); cut dimension {dim} "
                                 f"with one of those axes, or leave it unsplit (None).")
            if axis in used:
                raise UsageError(f"{leaf.label}: mesh axis {axis!r} is used twice in {format_spec(spec)}; a mesh "
                                 f"axis may cut one dimension of an array. Remove it from one of them.")
            used.add(axis)
        count = 1
        for axis in axes:
            count *= sizes[axis]
        if count > 1 and leaf.shape[dim] % count:
            over = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise UsageError(f"{leaf.label}: dimension {dim} has {leaf.shape[dim]} elements, which {over} = {count} "
                             f"devices do not divide. Cut it with an axis whose size divides {leaf.shape[dim]}, or "
                             f"leave it unsplit (None).")


# --- the cell's inputs ---------------------------------------------------------------------------

def cell_leaves(source: str, namespace: dict, in_specs: dict, mesh) -> tuple[list[Leaf], list[Spec]]:
    """Every array leaf of the plain inputs the cell reads, in the engine's order, and each one's
    current spec: the line's --in, else the leaf's own NamedSharding on this mesh's axes, else
    replicated. (Flax NNX objects are left as the cell lays them out: not explored.)"""
    import jax

    from ...cell.inputs import TreeInput
    from ...cell.programs import analyse_cached
    from ...cell.treespecs import leaf_specs

    cell = analyse_cached(source.rstrip() + "\n", "shard-plan")
    axes = {str(n) for n in mesh.axis_names}
    leaves, specs = [], []
    for name in cell.reads:
        if name not in namespace:
            continue
        value = namespace[name]
        tree = TreeInput.of(name, value, abstract=True)
        if tree is None or tree.graphdef is not None:
            continue
        arrays = tree.arrays(value)
        own = [_own_spec(a, axes) for a in arrays]
        given = ([o if s is None else s for s, o in zip(leaf_specs(tree, value, in_specs[name], namespace), own)]
                 if name in in_specs else own)
        for index, (array, spec) in enumerate(zip(arrays, given)):
            leaf = Leaf(name, tree.paths()[index] if tree.is_tree else "", tuple(int(s) for s in array.shape),
                        str(jax.numpy.dtype(array.dtype)))
            leaves.append(leaf)
            specs.append(canonical(tuple(spec), len(leaf.shape), f"--in {leaf.label}"))
    if not leaves:
        raise UsageError("--explore: this cell reads no arrays to lay out (plain Python values are constants). "
                         "Explore a cell that reads arrays or ShapeDtypeStructs, e.g. `y = x @ w`.")
    return leaves, specs


def _own_spec(array, axes: set) -> tuple:
    spec = getattr(getattr(array, "sharding", None), "spec", None)
    if spec is None:
        return ()
    named = {a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e)}
    return tuple(spec) if named <= axes else ()


def spec_tree(leaves: list[Leaf], specs: list[Spec], name: str, value):
    """One PartitionSpec per leaf of input `name`, in `value`'s structure (what `--in name=@TREE` takes)."""
    import jax

    from ...cell.inputs import TreeInput

    tree = TreeInput.of(name, value, abstract=True)
    by_path = {leaf.path: partition_spec(spec) for leaf, spec in zip(leaves, specs) if leaf.input == name}
    paths = tree.paths()
    flat, treedef = jax.tree.flatten(value)
    out = [jax.sharding.PartitionSpec()] * len(flat)
    for index, position in enumerate(tree.positions):
        out[position] = by_path[paths[index]]
    return jax.tree.unflatten(treedef, out)


def groups(leaves: list[Leaf], specs: list[Spec]) -> list[list[int]]:
    """Leaf indices grouped as %sharding groups a pytree's leaves: by input, shape, dtype and layout."""
    found: dict = {}
    for index, (leaf, spec) in enumerate(zip(leaves, specs)):
        found.setdefault((leaf.input, leaf.shape, leaf.dtype, spec), []).append(index)
    return list(found.values())


# --- meshes -------------------------------------------------------------------------------------

def mesh_shapes(names: tuple[str, ...], devices: int) -> list[str]:
    """Every shape of `names` over `devices` devices (`data=64,model=1`, ..., `data=1,model=64`)."""
    def split(count, k):
        if k == 1:
            yield (count,)
            return
        for first in range(count, 0, -1):
            if count % first == 0:
                for rest in split(count // first, k - 1):
                    yield (first,) + rest
    return [",".join(f"{n}={s}" for n, s in zip(names, sizes)) for sizes in split(devices, len(names))]


def read_shape(text, devices: int, option: str = "reshape") -> MeshShape:
    """`data=16,model=4` over the same `devices` devices, or a UsageError."""
    shape = text if isinstance(text, MeshShape) else parse_mesh_shape(str(text), option)
    if shape.size != devices:
        raise UsageError(f"{option}({str(shape)!r}): the mesh has {shape.size} devices but the explorer's cell runs "
                         f"on {devices}; give axis sizes that multiply to {devices}.")
    return shape


def axis_type_names(mesh) -> tuple[str, ...]:
    return tuple(t.name.lower() for t in mesh.axis_types)


def types_text(types: tuple[str, ...]) -> str:
    """`Auto`, or `Explicit/Auto` for axes of different types: the mesh's axis types in a view."""
    return "/".join(dict.fromkeys(t.capitalize() for t in types))


def all_device_ids() -> list[int]:
    import jax

    return sorted(d.id for d in jax.devices())


def refusal_words(err: UsageError) -> str:
    """What the view says of a layout the engine refused. JAX refusing a layout on Explicit axes is
    said in one line, without the cell's paragraph of fixes (out_sharding=..., jax.reshard): in the
    explorer the fix is another layout, or Auto axes."""
    said = str(err)
    cause = err.__context__
    if type(cause).__name__ != "ShardingTypeError" or ": the mesh has Explicit axes" not in said:  # jax._src.core's
        return said
    where = said.split(": the mesh has Explicit axes", 1)[0].replace("`", "")
    detail = (str(cause).strip().splitlines() or [""])[0].rstrip(".")
    return f"on Explicit axes JAX refuses {where}: {detail}. Try Auto axis types or another layout."


# --- a layout as the words of a line ------------------------------------------------------------

def mesh_words(layout: Layout, mesh) -> tuple[list[str], dict]:
    """The words after `--mesh` that build `mesh` (the layout's) inline, as `%mesh` would: its shape, and
    `--axis-types` (one per axis where they differ), `--devices` or `--abstract` where needed; checked by
    building it. A mesh no words rebuild (devices in an order --devices cannot give): a name, and the mesh
    to bind under it by hand."""
    import jax

    from ...cell.meshes import default_axis_type
    from ...cell.specs import InlineMesh
    from ...engines.shard import make_mesh

    shape = layout.shape
    if len(set(layout.types)) == 1:
        types = None if layout.types[0] == default_axis_type() else layout.types[0]
    else:
        types = ",".join(layout.types)  # one per axis: `--axis-types explicit,auto`
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return InlineMesh(shape.names, shape.sizes, axis_types=types, abstract=True).words().split(), {}
    ids = tuple(d.id for d in mesh.devices.flat)
    for devices in (None, len(ids), ids):  # all devices; the first N; these, in the mesh's order
        spelled = InlineMesh(shape.names, shape.sizes, axis_types=types, devices=devices)
        try:
            made = make_mesh(spelled, devices, types)
        except UsageError:
            continue
        if tuple(d.id for d in made.devices.flat) == ids and made.axis_types == mesh.axis_types:
            return spelled.words().split(), {}
    name = "mesh_" + "x".join(str(s) for s in shape.sizes) + "_" + "_".join(layout.types)
    return [name], {name: mesh}


def memory_words(size: int) -> str:
    """`48MiB`, `1.5GiB`: a --device-memory size in the largest unit that says it exactly (else bytes)."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        amount = size / factor
        if amount >= 1 and round(amount, 2) * factor == size:
            return f"{amount:g}{unit}"
    return str(int(size))


def input_words(name: str, leaves: list[Leaf], specs: list[Spec]) -> list[str] | None:
    """`params=P(None,None) params['w1']=P(None,'model')`: an input's --in words, one spec for every leaf
    (the most common one) and each leaf laid out otherwise by its path, quoted where a shell would
    split it (each word checked by reading it back as the line will); None where a path has no
    spelling (a dict key that is neither a string nor a number)."""
    import shlex
    from collections import Counter

    from ...cell.specs import parse_assignments

    counts = Counter(specs)
    base = max(counts, key=lambda spec: (counts[spec], not any(spec)))  # most common; a tie: whole leaves
    words = [f"{name}={format_spec(base)}"]
    for leaf, spec in zip(leaves, specs):
        if spec == base:
            continue
        word = f"{leaf.label}={format_spec(spec)}"
        for candidate in (word, f'"{word}"', shlex.quote(word)):
            try:
                read = parse_assignments(shlex.split(candidate), "--in")[name].paths[0]
            except (UsageError, ValueError, KeyError, AttributeError, IndexError):
                continue
            if read[1] == _steps(leaf.path) and canonical(read[2], len(spec), "--in") == spec:
                words.append(candidate)
                break
        else:
            return None
    return words


def _steps(path: str):
    from ...cell.specs import path_steps

    return path_steps(path)


def topology_options(hardware, devices: int) -> list[str]:
    """Slice shapes for a TPU profile whose chips divide the mesh's devices (more slices go over DCN)."""
    if hardware is None or getattr(hardware, "kind", None) != "tpu":
        return []
    rank = "3d" if len(getattr(hardware, "pod", ()) or ()) == 3 else "2d"

    def chips(text):
        total = 1
        for s in text.split("x"):
            total *= int(s)
        return total
    return [t for t in SLICES[rank] if devices % chips(t) == 0]
