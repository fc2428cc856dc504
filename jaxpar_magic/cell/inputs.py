"""The input model: which values a cell reads are inputs, and how each crosses into a traced program.

One rule for every engine and every stage (it is `eqx.filter_jit`'s rule): a value the cell reads is
an *input* when its pytree leaves include arrays (with `abstract`, for --plan, `jax.ShapeDtypeStruct`s
too). Its array leaves are traced; its other leaves (an Equinox module's activation function, a
dataclass's Python number) are *static*: part of the compile key, compared the way fingerprints
compare constants. Any registered pytree works: dicts, dataclasses, optax states, Equinox modules.
Flax NNX objects are split into graphdef and state first (cell/nnx_graphs.py), as `nnx.jit` does.

A traced program takes one argument per input: the flat list of its array leaves. Flattening is
JAX's C++ pytree code; the per-leaf Python below runs once, when a cell is planned, not per call.
The same split serves outputs (`OutputTree`): array leaves leave the program, the rest is kept and
the value is rebuilt with its own type.
"""
from __future__ import annotations

import builtins
import functools

from ..errors import UsageError
from . import dict_keys, nnx_graphs
from .fingerprints import custom_nodes, fingerprint, held_callables, structure_key


def is_array(value) -> bool:
    import jax
    import numpy as np

    return isinstance(value, (jax.Array, np.ndarray))


@functools.lru_cache(maxsize=1)
def jax_array_type() -> type:
    """jax.Array, imported once (JAX is imported only when a cell first needs it); for hot-path checks."""
    import jax

    return jax.Array


def is_abstract(value) -> bool:
    """A jax.ShapeDtypeStruct: a shape, a dtype and maybe a sharding, no values (what --plan takes)."""
    import jax

    return isinstance(value, jax.ShapeDtypeStruct)


