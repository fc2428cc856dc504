"""Flax NNX graph objects (Modules, Optimizers, Rngs, Variables) as cell inputs, the way `nnx.jit` takes them.

NNX objects are mutable Python graphs: a cell that trains `model` in place (`optimizer.update(model,
grads)`) must see objects created at the trace's own level, or Flax refuses ("Cannot extract graph
node from different trace level"). So, like `nnx.jit(f)(a, b)`, we find every NNX object the cell's
inputs hold (bare, or inside any pytree: a list, a registered dataclass, an Equinox module), split
them *together* into one static graphdef and one state, merge them inside the traced program (an
object two inputs share, `b.lin is a`, is one object there too), and write the new state back into
the user's own objects once the cell has succeeded.

An input holding NNX objects crosses into the program as a *slotted tree*: the value with each NNX
object replaced by a `Slot` carrying that object's part of the joint state. Everything else in the
value is an ordinary pytree (arrays traced, other leaves static), as `nnx.jit` leaves it.

This is the one module that knows about Flax. It never imports Flax: it asks `sys.modules`, so a
user who did not import Flax pays nothing and never loads it (treescope handles frameworks the same way).
"""
from __future__ import annotations

import functools
import sys


def _nnx():
    return sys.modules.get("flax.nnx")


def _node_types(nnx) -> tuple:
    return tuple(t for t in (getattr(nnx, "Pytree", None), getattr(nnx, "Object", None), nnx.Variable) if t)


def is_graph_node(value) -> bool:
    """An NNX Module, Optimizer, Rngs, Variable or other NNX object: what `nnx.jit` splits as a graph
    wherever it sits in its arguments (never True when Flax was not imported)."""
    nnx = _nnx()
    return nnx is not None and isinstance(value, _node_types(nnx))


def holds_graph_nodes(value, variables: bool = True) -> bool:
    """The value is an NNX object, or a pytree of any kind (a list, a dataclass, an Equinox module...)
    holding some. A Module is itself a JAX pytree, so it is found before JAX would flatten it. Without
    `variables`, Variables alone (an nnx.State holds nothing else) do not count."""
    nnx = _nnx()
    if nnx is None:
        return False
    import jax

    found = jax.tree.leaves(value, is_leaf=is_graph_node) if not is_graph_node(value) else [value]
    return any(is_graph_node(leaf) and (variables or not is_variable(leaf)) for leaf in found)


def is_variable(value) -> bool:
    nnx = _nnx()
    return nnx is not None and isinstance(value, nnx.Variable)


class Slot:
    """Where an NNX object sat in an input: its index among the objects the inputs hold (in the
    order they were found), and its part of their joint state. `piece` is None where the object
    has no state of its own there: it appeared earlier (two names for one object), or all its
    state belongs to an object found before it (shared Variables)."""

    __slots__ = ("index", "piece")

    def __init__(self, index: int, piece):
        self.index, self.piece = index, piece


def is_slot(value) -> bool:
    return isinstance(value, Slot)


@functools.lru_cache(maxsize=1)
def _register_slot() -> None:
    import jax

    jax.tree_util.register_pytree_node(Slot, lambda s: ((s.piece,), s.index), lambda index, kids: Slot(index, kids[0]))


def _found_nodes(values) -> tuple[list, list]:
    """Each value flattened down to its NNX objects ((leaves, treedef) each), and the distinct
    objects in the order found: the order of the joint split and of the write-back alike."""
    import jax

    flat = [jax.tree.flatten(value, is_leaf=is_graph_node) for value in values]
    nodes, seen = [], set()
    for leaves, _ in flat:
        for leaf in leaves:
            if is_graph_node(leaf) and id(leaf) not in seen:
                seen.add(id(leaf))
                nodes.append(leaf)
    return flat, nodes


