"""Dicts whose keys mix types (`{0: .5, 'lr': .1}`): JAX sorts a dict's keys to flatten it, so it
cannot flatten these ("Comparator raised exception while sorting pytree dictionary keys").

Plain `jax.jit` only flattens its arguments and results: a function that *closes over* such a dict
works. So a cell that reads one without arrays in it takes it as a constant, and one the cell needs
to trace or return is named in a UsageError. These helpers find the dict (only once JAX has
refused a value: they cost nothing on the way of values it flattens).
"""
from __future__ import annotations

import collections


def is_unsortable(value) -> bool:
    """A dict JAX sorts (dict, defaultdict; an OrderedDict keeps its order) whose keys cannot be sorted."""
    if type(value) is not dict and type(value) is not collections.defaultdict:
        return False
    try:
        sorted(value)
    except TypeError:
        return True
    return False


def first_unsortable(value) -> tuple[str, object] | None:
    """(its path, the dict) of the first dict in `value` whose keys JAX cannot sort, or None."""
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(value, is_leaf=is_unsortable)[0]:
        if is_unsortable(leaf):
            return jax.tree_util.keystr(path), leaf
    return None


def holds(value, wanted) -> bool:
    """Whether any leaf of `value`, inside such dicts too, passes `wanted` (an array, a tracer)."""
    import jax

    for leaf in jax.tree.leaves(value, is_leaf=is_unsortable):
        if is_unsortable(leaf):
            if holds(list(leaf.values()), wanted):
                return True
        elif wanted(leaf):
            return True
    return False


def key_types(mapping: dict) -> str:
    """`int and str`: the key types a dict mixes, for a message."""
    names = sorted({type(key).__name__ for key in mapping})
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