class TreeInput:
    """One named input: its structure, where its array leaves sit, and its static leaves.

    An input holding Flax NNX objects is the slotted tree of a joint split (cell/nnx_graphs.py):
    `graphdef` is the graph of *all* the NNX objects the cell's inputs hold, and `group` names those
    inputs, in argument order, so that they are split, matched and merged together."""

    __slots__ = ("name", "graphdef", "graph_key", "group", "treedef", "positions", "statics", "static_key",
                 "signature", "_paths", "bare", "structure_key", "held")

    def __init__(self, name, graphdef, treedef, positions, statics, signature, group=(), graph_items=(),
                 graph_statics=()):
        self.name = name
        self.graphdef = graphdef  # NNX: the static graph of the group's objects; None for plain pytrees
        self.graph_key = nnx_graphs.graph_key(graphdef)  # the graphdef, hashable (its dict configs by type)
        self.group = group  # NNX: the names of the inputs split with this one (itself included)
        self.treedef = treedef
        self.positions = positions  # indices of the traced leaves among all leaves
        self.statics = statics  # ((index, leaf), ...): leaves kept as they are
        self.static_key = tuple((i, fingerprint(leaf)) for i, leaf in statics)
        nodes = custom_nodes(treedef)  # a Partial's function, static fields: what == on treedefs misses
        self.structure_key = structure_key(nodes, graph_items, graph_statics)
        self.held = held_callables(nodes, graph_items, graph_statics)  # what an identical re-run fingerprints again
        self.signature = signature  # ((shape, dtype), ...) of the traced leaves
        self._paths = None
        self.bare = not self.is_tree  # one array and nothing around it: rebuilding is the array itself

    @classmethod
    def of(cls, name: str, value, abstract: bool = False) -> "TreeInput | None":
        """The input `value` makes on its own, or None when it has no array leaves (then it is a constant)."""
        return trees_of([(name, value)], abstract)[0]

    @classmethod
    def _of_tree(cls, name: str, tree, abstract: bool, graphdef=None, group=(), graph_items=(),
                 graph_statics=()) -> "TreeInput | None":
        import jax

        leaves, treedef = jax.tree.flatten(tree)
        positions = tuple(i for i, leaf in enumerate(leaves) if is_array(leaf) or (abstract and is_abstract(leaf)))
        if not positions and graphdef is None:  # (an NNX holder whose state another input carries is still one)
            return None
        traced = set(positions)
        statics = tuple((i, leaf) for i, leaf in enumerate(leaves) if i not in traced)
        signature = tuple((tuple(leaves[i].shape), leaves[i].dtype) for i in positions)
        return cls(name, graphdef, treedef, positions, statics, signature, group, graph_items, graph_statics)

    @property
    def is_tree(self) -> bool:
        """More than a bare array: views and messages name its leaves."""
        return self.graphdef is not None or len(self.positions) != 1 or bool(self.statics) or \
            self.treedef.num_nodes != 1

    @property
    def key(self) -> tuple:
        """What the compiled program depends on besides the leaves' shapes and dtypes."""
        return (self.name, self.graph_key, self.group, self.treedef, self.static_key, self.structure_key)

    def arrays(self, value) -> list:
        """The traced leaves of `value` (of this input's structure), in order: the program's argument.
        An input split with others (`group`) takes input_arrays(), which splits them together."""
        import jax

        if self.graphdef is not None:
            self._alone("arrays")
            value = nnx_graphs.split_values([value])[1][0]
        leaves = jax.tree.leaves(value)
        return [leaves[i] for i in self.positions]

    def _alone(self, what: str) -> None:
        if len(self.group) > 1:
            raise RuntimeError(f"TreeInput.{what}: {self.name!r} is split together with {self.group}; "
                               f"use the group's functions (input_arrays, rebuilt)")

    def matching_arrays(self, value) -> list | None:
        """The traced leaves of `value` if it has this very structure, statics and leaf shapes; else None.

        The re-run check: a new object of the same treedef, shapes and dtypes is the same program.
        """
        if self.graphdef is not None:
            self._alone("matching_arrays")
            found = matching_group([self], [value])
            return None if found is None else found[0]
        return self.matching_tree(value)

    def matching_tree(self, tree) -> list | None:
        """matching_arrays of a value already split (for NNX inputs, its slotted tree)."""
        import jax

        leaves, treedef = jax.tree.flatten(tree)
        if treedef != self.treedef:
            return None
        for held, fp in self.held:  # the very objects (== on treedefs compared them by identity)
            if fingerprint(held) != fp:
                return None
        for (i, leaf), (_, fp) in zip(self.statics, self.static_key):
            if leaf is not leaves[i] and fingerprint(leaves[i]) != fp:
                return None
        arrays = [leaves[i] for i in self.positions]
        for array, (shape, dtype) in zip(arrays, self.signature):
            if getattr(array, "shape", None) != shape or getattr(array, "dtype", None) != dtype:
                return None
        return arrays

    def rebuild(self, arrays):
        """The value the cell sees, inside the trace: traced leaves where the arrays were."""
        if self.bare:
            return arrays[0]
        if self.graphdef is not None:
            self._alone("rebuild")
            return rebuilt([self], [arrays])[0]
        return _unflatten(self.treedef, self.positions, self.statics, arrays)

    def tree_of(self, arrays):
        """The pytree around `arrays` before any NNX merge: for an NNX input, its slotted tree."""
        return _unflatten(self.treedef, self.positions, self.statics, arrays)

    def paths(self) -> list[str]:
        """Each traced leaf's path (`['w1']`, `.mu['b']`), for messages and views."""
        if self._paths is None:
            placeholder = self.tree_of([_Leaf(i) for i in range(len(self.positions))])
            found = {}
            for where, leaf in nnx_graphs.leaves_with_paths(placeholder):
                if isinstance(leaf, _Leaf):
                    found[leaf.index] = where
            self._paths = [found.get(i, f"[{i}]") for i in range(len(self.positions))]
        return self._paths

    def label(self, index: int) -> str:
        """`params['w1']`: the name and the path of traced leaf `index` (the bare name for an array)."""
        return self.name + (self.paths()[index] if self.is_tree else "")


def trees_of(named: list, abstract: bool = False, cell=None) -> list:
    """The TreeInput (or None: a constant) of each (name, value), the NNX objects of all of them
    split as one graph, the way `nnx.jit(f)(a, b)` splits its arguments. `cell`, when given, is
    where messages say the value is read."""
    flat = [i for i, (name, value) in enumerate(named) if _flattens(name, value, abstract, cell)]
    holders = [i for i in flat if nnx_graphs.holds_graph_nodes(named[i][1]) and _has_arrays(named[i][1], abstract)]
    found = [None] * len(named)
    if holders:
        graphdef, trees = nnx_graphs.split_values([named[i][1] for i in holders])
        group = tuple(named[i][0] for i in holders)
        statics = nnx_graphs.unhashable_statics(graphdef)  # the group's: keyed and re-checked once, by its first input
        for k, (i, tree) in enumerate(zip(holders, trees)):
            found[i] = TreeInput._of_tree(named[i][0], tree, abstract, graphdef, group,
                                          nnx_graphs.graph_items(named[i][1]), statics if k == 0 else ())
    for i in flat:
        if i not in holders:
            found[i] = TreeInput._of_tree(named[i][0], named[i][1], abstract)
    return found