def split_values(values) -> tuple[object, list]:
    """(graphdef, slotted trees): the NNX objects all `values` hold, split as one graph, as
    `nnx.jit(f)(*values)` splits them, so the references they share stay shared."""
    import jax

    _register_slot()
    flat, nodes = _found_nodes(values)
    graphdef, state = _nnx().split(tuple(nodes))
    pieces = dict(state.raw_mapping)  # index -> its part: a nested dict of Variables, or one Variable
    index = {id(node): i for i, node in enumerate(nodes)}
    trees = []
    for leaves, treedef in flat:
        slotted = []
        for leaf in leaves:
            if is_graph_node(leaf):
                slotted.append(Slot(index[id(leaf)], pieces.pop(index[id(leaf)], None)))  # popped: carried once
            else:
                slotted.append(leaf)
        trees.append(jax.tree.unflatten(treedef, slotted))
    return graphdef, trees


def _slots(tree) -> list[Slot]:
    import jax

    return [leaf for leaf in jax.tree.leaves(tree, is_leaf=is_slot) if is_slot(leaf)]


def joint_state(trees):
    """The joint state the slots of `trees` carry (an nnx.State keyed by object index)."""
    return _nnx().State({slot.index: slot.piece for tree in trees for slot in _slots(tree) if slot.piece is not None})


def unslotted(tree):
    """The tree with each Slot replaced by its object's state, as `nnx.state(obj)` gives it: what a
    pytree of specs for it matches (`nnx.get_partition_spec(nnx.state(model))`)."""
    import jax

    State = _nnx().State
    return jax.tree.map(lambda leaf: (State(leaf.piece) if isinstance(leaf.piece, dict) else leaf.piece)
                        if is_slot(leaf) else leaf, tree, is_leaf=is_slot)


def with_states(tree):
    """The tree with each NNX Module (or other object with attributes) replaced by `nnx.state` of it;
    Variables stay, as they sit in a State."""
    import jax

    nnx = _nnx()
    if nnx is None:
        return tree
    return jax.tree.map(lambda leaf: nnx.state(leaf) if is_graph_node(leaf) and not is_variable(leaf) else leaf,
                        tree, is_leaf=is_graph_node)


_TAG = "jaxpar_magic cell"  # our nnx.update_context's tag (Flax's own transforms use their own)


class Written:
    """What a cell did to the NNX objects it read, as `nnx.jit` carries it out of its trace: the
    graph after the cell (static: its structure, static attributes such as BatchNorm's
    `use_running_average`, and how it maps onto the objects read) and its state (traced)."""

    __slots__ = ("graphdef", "state")

    def __init__(self, graphdef, state):
        self.graphdef, self.state = graphdef, state


@functools.lru_cache(maxsize=1)
def _register_written() -> None:
    import jax

    def flatten(written):
        leaves, treedef = jax.tree.flatten(written.state)  # arrays only: no NNX object leaves the program
        return leaves, (written.graphdef, treedef)

    def unflatten(aux, leaves):
        graphdef, treedef = aux
        return Written(graphdef, jax.tree.unflatten(treedef, leaves))

    jax.tree_util.register_pytree_node(Written, flatten, unflatten)


class NodeRef:
    """A cell's output that is an NNX object the cell read (or one inside it): its path among the
    objects read. It is bound as the user's very object, as `nnx.jit` returns it."""

    __slots__ = ("path",)

    def __init__(self, path: tuple):
        self.path = path

    def __repr__(self) -> str:
        return f"<the NNX object read at {self.path}>"

    def __eq__(self, other):  # a static leaf of an output: compared by what it stands for
        return isinstance(other, NodeRef) and other.path == self.path

    def __hash__(self):
        return hash(self.path)


def _is_ref_or_node(value) -> bool:
    return isinstance(value, NodeRef) or is_graph_node(value)


def holds_node_refs(value) -> bool:
    if _nnx() is None:
        return False
    import jax

    try:
        return any(isinstance(leaf, NodeRef) for leaf in jax.tree.leaves(value, is_leaf=_is_ref_or_node))
    except (ValueError, TypeError):  # a value JAX cannot flatten (a dict of mixed keys) holds none
        return False


def resolved(value, values):
    """`value` with each NodeRef replaced by the object it stands for among the NNX objects that
    `values` (the inputs read, as they were before the cell) hold."""
    import jax

    nodes = nodes_of(values)

    def follow(ref):
        found = nodes[ref.path[0]]
        for key in ref.path[1:]:
            found = getattr(found, key) if isinstance(key, str) and hasattr(found, key) else found[key]
        return found

    return jax.tree.map(lambda leaf: follow(leaf) if isinstance(leaf, NodeRef) else leaf, value,
                        is_leaf=_is_ref_or_node)


