"""Arguments and results of a pmapped function with leaves JAX cannot trace, as `eqx.filter_pmap`
takes them: an Equinox module's activation function, a string in a dict. Array leaves (and numbers)
cross into the program as usual; every other leaf is static: it travels in the pytree structure that
jit compares (its cache key), never as an argument.

`split(value)` wraps such a value in a `Partitioned` node whose children are its traceable leaves;
jit, shard_map and `jax.tree.map` see only those, with the static leaves kept in its structure.
`rebuilt(value)` undoes it, wherever such nodes sit (in a result too).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def _traceable_types() -> tuple:
    import jax
    import numpy as np

    return (jax.Array, np.ndarray, np.generic, bool, int, float, complex, jax.core.Tracer)


class _Static:
    """A static leaf as part of a cache key: equal when it is the same object or compares equal."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        if not isinstance(other, _Static):
            return NotImplemented
        if self.value is other.value:
            return True
        try:
            return bool(type(self.value) is type(other.value) and self.value == other.value)
        except Exception:  # a value whose == is not a truth value (an array-like): by identity only
            return False

    def __hash__(self):
        try:
            return hash((type(self.value), self.value))
        except TypeError:  # unhashable: by identity, as `jax.jit` compares a static function
            return id(self.value)


class Partitioned:
    """A value split into its traceable leaves (this node's children) and the rest (its structure)."""

    __slots__ = ("arrays", "structure")

    def __init__(self, arrays, structure):
        self.arrays = list(arrays)
        self.structure = structure  # (treedef, positions, ((index, _Static), ...), key paths)

    def rebuild(self):
        import jax

        treedef, positions, statics, _ = self.structure
        leaves = [None] * treedef.num_leaves
        for index, static in statics:
            leaves[index] = static.value
        for index, array in zip(positions, self.arrays):
            leaves[index] = array
        return jax.tree.unflatten(treedef, leaves)


def _flatten_with_keys(node: Partitioned):
    return list(zip(node.structure[3], node.arrays)), node.structure


def _flatten(node: Partitioned):
    return node.arrays, node.structure


def _unflatten(structure, arrays):
    return Partitioned(arrays, structure)


@functools.lru_cache(maxsize=1)
def _registered() -> type:
    import jax

    jax.tree_util.register_pytree_with_keys(Partitioned, _flatten_with_keys, _unflatten, _flatten)
    return Partitioned


def split_all(args) -> tuple[list, bool]:
    """Each argument as split() gives it, and whether any of their leaves is a Tracer (a call from
    code already traced); one flatten per argument, the one a call paid for the tracer check alone."""
    import jax

    kinds, tracer = _traceable_types(), jax.core.Tracer
    out, traced = [], False
    for value in args:
        if isinstance(value, kinds):
            traced = traced or isinstance(value, tracer)
            out.append(value)
            continue
        leaves = jax.tree.leaves(value)
        traced = traced or any(isinstance(leaf, tracer) for leaf in leaves)
        out.append(value if all(isinstance(leaf, kinds) for leaf in leaves) else _partitioned(value))
    return out, traced


def split(value):
    """`value` itself when every leaf can be traced (the common case: one flatten, no copy), else a
    Partitioned node holding its traceable leaves, the others static."""
    import jax

    kinds = _traceable_types()
    if isinstance(value, kinds):
        return value
    leaves = jax.tree.leaves(value)
    if all(isinstance(leaf, kinds) for leaf in leaves):
        return value
    return _partitioned(value)


def _partitioned(value) -> Partitioned:
    import jax

    kinds = _traceable_types()
    _registered()
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(value)
    positions = tuple(i for i, (_, leaf) in enumerate(with_paths) if isinstance(leaf, kinds))
    chosen = set(positions)
    statics = tuple((i, _Static(leaf)) for i, (_, leaf) in enumerate(with_paths) if i not in chosen)
    paths = tuple(with_paths[i][0] for i in positions)
    return Partitioned([with_paths[i][1] for i in positions], (treedef, positions, statics, paths))


def has_partitioned(value) -> bool:
    """Whether a Partitioned node sits anywhere in `value` (checked once, while jit traces)."""
    import jax

    return any(isinstance(node, Partitioned) for node in
               jax.tree.leaves(value, is_leaf=lambda node: isinstance(node, Partitioned)))


def rebuilt(value):
    """`value` with every Partitioned node in it rebuilt as the object it stands for."""
    import jax

    if isinstance(value, Partitioned):
        return value.rebuild()
    if isinstance(value, _traceable_types()):
        return value
    return jax.tree.map(lambda node: node.rebuild() if isinstance(node, Partitioned) else node, value,
                        is_leaf=lambda node: isinstance(node, Partitioned))