def _flattens(name: str, value, abstract: bool, cell) -> bool:
    """Whether JAX flattens `value`. A dict mixing key types (`{0: .5, 'lr': .1}`) it cannot flatten
    is a constant when it holds no arrays (plain jax.jit closes over it the same way); with arrays
    it is a UsageError that names it."""
    import jax

    try:
        jax.tree.structure(value)
        return True
    except (ValueError, TypeError):
        found = dict_keys.first_unsortable(value)
        if found is None:
            raise
    path, mapping = found
    if not dict_keys.holds(value, lambda leaf: is_array(leaf) or (abstract and is_abstract(leaf))):
        return False
    label = name + path
    where = _where_name_read(name, cell) if cell is not None else "an input of the cell"
    raise UsageError(
        f"`{label}` is a dict whose keys mix {dict_keys.key_types(mapping)} ({where}), and it holds arrays: JAX "
        f"sorts a dict's keys to flatten it into the arrays a compiled cell takes, and cannot order these. Give "
        f"its keys one type (e.g. `{{str(k): v for k, v in {label}.items()}}`), or keep the arrays out of it: a "
        f"dict without arrays is read as a constant, as jax.jit closing over it does."
    )


def _has_arrays(value, abstract: bool) -> bool:
    import jax

    return any(is_array(leaf) or (abstract and is_abstract(leaf)) for leaf in jax.tree.leaves(value))


def _graph_members(inputs) -> list[int]:
    return [i for i, tree in enumerate(inputs) if tree.graphdef is not None]


def input_arrays(inputs, namespace: dict) -> list[list]:
    """Each input's traced leaves from the namespace, in order (the NNX ones split together)."""
    arrays = [None if tree.graphdef is not None else tree.arrays(namespace[tree.name]) for tree in inputs]
    members = _graph_members(inputs)
    if members:
        trees = nnx_graphs.split_values([namespace[inputs[i].name] for i in members])[1]
        for i, tree in zip(members, trees):
            leaves = _leaves(tree)
            arrays[i] = [leaves[j] for j in inputs[i].positions]
    return arrays


def _leaves(tree) -> list:
    import jax

    return jax.tree.leaves(tree)


def graph_state(inputs, args):
    """The joint state of the inputs' NNX objects around their traced leaves `args` (e.g. as --in
    placed them): what nnx_graphs.write writes into the user's objects."""
    return nnx_graphs.joint_state([inputs[i].tree_of(args[i]) for i in _graph_members(inputs)])


def matching_group(members, values) -> list | None:
    """matching_arrays of inputs split together (`members`, all of one group) on their new `values`:
    the same graph (the same sharing between them), the same slotted trees; else None."""
    graphdef, trees = nnx_graphs.split_values(values)
    if graphdef != members[0].graphdef:
        return None
    found = []
    for tree, slotted in zip(members, trees):
        arrays = tree.matching_tree(slotted)
        if arrays is None:
            return None
        found.append(arrays)
    return found