class MergedGraph:
    """Inside a traced program: the inputs' NNX objects merged from their slotted trees, and what
    the cell did to them.

    It follows `nnx.update_context`'s four steps, as nnx.jit does: (1) split the objects outside,
    (2) merge them inside, (3) split them inside after the cell, (4) merge outside into the very
    objects read (`write`), which carries over new state, new or deleted attributes and static
    attributes alike. Steps (1)-(3) run here, once per trace: (1) on a stand-in of the same
    structure (the user's objects never enter a compiled program); (4) runs after each run, on the
    user's objects, which have the stand-in's structure (the program was matched to them)."""

    def __init__(self, graphdef, names, trees):
        import jax

        nnx = _nnx()
        before = joint_state(trees)
        # The leaves as they came in, per object: merge reuses the Variables, so the cell's in-place
        # changes will show in `before` itself.
        self.before = {index: jax.tree.flatten(piece) for index, piece in before.raw_mapping.items()}
        self.graphdef = graphdef
        self._context = nnx.update_context(_TAG)
        self._context.__enter__()
        try:
            stand_in = nnx.merge(graphdef, jax.tree.map(lambda leaf: leaf, before))  # new Variables: not `before`'s
            with nnx.split_context(_TAG) as ctx:
                outer_graphdef, _ = ctx.split(stand_in)  # (1)
            with nnx.merge_context(_TAG, inner=True) as ctx:
                self.nodes = ctx.merge(outer_graphdef, before)  # (2)
        except BaseException:
            self.close()
            raise
        self.values = [with_objects(tree, self.nodes) for tree in trees]
        # Every NNX object and Variable of the graph, by identity: its path among the objects read.
        self._paths = {id(node): path for path, node in nnx.iter_graph(self.nodes)
                       if path and is_graph_node(node)}
        self.labels = {}  # object index -> (the input holding it, where: `box.m`, or the bare name)
        for name, tree in zip(names, trees):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_slot)[0]:
                if is_slot(leaf):
                    self.labels.setdefault(leaf.index, (name, name + jax.tree_util.keystr(path)))

    def close(self) -> None:
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)

    def changed(self) -> tuple[str, str] | None:
        """(input name, where) of the first object the cell changed: its state (new arrays,
        Variables added or removed) or its static attributes (`model.eval()`); None when the cell
        only read them."""
        import jax

        graphdef, after = _nnx().split(self.nodes)
        self._same_graph = graphdef == self.graphdef
        pieces = after.raw_mapping
        first = next(iter(self.labels.values()))
        if not self._same_graph or pieces.keys() != self.before.keys():
            return first
        for index, (leaves, treedef) in self.before.items():
            new_leaves, new_treedef = jax.tree.flatten(pieces[index])
            if new_treedef != treedef or any(new is not old for new, old in zip(new_leaves, leaves)):
                return self.labels.get(index) or first
        return None

    def referred(self, value):
        """`value` (an output of the cell) with each NNX object the cell read, bare or inside a pytree,
        replaced by a NodeRef to it; objects the cell made stay."""
        import jax

        paths = self._paths
        try:
            return jax.tree.map(lambda leaf: NodeRef(paths[id(leaf)]) if is_graph_node(leaf) and id(leaf) in paths
                                else leaf, value, is_leaf=is_graph_node)
        except (ValueError, TypeError):  # JAX cannot flatten it (a dict of mixed keys): the output's own check says so
            return value

    def written(self):
        """What leaves the program for `write` (after `changed`, while still open): when only values
        changed (a training step), the new state alone, which nnx.update writes for less than step
        (4) costs (bench/RESULTS.md); else step (3), the whole graph after the cell."""
        if self._same_graph:
            return _nnx().state(self.nodes)
        _register_written()
        with _nnx().split_context(_TAG) as ctx:
            graphdef, state = ctx.split(self.nodes)
        return Written(graphdef, state)


