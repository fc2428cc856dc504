"""How a run of an exercise cell holds its values without keeping them alive, and how it tells a
value changed in place later (face/exercises/__init__.py, "the answers as the cell left them")."""
from __future__ import annotations

import weakref

GONE = object()  # a held value that is no longer there


class Held:
    """A run's value, held so that it does not keep the user's arrays alive (`del answer` frees
    them): by a weak reference where the value takes one, as itself when it holds no array (a
    number), else by identity (a dict of arrays), found again in the namespace."""

    __slots__ = ("ref", "ident")

    def __init__(self, value):
        self.ident = id(value)
        try:
            self.ref = weakref.ref(value)
        except TypeError:
            self.ref = None if _holds_arrays(value) else (lambda: value)

    def matches(self, candidate) -> bool:
        return candidate is self.get() if self.ref is not None else id(candidate) == self.ident

    def get(self, namespace=None, name=None):
        """The value, or GONE (freed, or held by identity and no longer under `name` in `namespace`)."""
        if self.ref is not None:
            value = self.ref()
            return GONE if value is None else value
        candidate = GONE if namespace is None else namespace.get(name, GONE)
        return candidate if candidate is not GONE and id(candidate) == self.ident else GONE


def _holds_arrays(value) -> bool:
    import jax

    from ...cell.inputs import is_array

    return any(is_array(leaf) for leaf in jax.tree.leaves(value))


def held(values: dict) -> dict:
    return {name: Held(value) for name, value in values.items()}


def mutable(value) -> bool:
    import numpy as np

    return isinstance(value, (dict, list, np.ndarray)) or (
        isinstance(value, tuple) and any(isinstance(v, (dict, list, np.ndarray)) for v in value))


def digest(value):
    """What a mutable answer (a dict, list or NumPy array, or a tuple of them) was when the cell
    ended, small enough to keep: its structure, each NumPy leaf's dtype, shape and a hash of its
    bytes, each other leaf's identity (JAX arrays are immutable). A later in-place change shows as
    another digest, and the check refuses to grade it, without keeping the arrays alive (issue 33
    item 15 keeps no answer's arrays; issue 30 grades an answer only as the cell left it)."""
    import hashlib

    import jax
    import numpy as np

    def leaf(x):
        if isinstance(x, np.ndarray):
            return ("np", x.dtype.str, x.shape, hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=16).digest())
        if isinstance(x, (int, float, complex, str, bytes, bool, type(None))):
            return (type(x), x)
        return ("id", id(x))

    try:
        leaves, tree = jax.tree_util.tree_flatten(value)
    except Exception:  # a value jax cannot walk: its identity alone
        return ("id", id(value))
    return tree, tuple(leaf(x) for x in leaves)