class _Leaf:
    """A stand-in leaf that remembers its position (to read paths without touching real arrays)."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _unflatten(treedef, positions, statics, arrays):
    import jax

    leaves = [None] * treedef.num_leaves
    for i, leaf in statics:
        leaves[i] = leaf
    for i, array in zip(positions, arrays):
        leaves[i] = array
    return jax.tree.unflatten(treedef, leaves)


def _rebuild(treedef, positions, statics, arrays, graphdef=None):
    tree = _unflatten(treedef, positions, statics, arrays)
    return nnx_graphs.merge(graphdef, tree) if graphdef is not None else tree


@functools.lru_cache(maxsize=1)
def _numeric_types() -> tuple:
    import jax
    import numpy as np

    return (jax.core.Tracer, jax.Array, np.ndarray, np.generic, bool, int, float, complex)


class OutputTree:
    """An output computed on the devices: its traced leaves leave the program, the rest is kept."""

    __slots__ = ("graphdef", "treedef", "positions", "statics", "bare")

    def __init__(self, graphdef, treedef, positions, statics):
        self.graphdef, self.treedef, self.positions, self.statics = graphdef, treedef, positions, statics
        # One array and nothing around it: rebuilding is the array itself (re-runs' hot path).
        self.bare = graphdef is None and not statics and treedef.num_nodes == 1 and positions == (0,)

    @classmethod
    def split(cls, value, always: bool = False) -> "tuple[OutputTree, list] | None":
        """(the output's shape of things, its traced leaves), or None for a plain Python value
        (with `always`, a value without traced leaves is an OutputTree too)."""
        import jax

        graphdef = None
        tree = value
        if nnx_graphs.holds_graph_nodes(value, variables=False):  # an nnx.State's Variables flatten as pytrees
            graphdef, tree = nnx_graphs.split(value)
        leaves, treedef = jax.tree.flatten(tree)
        if not always and not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return None
        # Numbers beside traced leaves come back as arrays, as jax.jit and jax.pmap return them;
        # other leaves (an activation function, a string) stay as they are.
        positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, _numeric_types()))
        traced = set(positions)
        statics = tuple((i, leaf) for i, leaf in enumerate(leaves) if i not in traced)
        return cls(graphdef, treedef, positions, statics), [leaves[i] for i in positions]

    def rebuild(self, arrays):
        """The output as the user's type (a dataclass, an eqx.Module, an nnx.State...) around `arrays`."""
        if self.bare:
            return arrays[0]
        return _rebuild(self.treedef, self.positions, self.statics, arrays, self.graphdef)


def classify(cell, namespace: dict, named: dict | None = None, abstract: bool = False):
    """Split the names a cell reads into inputs (TreeInputs) and constants; undefined names are errors.

    `named` maps an option to the names it takes (`{"--broadcast": ("w",)}`): each must be an input.
    With `abstract` (--plan), jax.ShapeDtypeStructs are array leaves too; without it, reading one is a
    mistake we can explain (it has no values to compute with).
    """
    inputs, constants = [], []
    present = [name for name in cell.reads if name in namespace]
    trees = dict(zip(present, trees_of([(name, namespace[name]) for name in present], abstract=True, cell=cell)))
    found = [tree for tree in trees.values() if tree is not None]
    leaves_of = dict(zip((t.name for t in found), input_arrays(found, namespace))) if not abstract else {}
    for name in cell.reads:
        if name in namespace:
            value = namespace[name]
            tree = trees[name]
            leaves = leaves_of.get(name, ())  # flattened once, for both checks
            if any(is_abstract(leaf) for leaf in leaves):
                lineno = cell.first_read(name)
                raise UsageError(
                    f"{name!r} is an abstract array (jax.ShapeDtypeStruct: a shape and a layout, no values), read on "
                    f"line {lineno} of the cell (`{cell.line(lineno)}`). A cell can only plan with it: add --plan to "
                    f"the magic line to see what the program would cost, or give {name!r} real values first."
                )
            if tree is None:
                constants.append(name)
            else:
                _check_traceable(tree, value, cell)
                deleted = deleted_leaf(tree, leaves)
                if deleted is not None:
                    raise deleted_input_error(tree, deleted, cell)
                inputs.append(tree)
        elif not hasattr(builtins, name):
            lineno = cell.first_read(name)
            raise UsageError(
                f"name {name!r} is not defined (line {lineno} of the cell: `{cell.line(lineno)}`). Define it "
                f"in an earlier cell, or fix the spelling."
            )
    names = [t.name for t in inputs]
    for option, wanted in (named or {}).items():
        for name in wanted:
            if name not in names:
                why = "is not defined" if name not in namespace else "is not an array input the cell reads (no array leaves)"
                raise UsageError(
                    f"{option} {name}: {name!r} {why}. {option} takes names of arrays (or pytrees of arrays) the cell "
                    f"reads before assigning them; this cell's inputs are: {', '.join(names) or 'none'}."
                )
    return tuple(inputs), tuple(constants)


def _check_traceable(tree: TreeInput, value, cell) -> None:
    """A NumPy leaf of strings, objects, records or dates can be neither traced (JAX computes on
    numbers) nor kept as a static leaf (it is an array): say which leaf, before JAX says "not a
    valid JAX type" of `args[0][0]`."""
    import numpy as np

    for index, (_, dtype) in enumerate(tree.signature):
        # Not every kind "V": bfloat16 and the float8s are kind "V" too; a record or raw bytes is np.void.
        kind = getattr(dtype, "kind", "f")
        if kind not in "OSUMm" and getattr(dtype, "type", None) is not np.void:
            continue
        label = tree.label(index)
        if dtype.names:
            fix = (f"Give each field an array of its own (`{label}[{dtype.names[0]!r}]`, ...), or keep it out of "
                   f"{tree.name!r}.")
        elif kind in "Mm":
            unit = np.datetime_data(dtype)[0]
            counts = f"whole {unit} since 1970" if kind == "M" else f"whole {unit}"
            fix = f"Turn it into numbers first, e.g. `{label}.astype('int64')` ({counts}), or keep it out of {tree.name!r}."
        else:
            fix = (f"Make it a tuple or a list (its items are then static, part of what the program is compiled "
                   f"for), or keep it out of {tree.name!r}.")
        raise UsageError(
            f"`{label}` is a NumPy array of {dtype} ({_where_read(tree, cell)}): JAX traces arrays of numbers and "
            f"booleans only, and an array is never a static leaf. {fix}"
        )


def _first_jax_array(arrays, test) -> int | None:
    """The index of the first jax.Array among an input's traced leaves that passes `test`, or None."""
    array = jax_array_type()
    for index, leaf in enumerate(arrays):
        if isinstance(leaf, array) and test(leaf):
            return index
    return None


def deleted_leaf(tree: TreeInput, arrays) -> int | None:
    """The index of the first of an input's traced leaves whose device buffers are gone, or None."""
    return _first_jax_array(arrays, lambda leaf: leaf.is_deleted())


def deleted_input_error(tree: TreeInput, index: int, cell) -> UsageError:
    """What to say when a cell reads an array whose buffers were deleted (donated, most often)."""
    return UsageError(
        f"`{tree.label(index)}` was deleted: its device buffers are gone ({_where_read(tree, cell)}). Most "
        f"often a function with donate_argnums (jax.jit's, %%shard --donate, or %%pmap --donate-argnums) took it as "
        f"an argument "
        f"and reused its memory for its result; `.delete()` does the same. Use the value that function "
        f"returned instead, or give {tree.name!r} a new value first."
    )


def misplaced_leaf(tree: TreeInput, arrays, mesh) -> int | None:
    """The index of the first of an input's traced leaves committed to other devices than `mesh`'s
    (jit moves an uncommitted array where it is needed, never a committed one), or None."""
    devices = set(mesh.devices.flat)
    return _first_jax_array(arrays, lambda leaf: leaf.committed and leaf.sharding.device_set != devices)


def misplaced_input_error(tree: TreeInput, index: int, leaf, cell, mesh) -> UsageError:
    """What to say when a cell reads an array committed to devices its mesh does not span: the
    input, both meshes (or devices), and the fix."""
    import jax

    from .meshes import describe_mesh, id_list

    sharding = leaf.sharding
    on = _device_ids(sharding.device_set)
    where = (f"on {describe_mesh(sharding.mesh)}" if isinstance(sharding, jax.sharding.NamedSharding)
             else f"committed to device{'s' if len(on) > 1 else ''} {id_list(on)}")
    return UsageError(
        f"`{tree.label(index)}` is {where} ({_where_read(tree, cell)}), and this cell runs on "
        f"{describe_mesh(mesh)}. JAX moves an uncommitted array where a program needs it, but never a committed "
        f"one to other devices (placed by jax.device_put, or computed on those devices, e.g. by a cell over other "
        f"devices or under another `jax.set_mesh`). Put it on this cell's mesh, "
        f"`{tree.name} = jax.device_put({tree.name}, NamedSharding(mesh, P()))` (or its own spec there), or give "
        f"the cell an uncommitted copy, `{tree.name} = jax.tree.map(jnp.asarray, jax.device_get({tree.name}))`."
    )


def _device_ids(devices) -> list[int]:
    return sorted(d.id for d in devices)


def _where_read(tree: TreeInput, cell) -> str:
    return _where_name_read(tree.name, cell)


def _where_name_read(name: str, cell) -> str:
    lineno = cell.first_read(name)
    return f"read on line {lineno} of the cell: `{cell.line(lineno)}`"


def absent_builtins(cell, namespace: dict) -> tuple[str, ...]:
    """Builtins the cell reads that the namespace does not shadow (a re-run checks they still aren't)."""
    return tuple(n for n in cell.reads if n not in namespace and hasattr(builtins, n))


def rebuilt(inputs, args) -> list:
    """Inside a traced program: each input's value, rebuilt around its traced leaves."""
    values, merged = merged_inputs(inputs, args)
    if merged is not None:
        merged.close()  # nothing will be written back from here
    return values


def merged_inputs(inputs, args) -> tuple[list, "nnx_graphs.MergedGraph | None"]:
    """Inside a traced program: each input's value rebuilt around its traced leaves, the NNX objects
    of all of them merged as one graph; and that MergedGraph (None when no input holds NNX objects),
    which the caller closes once the cell has run."""
    members = _graph_members(inputs)
    if not members:
        return [tree.rebuild(arrays) for tree, arrays in zip(inputs, args)], None
    values = [None if tree.graphdef is not None else tree.rebuild(arrays) for tree, arrays in zip(inputs, args)]
    merged = nnx_graphs.MergedGraph(inputs[members[0]].graphdef, [inputs[i].name for i in members],
                                    [inputs[i].tree_of(args[i]) for i in members])
    for i, value in zip(members, merged.values):
        values[i] = value
    return values, merged