def nodes_of(values) -> list:
    """The distinct NNX objects `values` hold, in the order split_values numbers them."""
    return _found_nodes(values)[1]


def with_objects(tree, nodes):
    """A slotted tree as the user's value: each Slot replaced by the object it stands for."""
    import jax

    return jax.tree.map(lambda leaf: nodes[leaf.index] if is_slot(leaf) else leaf, tree, is_leaf=is_slot)


def write(values, new) -> None:
    """Write what a cell did (a Written, or a plain joint state: what --in laid out) into the NNX
    objects `values` hold: the user's very objects (their identity is what other code holds), found
    in the order split_values found them."""
    nnx = _nnx()
    nodes = tuple(nodes_of(values))
    if not isinstance(new, Written):
        nnx.update(nodes, new)
        return
    with nnx.update_context(_TAG):
        with nnx.split_context(_TAG) as ctx:
            ctx.split(nodes)  # (1), on the user's objects
        with nnx.merge_context(_TAG, inner=False) as ctx:
            ctx.merge(new.graphdef, new.state)  # (4): into those very objects


def leaves_with_paths(tree, is_leaf=None) -> list[tuple[str, object]]:
    """(path text, leaf) of every leaf, as `jax.tree_util.keystr` writes paths, except that an NNX
    Variable's own `.value` step is left out (`['hidden']['kernel']`, not `['hidden']['kernel'].value`)
    and a Slot adds no step of its own."""
    import jax

    def stop(x):
        return is_variable(x) or is_slot(x) or (is_leaf is not None and is_leaf(x))

    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=stop)[0]:
        where = jax.tree_util.keystr(path)
        if is_slot(leaf):
            found.extend((where + inner, inner_leaf) for inner, inner_leaf in leaves_with_paths(leaf.piece, is_leaf))
            continue
        if not is_variable(leaf):
            found.append((where, leaf))
            continue
        inner = jax.tree_util.tree_flatten_with_path(leaf, is_leaf=is_leaf)[0]
        for inner_path, inner_leaf in inner:
            rest = jax.tree_util.keystr(inner_path)
            found.append((where + ("" if len(inner) == 1 else rest), inner_leaf))
    return found


def graph_items(value) -> list:
    """Every object and attribute in the NNX graphs `value` holds (Modules, Variables, the functions
    stored as attributes): its graphdef compares the user's classes and functions by identity, so
    the fingerprints look at them (cell/fingerprints.py)."""
    import jax

    nnx = _nnx()
    found = []
    for leaf in jax.tree.leaves(value, is_leaf=is_graph_node):
        if is_graph_node(leaf):
            found.extend(node for _, node in nnx.iter_graph(leaf))
    return found


def unhashable_statics(graphdef) -> tuple:
    """The graph's static attributes that cannot be hashed: a dict, list or set config
    (`self.cfg = {'act': 'relu'}`), a tuple holding one, a dataclass with `eq`. The graphdef holds
    the user's very objects, so == on two graphdefs compares such a list with itself and never sees
    it changed in place (`model.sizes.append(16)`; nnx.jit misses it so, in Flax 0.12): the
    fingerprints key them by content and check them again on every re-run (cell/fingerprints.py)."""
    found = {}
    for _, attribute in graphdef.attributes:
        if isinstance(attribute, _nnx().graph.Static) and not _hashable(attribute.value):
            found.setdefault(id(attribute.value), attribute.value)
    return tuple(found.values())


def graph_key(graphdef):
    """A graphdef as a part of a hashable cache key (None for None). Its unhashable static attributes
    (unhashable_statics) stand by their type alone: their content is in the input's structure_key."""
    if graphdef is None or _hashable(graphdef):
        return graphdef
    Static = _nnx().graph.Static
    attributes = tuple((name, attribute) if not isinstance(attribute, Static) or _hashable(attribute.value)
                       else (name, Static, type(attribute.value)) for name, attribute in graphdef.attributes)
    return type(graphdef), tuple(graphdef.nodes), attributes, graphdef.num_leaves


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def split(values: tuple):
    """(graphdef, state) of several values at once, so references they share stay shared."""
    return _nnx().split(values)


def merge(graphdef, state) -> tuple:
    return _nnx().merge(graphdef, state)
