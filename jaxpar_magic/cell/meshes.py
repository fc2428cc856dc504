"""Device meshes for our cells: building them (the devices the user chose, the axis types), which
mesh a cell uses when its line names none, and running a cell under its own mesh whatever mesh
`jax.set_mesh` set."""
from __future__ import annotations

import contextlib
from functools import lru_cache

from ..errors import UsageError
from .devices import select_devices
from .specs import MeshShape


@lru_cache(maxsize=1)
def default_axis_type() -> str:
    """The axis type `jax.make_mesh` gives when not told (Explicit on JAX 0.10), as `--axis-types`
    names it: `%mesh` gives what the same line in plain JAX would. Asked of JAX itself, on a
    one-device mesh, so a JAX that changes its default changes ours."""
    import jax

    made = jax.make_mesh((1,), ("probe",), devices=jax.devices()[:1])
    return made.axis_types[0].name.lower()


def axis_types(kind: str | None, count: int):
    """`count` axes of the type `kind` (auto, explicit, manual; None: jax.make_mesh's default), or one type
    per axis, `explicit,auto`: JAX's meshes may mix them, so a line must be able to spell that too."""
    import jax

    kind = default_axis_type() if kind is None else kind
    words = [word.strip().lower() for word in kind.split(",")]
    if len(words) not in (1, count):
        raise UsageError(f"--axis-types {kind}: {len(words)} types for a mesh of {count} axes; give one type for "
                         f"every axis (`--axis-types auto`) or one per axis, in the mesh's order "
                         f"(`--axis-types {','.join(['explicit'] + ['auto'] * (count - 1))}`).")
    members = []
    for word in words:
        try:
            members.append(getattr(jax.sharding.AxisType, word.capitalize()))
        except AttributeError:
            raise UsageError(f"--axis-types: {word!r} is not an axis type; use auto, explicit or manual "
                             f"(one for every axis, or one per axis separated by commas).") from None
    return tuple(members) * count if len(members) == 1 else tuple(members)


@lru_cache(maxsize=64)
def _mesh(device_ids: tuple[int, ...], shape: MeshShape, kind: str):
    import jax
    import numpy as np

    by_id = {d.id: d for d in jax.devices()}
    grid = np.array([by_id[i] for i in device_ids], dtype=object).reshape(shape.sizes)
    return jax.sharding.Mesh(grid, shape.names, axis_types=axis_types(kind, len(shape.names)))


def build_mesh(shape: MeshShape, selection=None, kind: str | None = None):
    """A Mesh of `shape` over the chosen devices (all of them unless --devices says otherwise), with
    axes of the type `kind` (None: what `jax.make_mesh` gives).

    The sizes must multiply to the number of devices: `jax.make_mesh((2, 2))` on 8 devices silently
    takes a subset, which is never what a demo of "all my devices" means.
    """
    import jax

    kind = default_axis_type() if kind is None else kind

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
    """The 1-D mesh of a plain `%%pmap` cell: every chosen device along one named axis. Auto, as
    `jax.pmap`'s own mesh is on JAX 0.10 (its outputs carry that mesh)."""
    devices = select_devices(selection)
    return _mesh(tuple(d.id for d in devices), MeshShape((axis_name,), (len(devices),)), "auto")


# --- the mesh a cell runs under -------------------------------------------------------------------

_UNCHANGED = contextlib.nullcontext()


def context_mesh():
    """The concrete mesh `jax.set_mesh` set (globally, or in a `with` block), or None."""
    import jax

    if jax.sharding.get_abstract_mesh().empty:  # the cheap read first (~0.2 µs; get_mesh ~0.7 µs)
        return None
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


