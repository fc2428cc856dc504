"""Flax NNX graph objects (Modules, Optimizers, Variables) as cell inputs, the way `nnx.jit` takes them.

NNX objects are mutable Python graphs: a cell that trains `model` in place (`optimizer.update(model,
grads)`) must see objects created at the trace's own level, or Flax refuses ("Cannot extract graph
node from different trace level"). So, like `nnx.jit`, we split them into a static graphdef and a
state pytree on the way in, merge them inside the traced program, and write the new state back into
the user's own objects once the cell has succeeded.

This is the one module that knows about Flax. It never imports Flax: it asks `sys.modules`, so a
user who did not import Flax pays nothing and never loads it (treescope handles frameworks the same way).
"""
from __future__ import annotations

import sys


def _nnx():
    return sys.modules.get("flax.nnx")


def _node_types(nnx) -> tuple:
    return tuple(t for t in (getattr(nnx, "Pytree", None), getattr(nnx, "Object", None), nnx.Variable) if t)


def is_graph_node(value) -> bool:
    """An NNX Module, Optimizer, Variable or other NNX object (never True when Flax was not imported)."""
    nnx = _nnx()
    return nnx is not None and isinstance(value, _node_types(nnx))


def holds_graph_nodes(value) -> bool:
    """The value is an NNX object, or a list/tuple/dict holding some."""
    nnx = _nnx()
    if nnx is None:
        return False
    if is_graph_node(value):
        return True
    if isinstance(value, (list, tuple, dict)):
        import jax

        return any(is_graph_node(leaf) for leaf in jax.tree.leaves(value, is_leaf=is_graph_node))
    return False


def is_variable(value) -> bool:
    nnx = _nnx()
    return nnx is not None and isinstance(value, nnx.Variable)


def leaves_with_paths(tree, is_leaf=None) -> list[tuple[str, object]]:
    """(path text, leaf) of every leaf, as `jax.tree_util.keystr` writes paths, except that an NNX
    Variable's own `.value` step is left out: `['hidden']['kernel']`, not `['hidden']['kernel'].value`."""
    import jax

    def stop(x):
        return is_variable(x) or (is_leaf is not None and is_leaf(x))

    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=stop)[0]:
        where = jax.tree_util.keystr(path)
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


def split(values: tuple):
    """(graphdef, state) of several values at once, so references they share stay shared."""
    return _nnx().split(values)


def merge(graphdef, state) -> tuple:
    return _nnx().merge(graphdef, state)


def state(values):
    return _nnx().state(values)


def update(values, new_state) -> None:
    """Write `new_state` into the user's very objects (their identity is what other code holds)."""
    _nnx().update(values, new_state)
