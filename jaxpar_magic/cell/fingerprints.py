"""What a cell's constants contribute to its cache key: a fingerprint that changes when the value
the compiled program baked in would change.

`jax.jit` reads globals once, at trace time. A notebook tool must not keep the first run's values:
re-running a cell after changing a variable is what notebooks are for. So a constant is keyed by

- its value and its Python type, for plain Python values and small containers of them (`1`, `True`
  and `1.0` differ: JAX gives them different dtypes); a float by its bits, so `-0.0` is not `0.0`
  and NaNs differ by payload, as the compiled program would;
- its content, for small NumPy arrays and NumPy scalars (a NumPy array can be changed in place);
- for a function written by the user, its own identity and its code's (a module reloaded by
  `%autoreload` swaps the code of the very same function) plus the fingerprints of the globals its
  code names, its closure cells and its defaults, followed through the helpers it calls (at most
  MAX_DEPTH deep, MAX_VALUES values in all);
- for a wrapper, what it wraps: `__wrapped__` (jax.grad, jax.vmap, jax.value_and_grad, jax.jit,
  jax.checkpoint, functools.wraps), `.func`, `.args` and `.keywords` (functools.partial,
  jax.tree_util.Partial), the closure cells of a library function (the values it was made from);
- for an object of a class the user wrote (a callable object, a config), its identity plus its
  own attributes, and the class's methods and class attributes, followed like functions;
- its identity, for everything else (modules, library classes and their objects, jax.Arrays, which
  are immutable, and large NumPy arrays: an in-place change to those is not seen, which the README
  says).

Library code (the standard library, this package, and installed distributions wherever they were
installed: cell/origins.py) is never walked through its globals: its module state is not the user's
to change, and walking it would spend the budget.

Identities are held weakly wherever Python allows it, so a cache key never keeps alive an array,
a function or a module the user dropped; a key whose object died compares unequal to everything.
"""
from __future__ import annotations

import functools
import struct
import sys
import types
import weakref

from .origins import is_library_file

MAX_DEPTH = 4  # helper -> helper -> helper -> helper: deeper calls are keyed by identity only
MAX_VALUES = 512  # values fingerprinted for one constant, whatever its shape
MAX_ITEMS = 64  # containers larger than this are keyed by identity
SMALL_ARRAY_BYTES = 1 << 16  # NumPy arrays up to 64 KiB are keyed by content

_BY_VALUE = frozenset((type(None), bool, int, str, bytes))  # == on these is what a program sees
_DOUBLE = struct.Struct("<d")  # a float's bits: -0.0 and each NaN payload are their own key
# A class's own entries that say nothing about what its methods compute.
_CLASS_BOOKKEEPING = frozenset(("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__",
                                "__firstlineno__", "__static_attributes__", "__annotations__", "__slots__",
                                "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__orig_bases__",
                                "__parameters__", "__abstractmethods__", "_abc_impl"))


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


def traced_callables(values) -> list:
    """The user's functions, and the wrappers around them, that `values` reach: what a new trace of
    a cell must trace afresh (cell/jax_traces.py). JAX keeps the jaxpr it traced for a function,
    keyed by the function object and its argument shapes alone, in several places: a
    `jax.jit`-wrapped helper called from a trace, the body handed to `lax.scan` or `lax.cond`, a
    function under `jax.checkpoint`. After `scale` changed, a new cell program would be handed the
    trace made with the old `scale`, silently (plain JAX does the same)."""
    walk = _Walk(collect_callables=True)
    for value in values:
        walk.fingerprint(value, 0)
    return list({id(c): c for c in walk.callables}.values())


def custom_nodes(treedef) -> list[tuple[type, object]]:
    """(node type, aux data) of each node of a pytree structure that is not a plain container: a
    jax.tree_util.Partial and its function, an Equinox module's class and static fields. A
    structure compares these with ==, which sees neither a changed global that the function reads
    nor -0.0 against 0.0."""
    from jax.tree_util import treedef_children

    found, stack = [], [treedef]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is None:  # a leaf
            continue
        if not issubclass(data[0], _PLAIN_NODES):  # namedtuples are tuples, OrderedDicts dicts
            found.append(data)
        stack.extend(treedef_children(node))
    return found


def structure_key(nodes, graph_items=(), graph_statics=()) -> tuple:
    """The fingerprint of a structure's custom nodes (custom_nodes), of the user's classes and
    functions in an NNX graph (`graph_items`, nnx_graphs.graph_items) and of its static attributes
    that cannot be hashed (`graph_statics`, nnx_graphs.unhashable_statics: a dict, list or set
    config): what a cell is compiled for beyond what == on the structure says (-0.0 against 0.0,
    1 against 1.0, what a function or a user's class, e.g. a module's __call__, reads)."""
    return (tuple((fingerprint(node_type), fingerprint(aux)) for node_type, aux in nodes)
            + tuple(fingerprint(part) for part in _user_parts(graph_items))
            + tuple(fingerprint(value) for value in graph_statics))