def on_cell_mesh(mesh):
    """The context a cell's program is called (and traced) in: the cell's own mesh, as
    `with jax.set_mesh(cell_mesh):` gives it, whatever mesh is set globally.

    Nothing changes when no mesh is set or the cell's is the one set (the hot path: one read of
    JAX's context). Otherwise the cell's mesh is set around the call; an abstract mesh (a plan), or
    one with Manual axes, which `jax.set_mesh` refuses, clears the context instead, and the program
    enters its mesh while it is traced (programs.within_mesh)."""
    return _set_unless_set(mesh, concrete=False)


def _set_unless_set(mesh, concrete: bool):
    """`jax.set_mesh(mesh)` unless `mesh` is the one set already (`concrete`: set it even when no
    mesh is set, as a program on Explicit axes needs)."""
    import jax

    current = jax.sharding.get_abstract_mesh()
    if current.empty and not concrete:
        return _UNCHANGED
    if not current.empty and current == getattr(mesh, "abstract_mesh", mesh):
        try:
            if not isinstance(mesh, jax.sharding.Mesh) or jax.sharding.get_mesh() == mesh:
                return _UNCHANGED
        except ValueError:  # inside a trace (an --as-code trace set the mesh around it): it is set
            return _UNCHANGED
    if isinstance(mesh, jax.sharding.Mesh) and jax.sharding.AxisType.Manual not in (mesh.axis_types or ()):
        return jax.set_mesh(mesh)
    return jax.set_mesh(None)


DEFAULT_MESH = "<the context mesh, else `mesh`>"  # how a line without --mesh chose its mesh (replays check it)


def default_mesh(namespace: dict):
    """The mesh of a %%shard / %%shard_map line without --mesh: the one `jax.set_mesh` set, else
    the namespace's `mesh` (None when neither is a mesh)."""
    import jax

    found = context_mesh()
    if found is not None:
        return found
    mesh = namespace.get("mesh")
    return mesh if isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)) else None


# --- inputs laid out on another mesh --------------------------------------------------------------

class InputOnOtherMesh(Exception):
    """A re-run met an input on another mesh of the cell's devices: take the full path, which lays
    it out again (raised instead of JAX's error, caught by the run stage; never reaches a user)."""


def is_explicit(mesh) -> bool:
    """Any of the mesh's axes is Explicit: shardings are part of its arrays' types."""
    import jax

    return any(t == jax.sharding.AxisType.Explicit for t in getattr(mesh, "axis_types", ()) or ())


def needs_the_mesh_set(mesh) -> bool:
    """A %%shard program on Explicit axes runs with its mesh set, as JAX asks explicit sharding to
    (`jax.set_mesh` is "required for enabling explicit sharding mode"): entering the abstract mesh
    while traced is not enough once the program makes an array of its own (jax.grad's cotangent,
    a constant), whose devices jit then cannot tell."""
    import jax

    return isinstance(mesh, jax.sharding.Mesh) and is_explicit(mesh)


class UnderMesh:
    """A program called (and lowered) under `jax.set_mesh(mesh)` (needs_the_mesh_set); otherwise it
    is the jitted function it wraps."""

    __slots__ = ("jitted", "mesh", "__weakref__")  # jax.eval_shape (--as-code) keeps a weak reference

    def __init__(self, jitted, mesh):
        self.jitted, self.mesh = jitted, mesh

    def _context(self):
        return _set_unless_set(self.mesh, concrete=True)

    def __call__(self, *args):
        with self._context():
            return self.jitted(*args)

    def lower(self, *args):
        with self._context():
            return self.jitted.lower(*args)


