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


def holds_graph_nodes(value) -> bool:
    """The value is an NNX object, or a pytree of any kind (a list, a dataclass, an Equinox module...)
    holding some. A Module is itself a JAX pytree, so it is found before JAX would flatten it."""
    nnx = _nnx()
    if nnx is None:
        return False
    if is_graph_node(value):
        return True
    import jax

    return any(is_graph_node(leaf) for leaf in jax.tree.leaves(value, is_leaf=is_graph_node))


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


class MergedGraph:
    """Inside a traced program: the inputs' NNX objects merged from their slotted trees, and what
    the cell did to them."""

    def __init__(self, graphdef, names, trees):
        import jax

        before = joint_state(trees)
        # The leaves as they came in, per object: merge reuses the Variables, so the cell's in-place
        # changes will show in `before` itself.
        self.before = {index: jax.tree.flatten(piece) for index, piece in before.raw_mapping.items()}
        self.nodes = _nnx().merge(graphdef, before)
        self.values = [with_objects(tree, self.nodes) for tree in trees]
        self.labels = {}  # object index -> (the input holding it, where: `box.m`, or the bare name)
        for name, tree in zip(names, trees):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_slot)[0]:
                if is_slot(leaf):
                    self.labels.setdefault(leaf.index, (name, name + jax.tree_util.keystr(path)))

    def after(self):
        """The objects' joint state now (after the cell ran)."""
        return _nnx().state(self.nodes)

    def changed(self, after) -> tuple[str, str] | None:
        """(input name, where) of the first object whose state the cell changed (new arrays, or
        Variables added or removed), or None when it only read them."""
        import jax

        pieces = after.raw_mapping
        if pieces.keys() != self.before.keys():
            return next(iter(self.labels.values()))
        for index, (leaves, treedef) in self.before.items():
            new_leaves, new_treedef = jax.tree.flatten(pieces[index])
            if new_treedef != treedef or any(new is not old for new, old in zip(new_leaves, leaves)):
                return self.labels.get(index) or next(iter(self.labels.values()))
        return None


def nodes_of(values) -> list:
    """The distinct NNX objects `values` hold, in the order split_values numbers them."""
    return _found_nodes(values)[1]


def with_objects(tree, nodes):
    """A slotted tree as the user's value: each Slot replaced by the object it stands for."""
    import jax

    return jax.tree.map(lambda leaf: nodes[leaf.index] if is_slot(leaf) else leaf, tree, is_leaf=is_slot)


def write(values, new_state) -> None:
    """Write the joint `new_state` into the NNX objects `values` hold: the user's very objects
    (their identity is what other code holds), found in the order split_values found them."""
    _nnx().update(tuple(nodes_of(values)), new_state)


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


def split(values: tuple):
    """(graphdef, state) of several values at once, so references they share stay shared."""
    return _nnx().split(values)


def merge(graphdef, state) -> tuple:
    return _nnx().merge(graphdef, state)