def held_callables(nodes, graph_items=(), graph_statics=()) -> tuple:
    """The user's classes among custom nodes' types (an Equinox module of theirs), the callables
    and objects of the user's in their aux data (a Partial's function), the user's classes and
    functions in an NNX graph and its unhashable static attributes, each with its fingerprint: ==
    on two structures (and on two NNX graphdefs) compares these by identity, or, for a graph's
    static `self.sizes = [4, 8]`, by content of the very list both graphdefs hold, so an identical
    re-run need only fingerprint these very objects again to see a global they read change, or the
    list grow in place (`model.sizes.append(16)`)."""
    found = [(node_type, fingerprint(node_type)) for node_type, _ in nodes if _user_class(node_type)]
    found += [(part, fingerprint(part)) for part in _user_parts(graph_items)]
    found += [(value, fingerprint(value)) for value in graph_statics]
    stack = [aux for _, aux in nodes]
    while stack:
        item = stack.pop()
        if isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif callable(item) or _user_class(type(item)):
            found.append((item, fingerprint(item)))
    return tuple(found)


def _user_parts(items) -> list:
    """Of a graph's objects and attributes: the class of each object of a user's class, and each
    function of the user's, once."""
    parts = {}
    for item in items:
        if _user_class(type(item)):
            parts.setdefault(id(type(item)), type(item))
        elif isinstance(item, types.FunctionType) and _user_callable(item):
            parts.setdefault(id(item), item)
    return list(parts.values())


_PLAIN_NODES = (tuple, list, dict, type(None))  # their aux data: keys, or nothing


def names_read(code: types.CodeType) -> tuple[str, ...]:
    """Global names a function's code (and the lambdas, comprehensions and nested functions in
    it) may read: a superset is fine, only names found in its globals are fingerprinted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(names_read(const))
    return tuple(sorted(names))


class _Walk:
    def __init__(self, collect_callables: bool = False):
        self.budget = MAX_VALUES
        self.open: set[int] = set()  # functions, wrappers, objects being walked: a cycle ends here
        self.callables: list | None = [] if collect_callables else None  # see traced_callables

    def fingerprint(self, value, depth: int):
        self.budget -= 1
        kind = type(value)
        if kind in _BY_VALUE:
            return (kind.__name__, value)
        if kind is float:
            return ("float", _DOUBLE.pack(value))
        if kind is complex:
            return ("complex", _DOUBLE.pack(value.real), _DOUBLE.pack(value.imag))
        if self.budget <= 0:
            return Ref(value)
        if isinstance(value, (tuple, list, set, frozenset)) and len(value) <= MAX_ITEMS:
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            return (kind.__name__,) + tuple(self.fingerprint(v, depth) for v in items)
        if isinstance(value, dict) and len(value) <= MAX_ITEMS:
            return ("dict",) + tuple((self.fingerprint(k, depth), self.fingerprint(v, depth)) for k, v in value.items())
        if kind is types.FunctionType:
            return self._function(value, depth)
        if kind is types.MethodType:
            return ("method", self.fingerprint(value.__func__, depth), self.fingerprint(value.__self__, depth))
        numpy = _numpy_fingerprint(value)
        if numpy is not None:
            return numpy
        if isinstance(value, (type, types.ModuleType)):
            return self._class(value, depth) if isinstance(value, type) and _user_class(value) else Ref(value)
        return self._guarded(value, depth, self._wrapper_or_object)

    def _guarded(self, value, depth: int, walk):
        key = id(value)
        if key in self.open:
            return Ref(value)
        self.open.add(key)
        try:
            return walk(value, depth)
        finally:
            self.open.discard(key)

    def _wrapper_or_object(self, value, depth: int):
        if isinstance(value, functools.partial):  # jax.tree_util.Partial too
            self._collect(value)
            return ("partial", type(value).__name__, self.fingerprint(value.func, depth),
                    self.fingerprint(value.args, depth), self.fingerprint(value.keywords, depth))
        wrapped = _wrapped(value)
        if wrapped is not None:  # jax.jit(f), a custom_jvp, our ParallelFunction...: what it wraps
            self._collect(value)
            return ("wrapper", Ref(value), self.fingerprint(wrapped, depth))
        if _user_class(type(value)):
            return self._object(value, depth)
        return Ref(value)

    def _function(self, fn: types.FunctionType, depth: int):
        key = id(fn)
        if depth >= MAX_DEPTH or key in self.open:
            return ("function", Ref(fn))
        self.open.add(key)
        try:
            if is_library_file(fn.__code__.co_filename):
                wrapped = _wrapped(fn)  # jax.grad(f) and the like: f is what can change
                if wrapped is not None:
                    self._collect(fn)
                    return ("function", Ref(fn), self.fingerprint(wrapped, depth))
                cells = tuple(self.fingerprint(_cell(c), depth + 1) for c in fn.__closure__ or ())
                return ("function", Ref(fn), Ref(fn.__code__), cells)  # the values a library factory closed over
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
        if self.callables is not None:
            self.callables.append(fn)
        return ("function", Ref(fn), Ref(fn.__code__), reads, cells, defaults, kwdefaults)

    def _collect(self, wrapper) -> None:
        """A wrapper whose trace JAX may keep (jax.jit(f) is keyed by f, jax.jit(jax.grad(f)) by
        grad's function): collected when what it wraps is the user's."""
        if self.callables is not None and _user_callable(wrapper):
            self.callables.append(wrapper)

    def _object(self, value, depth: int):
        """An object of a user's class: who it is, what it holds, and what its class's methods read."""
        if self.callables is not None and callable(value):
            self.callables.append(value)
        if depth >= MAX_DEPTH:
            return ("object", Ref(value))
        attributes = getattr(value, "__dict__", None)
        held = self.fingerprint(attributes, depth + 1) if isinstance(attributes, dict) else ()
        slots = tuple((name, self.fingerprint(getattr(value, name, _EMPTY), depth + 1))
                      for name in _slot_names(type(value)))
        return ("object", Ref(value), self.fingerprint(type(value), depth + 1), held, slots)

    def _class(self, cls: type, depth: int):
        """A user's class: its methods (followed like functions) and class attributes, own and inherited."""
        key = id(cls)
        if depth >= MAX_DEPTH or key in self.open:
            return ("class", Ref(cls))
        self.open.add(key)
        try:
            members = tuple(
                (name, self.fingerprint(_member_function(member), depth))
                for owner in cls.__mro__ if _user_class(owner)
                for name, member in vars(owner).items()
                if name not in _CLASS_BOOKKEEPING and not isinstance(member, _SLOT_DESCRIPTORS)
            )
        finally:
            self.open.discard(key)
        return ("class", Ref(cls), members)


_EMPTY = object()
_SLOT_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType)


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return _EMPTY


