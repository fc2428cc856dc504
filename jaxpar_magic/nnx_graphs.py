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
