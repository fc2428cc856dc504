"""What a cell's constants contribute to its cache key: a fingerprint that changes when the value
the compiled program baked in would change.

`jax.jit` reads globals once, at trace time. A notebook tool must not keep the first run's values:
re-running a cell after changing a variable is what notebooks are for. So a constant is keyed by

- its value, for plain Python values and small containers of them;
- its content, for small NumPy arrays (a NumPy array can be changed in place);
- for a function, its own identity plus the fingerprints of the globals its code names, its
  closure cells and its defaults, followed through the helpers it calls (at most MAX_DEPTH deep,
  MAX_VALUES values in all);
- its identity, for everything else (modules, classes, jax.Arrays, which are immutable, and large
  NumPy arrays: an in-place change to those is not seen, which the README says).

Identities are held weakly wherever Python allows it, so a cache key never keeps alive an array,
a function or a module the user dropped; a key whose object died compares unequal to everything.
"""
from __future__ import annotations

import types
import weakref

MAX_DEPTH = 4  # helper -> helper -> helper -> helper: deeper calls are keyed by identity only
MAX_VALUES = 512  # values fingerprinted for one constant, whatever its shape
MAX_ITEMS = 64  # containers larger than this are keyed by identity
SMALL_ARRAY_BYTES = 1 << 16  # NumPy arrays up to 64 KiB are keyed by content

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class Ref:
    """A key part equal only to the very same object while it lives, holding it weakly.

    id() alone is not enough (a freed object's address is reused); a strong reference would keep
    the object alive for as long as the cache keeps the key.
    """

    __slots__ = ("_ref", "_strong", "_id", "__weakref__")

    def __init__(self, value):
        self._id = id(value)
        try:
            self._ref, self._strong = weakref.ref(value), None
        except TypeError:  # lists, dicts, ints' subclasses...: only a strong reference is safe
            self._ref, self._strong = None, value

    def get(self):
        return self._strong if self._ref is None else self._ref()

    def __eq__(self, other):
        if not isinstance(other, Ref) or other._id != self._id:
            return False
        mine = self.get()
        return mine is not None and mine is other.get()

    def __hash__(self):
        return self._id

    def __repr__(self):
        return f"Ref({type(self.get()).__name__} at {self._id:#x})"


def fingerprint(value):
    """A hashable key part for `value` (see the module docstring)."""
    return _Walk().fingerprint(value, 0)


def names_read(code: types.CodeType) -> tuple[str, ...]:
    """Global names a function's code (and the lambdas, comprehensions and nested functions in
    it) may read: a superset is fine, only names found in its globals are fingerprinted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(names_read(const))
    return tuple(sorted(names))


class _Walk:
    def __init__(self):
        self.budget = MAX_VALUES
        self.open: set[int] = set()  # functions being walked: recursion between helpers ends here

    def fingerprint(self, value, depth: int):
        self.budget -= 1
        if isinstance(value, _PLAIN) and type(value) in _PLAIN:
            return (type(value).__name__, value)
        if self.budget <= 0:
            return Ref(value)
        if isinstance(value, (tuple, list, set, frozenset)) and len(value) <= MAX_ITEMS:
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return (type(value).__name__,) + tuple(self.fingerprint(v, depth) for v in items)
        if isinstance(value, dict) and len(value) <= MAX_ITEMS:
            return ("dict",) + tuple((self.fingerprint(k, depth), self.fingerprint(v, depth)) for k, v in value.items())
        if isinstance(value, types.FunctionType):
            return self._function(value, depth)
        if isinstance(value, types.MethodType):
            return ("method", self.fingerprint(value.__func__, depth), Ref(value.__self__))
        if _is_small_numpy(value):
            return ("ndarray", value.shape, value.dtype.str, value.tobytes())
        wrapped = getattr(value, "__wrapped__", None)  # jax.jit(f), functools.wraps, our ParallelFunction
        if isinstance(wrapped, types.FunctionType) and not isinstance(value, type):
            return ("wrapper", Ref(value), self._function(wrapped, depth))
        return Ref(value)

    def _function(self, fn: types.FunctionType, depth: int):
        key = id(fn)
        if depth >= MAX_DEPTH or key in self.open:
            return ("function", Ref(fn))
        self.open.add(key)
        try:
            glob = fn.__globals__
            reads = tuple(
                (name, self.fingerprint(glob[name], depth + 1))
                for name in names_read(fn.__code__)
                if name in glob and not isinstance(glob[name], types.ModuleType)
            )
            cells = tuple(self.fingerprint(_cell(c), depth + 1) for c in fn.__closure__ or ())
            defaults = self.fingerprint(fn.__defaults__, depth + 1) if fn.__defaults__ else ()
            kwdefaults = self.fingerprint(fn.__kwdefaults__, depth + 1) if fn.__kwdefaults__ else ()
        finally:
            self.open.discard(key)
        return ("function", Ref(fn), reads, cells, defaults, kwdefaults)


_EMPTY = object()


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return _EMPTY


def _is_small_numpy(value) -> bool:
    import sys

    np = sys.modules.get("numpy")  # never import NumPy just to ask
    return np is not None and type(value) is np.ndarray and value.nbytes <= SMALL_ARRAY_BYTES