def _member_function(member):
    """The function behind a class member (a staticmethod's, a classmethod's, a property's getter)."""
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return (member.fget, member.fset)
    return member


def _slot_names(cls: type) -> tuple[str, ...]:
    names = []
    for owner in cls.__mro__:
        slots = vars(owner).get("__slots__", ())
        names.extend((slots,) if isinstance(slots, str) else slots)
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def _wrapped(value):
    """What `value` wraps (its `__wrapped__`), or None. A class's `__wrapped__` is not a wrapper's."""
    try:
        wrapped = getattr(value, "__wrapped__", None)
    except Exception:  # a __getattr__ that raises something else than AttributeError
        return None
    return None if wrapped is value or isinstance(value, type) else wrapped


def _user_callable(value) -> bool:
    """Whether a callable is the user's or wraps one of the user's (through partials, bound methods
    and `__wrapped__`): its traces may have read globals that change."""
    for _ in range(MAX_VALUES):  # a chain of wrappers, never a cycle
        if isinstance(value, functools.partial):
            value = value.func
        elif isinstance(value, types.MethodType):
            value = value.__func__
        elif isinstance(value, types.FunctionType) and not is_library_file(value.__code__.co_filename):
            return True
        elif _user_class(type(value)):
            return True
        else:
            value = _wrapped(value)
            if value is None:
                return False
    return False


def _user_class(cls: type) -> bool:
    """A class written by the user: in the notebook, a script, or a module of theirs."""
    module = getattr(cls, "__module__", None)
    if module == "__main__":
        return True
    if module is None or module == "builtins":
        return False
    found = sys.modules.get(module)
    filename = getattr(found, "__file__", None)
    return filename is not None and not is_library_file(filename)


def _numpy_fingerprint(value):
    """Small NumPy arrays and NumPy scalars by content (dtype, shape, bytes), else None."""
    np = sys.modules.get("numpy")  # never import NumPy just to ask
    if np is None:
        return None
    if type(value) is np.ndarray and value.nbytes <= SMALL_ARRAY_BYTES:
        return ("ndarray", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return ("numpy scalar", value.dtype.str, value.tobytes())
    return None