def id_list(ids) -> str:
    """`3`, `0-7`, or `0, 2, 5`: device ids as a reader scans them."""
    ids = list(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ", ".join(map(str, ids))


def describe_mesh(mesh) -> str:
    """`mesh data=4, model=2 (Explicit axes) on devices 0-7`: a mesh in words, for messages."""
    axes = ", ".join(f"{n}={s}" for n, s in mesh.shape.items())
    types = sorted({t.name for t in (getattr(mesh, "axis_types", None) or ())})
    kind = f" ({types[0]} axes)" if len(types) == 1 else f" ({'/'.join(types)} axes)" if types else ""
    devices = [d.id for d in mesh.devices.flat]
    return f"mesh {axes}{kind} on devices {id_list(devices)}"


def on_other_mesh(leaf, mesh) -> bool:
    """A committed array laid out on another mesh than `mesh` (other axis types, names or device
    order) over the very same devices: jit cannot take it as it is, `jax.device_put` can move it."""
    import jax

    if not isinstance(leaf, jax.Array) or not leaf.committed:
        return False
    return other_mesh_sharding(leaf.sharding, mesh)


def other_mesh_sharding(sharding, mesh) -> bool:
    """A NamedSharding on another mesh than `mesh` over the very same devices (on_other_mesh, for a
    committed array; the only part of that check a re-run keys on: Rerun.checked)."""
    import jax

    if not isinstance(sharding, jax.sharding.NamedSharding) or sharding.mesh == mesh:
        return False
    return sharding.device_set == set(mesh.devices.flat)


def spec_on(leaf, mesh) -> tuple:
    """The spec a leaf from another mesh keeps on `mesh`: its own, when every axis it names is an
    axis of `mesh` of the same size; otherwise none (replicated), which every mesh can hold."""
    from .layout import spec_axes

    theirs = leaf.sharding.mesh.shape
    ours = {str(n): int(s) for n, s in mesh.shape.items()}
    spec = tuple(leaf.sharding.spec)
    used = [a for axes in spec_axes(spec, len(spec)) for a in axes]
    if all(ours.get(str(a)) == int(theirs[a]) for a in used):
        return spec
    return ()


def lay_out_again(inputs, arguments, leaf_specs, mesh, move: bool = True) -> tuple[list, list]:
    """Each input leaf on another mesh of the cell's devices put on the cell's mesh, as
    `jax.device_put` would: by the spec the engine gives that leaf, or (None: the cell takes the leaf
    as it is laid out) by its own spec where the cell's mesh has its axes. Returns the arguments and
    a note per input moved: (name, the mesh it was on, the spec it got). Without `move` (--plan,
    --as-code) nothing moves: such a leaf is described (a ShapeDtypeStruct laid out on the mesh)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    moved, out = [], []
    for tree, arrays, specs in zip(inputs, arguments, leaf_specs):
        placed, note = [], None
        for leaf, spec in zip(arrays, specs):
            if on_other_mesh(leaf, mesh):
                spec = spec_on(leaf, mesh) if spec is None else spec
                if note is None:
                    note = (tree.name, leaf.sharding.mesh, tuple(spec))
                elif note[2] != tuple(spec):  # leaves of one input laid out differently: one note, replicated
                    note = (tree.name, note[1], ())
                target = NamedSharding(mesh, P(*spec))
                leaf = jax.device_put(leaf, target) if move else \
                    jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=target, weak_type=leaf.weak_type)
            placed.append(leaf)
        out.append(placed)
        if note is not None:
            moved.append(note)
    return out, moved


def moved_text(moved: list, mesh) -> str:
    """What the run says about inputs it laid out again: each with the mesh it came from."""
    if not moved:
        return ""
    lines = []
    for name, source, spec in moved:
        layout = "P(" + ", ".join(repr(e) if e is not None else "None" for e in spec) + ")"
        lines.append(
            f"jaxpar_magic: `{name}` is laid out on another {describe_mesh(source)}; this cell runs on "
            f"{describe_mesh(mesh)}, so it was laid out again here as jax.device_put does ({layout}); your "
            f"`{name}` is unchanged. To skip the move, put it on this cell's mesh once: "
            f"`{name} = jax.device_put({name}, NamedSharding(mesh, {layout}))`."
        )
    return "\n".join(lines)


def moved_title(moved: list) -> str:
    """What a view's title adds about inputs laid out again: ` · laid out again from another mesh: x, y`."""
    return f" · laid out again from another mesh: {', '.join(name for name, _, _ in moved)}" if moved else ""
