"""What a cell can change in the kernel, taken before it runs: compared afterwards, and put back.

Two users (face/exercises/guard.py, face/exercises/sandbox.py):

* an exercise cell may set its answers and names of its own, and change what they hold, nothing
  else: it may not bind a name the kernel held before it (the course's constants, helpers,
  `check`) to another value, nor change a function's code or defaults, the package's and JAX's
  functions, IPython's hooks and input transformers, the magics, the import machinery, or leave a
  thread running (a cell may append to a list it was given: issue 40's log);
* a check's re-run of an exercise cell (``attempt(NAME).follows(...)``) must leave everything as it
  was: `contents=True` adds the containers and NumPy arrays the namespace reaches (sandbox.py adds
  objects' attributes, Flax NNX variables and files).

A snapshot holds references (and shallow copies of containers), never copies of JAX arrays, which
are immutable; NumPy arrays are hashed, and copied only when small enough to put back.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import sys
import threading
import types

from ...cell.interrupts import host_value

_ABSENT = object()
_DEPTH = 3  # containers inside containers, from a name in the namespace
_MOST_CONTAINERS = 5000
_MOST_ITEMS = 1000  # items of one container looked into
_HASHED = 64 * 2**20  # a NumPy array hashed whole up to this size; larger ones by identity
_COPIED = 4 * 2**20  # and copied (to be put back) up to this size
_MODULES = ("jax", "numpy", "jaxpar_magic", "flax", "optax", "equinox", "math", "functools", "operator")
# IPython's own names, which its history machinery sets.
_IPYTHON = ("_", "__", "___", "_i", "_ii", "_iii", "_oh", "_ih", "_dh", "In", "Out", "_exit_code")
_SHELL_METHODS = ("run_cell", "run_cell_async", "run_cell_magic", "run_line_magic", "run_code", "run_ast_nodes",
                  "transform_cell", "showtraceback", "showsyntaxerror", "push", "ex", "ev", "user_expressions",
                  "safe_execfile", "system")


def ipython_name(name: str) -> bool:
    return name in _IPYTHON or (name.startswith(("_i", "_")) and name.lstrip("_i").isdigit())


class Snapshot:
    """The kernel's state before a cell (see the module's docstring); `changes()` names what differs
    now, `restore()` puts it back and names what it could not."""

    def __init__(self, shell, contents: bool = False):
        self.shell = shell
        self.contents = contents  # compare (and put back) containers and NumPy arrays too
        namespace = shell.user_ns
        self.names = {name: value for name, value in namespace.items() if not ipython_name(name)}
        self.containers: dict[int, tuple] = {}  # id -> (container, shallow copy, where)
        self.arrays: dict[int, tuple] = {}  # id -> (NumPy array, hash, copy or None, where)
        self.functions: dict[int, tuple] = {}  # id -> (function, its parts, where)
        self.walked: set[int] = set()
        for name, value in self.names.items():
            self._walk(value, name, 0)
        self.modules = {module.__name__: (module, _module_parts(module)) for module in _modules(namespace)}
        self.classes = {id(c): (c, _class_parts(c)) for c in _classes(namespace)}
        for module, _ in self.modules.values():  # the package's own functions: their code and defaults
            if module.__name__.startswith("jaxpar_magic"):
                for value in list(vars(module).values()):
                    if isinstance(value, types.FunctionType) and id(value) not in self.functions:
                        self.functions[id(value)] = (value, _function_parts(value), f"{module.__name__}.{value.__name__}")
        self.imported = {name: module for name, module in sys.modules.items()}
        self.hooks = _shell_hooks(shell)  # the objects themselves: their ids stay theirs
        self.threads = set(threading.enumerate())

    # --- reading what is there ------------------------------------------------------------------

    def _walk(self, value, where: str, depth: int) -> None:
        import numpy as np

        if id(value) in self.walked or len(self.walked) > _MOST_CONTAINERS:
            return
        self.walked.add(id(value))
        if isinstance(value, (dict, list, set, bytearray)):
            if self.contents:
                self.containers[id(value)] = (value, _copy(value), where)
            if depth < _DEPTH:
                items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
                for key, item in itertools.islice(items, _MOST_ITEMS):
                    self._walk(item, f"{where}[{key!r}]" if isinstance(value, dict) else where, depth + 1)
        elif isinstance(value, tuple) and depth < _DEPTH:
            for item in value[:_MOST_ITEMS]:
                self._walk(item, where, depth + 1)
        elif isinstance(value, np.ndarray) and value.dtype != object:
            if not self.contents:
                return
            small = value.nbytes <= _COPIED
            self.arrays[id(value)] = (value, _hash(value), value.copy() if small else None, where)
        elif isinstance(value, types.FunctionType) and id(value) not in self.functions:
            self.functions[id(value)] = (value, _function_parts(value), where)

    # --- what changed -----------------------------------------------------------------------------

    def changes(self, allowed: set[str] = frozenset()) -> list[str]:
        """What differs from the snapshot, each in a few words naming it (names in `allowed`, and
        names the snapshot did not hold, may change)."""
        namespace = self.shell.user_ns
        found = []
        for name, value in self.names.items():
            now = namespace.get(name, _ABSENT)
            if name not in allowed and now is not value and not same_value(now, value):
                found.append(f"rebinds `{name}`, defined before it, to another value" if now is not _ABSENT
                             else f"deletes `{name}`, defined before it")
        for container, copy, where in self.containers.values() if self.contents else ():
            if not _same_content(container, copy):
                found.append(f"changes `{where}` in place")
        for array, digest, _, where in self.arrays.values() if self.contents else ():
            if _hash(array) != digest:
                found.append(f"changes the NumPy array `{where}` in place")
        for function, parts, where in self.functions.values():
            if _function_parts(function) != parts:
                found.append(f"changes the code or defaults of `{where}`")
        for name, (module, parts) in self.modules.items():
            changed = _changed_keys(parts, _module_parts(module))
            if changed:
                found.append(f"replaces `{name}.{changed[0]}`")
        for cls, parts in self.classes.values():
            changed = _changed_keys(parts, _class_parts(cls))
            if changed:
                found.append(f"changes the class `{cls.__name__}` (`{changed[0]}`)")
        replaced = [name for name, module in self.imported.items() if sys.modules.get(name) is not module
                    and _guarded_module(name)]
        if replaced:
            found.append(f"replaces the module `{replaced[0]}`")
        now = _shell_hooks(self.shell)
        hooks = _identities(now)
        for part, before in _identities(self.hooks).items():
            if hooks.get(part) != before and not (part == "event callbacks" and _front_end_added(self.hooks[part],
                                                                                                   now[part])):
                found.append(f"changes IPython's {part}")
        left = [t for t in threading.enumerate() if t not in self.threads and t.is_alive()
                and not t.name.startswith("jaxpar")]
        if left:
            found.append(f"leaves a thread running ({left[0].name})")
        return found

    # --- putting it back --------------------------------------------------------------------------

    def restore(self, names: bool = True) -> list[str]:
        """Put back what changed; the few words of each change that cannot be undone."""
        namespace = self.shell.user_ns
        if names:
            for name in [n for n in namespace if n not in self.names and not ipython_name(n)]:
                del namespace[name]
            for name, value in self.names.items():
                if namespace.get(name, _ABSENT) is not value:
                    namespace[name] = value
        for container, copy, _ in self.containers.values():
            if not _same_content(container, copy):
                _put_back(container, copy)
        lost = []
        for array, digest, copy, where in self.arrays.values():
            if _hash(array) != digest:
                if copy is None or not array.flags.writeable:
                    lost.append(f"the NumPy array `{where}`")
                else:
                    array[...] = copy
        for function, parts, _ in self.functions.values():
            if _function_parts(function) != parts:
                _put_function_back(function, parts)
        for module, parts in self.modules.values():
            _put_attributes_back(module, parts, _module_parts(module))
        for cls, parts in self.classes.values():
            _put_attributes_back(cls, parts, _class_parts(cls))
        for name, module in self.imported.items():
            if sys.modules.get(name) is not module and _guarded_module(name):
                sys.modules[name] = module
        _put_shell_hooks_back(self.shell, self.hooks)
        left = [t for t in threading.enumerate() if t not in self.threads and t.is_alive()
                and not t.name.startswith("jaxpar")]
        lost += [f"the thread {t.name} (it keeps running: restart the kernel)" for t in left[:1]]
        return lost


def same_value(now, before, depth: int = 0) -> bool:
    """`now` is `before` bound again with the same value: the same plain value (`n = 8` where `n` was
    8), equal arrays (a temporary the cell computes again), a function of the same code, defaults and
    closure, containers of such values. A different value, or one too large to compare, is not."""
    if now is before:
        return True
    if type(now) is not type(before) or depth > 3:
        return False
    if isinstance(now, (bool, int, float, complex, str, bytes, type(None))):
        return now == before
    if isinstance(now, (tuple, list)):
        return len(now) == len(before) and all(same_value(a, b, depth + 1) for a, b in zip(now, before))
    if isinstance(now, dict):
        return now.keys() == before.keys() and all(same_value(now[k], before[k], depth + 1) for k in now)
    if isinstance(now, types.FunctionType):
        return (now.__code__ == before.__code__ and now.__globals__ is before.__globals__
                and same_value(now.__defaults__, before.__defaults__, depth + 1)
                and same_value(now.__kwdefaults__, before.__kwdefaults__, depth + 1)
                and same_value([_cell_contents(c) for c in now.__closure__ or ()],
                               [_cell_contents(c) for c in before.__closure__ or ()], depth + 1))
    return _same_array(now, before)


def _same_array(now, before) -> bool:
    import numpy as np

    shape, dtype = getattr(now, "shape", None), getattr(now, "dtype", None)
    if shape is None or dtype is None or not hasattr(now, "__array__"):
        return False
    if shape != before.shape or dtype != before.dtype or getattr(now, "nbytes", _HASHED + 1) > _HASHED:
        return False
    try:
        return bool(np.array_equal(host_value(now), host_value(before), equal_nan=dtype.kind in "fc"))
    except Exception:  # a deleted array, a key array: not comparable, so not the same
        return False


# --- the parts compared ------------------------------------------------------------------------------

def _copy(container):
    return dict(container) if isinstance(container, dict) else (
        set(container) if isinstance(container, set) else list(container))


def _same_content(container, copy) -> bool:
    if isinstance(container, dict):
        return len(container) == len(copy) and all(
            key in copy and container[key] is copy[key] for key in container)
    if isinstance(container, set):
        return container == copy
    return len(container) == len(copy) and all(a is b for a, b in zip(container, copy))


def _put_back(container, copy) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(copy)
    elif isinstance(container, set):
        container.clear()
        container.update(copy)
    else:
        container[:] = copy


def _hash(array) -> tuple:
    import numpy as np

    if array.nbytes > _HASHED:
        return (array.dtype.str, array.shape, id(array))
    return (array.dtype.str, array.shape, hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).digest())


def _function_parts(function) -> tuple:
    defaults = function.__defaults__
    kwdefaults = function.__kwdefaults__
    closure = tuple(id(_cell_contents(cell)) for cell in function.__closure__ or ())
    return (function.__code__, defaults, tuple(map(id, defaults or ())), dict(kwdefaults or {}), closure)


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _put_function_back(function, parts) -> None:
    code, defaults, _, kwdefaults, _ = parts
    function.__code__ = code
    function.__defaults__ = defaults
    function.__kwdefaults__ = kwdefaults or None


def _is_callable_part(value) -> bool:
    """A function, class, module or method-like object (a descriptor): what a monkey patch replaces.
    A module's or class's plain data (a cache, a lazily made view library) may change."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, property,
                          staticmethod, classmethod, functools.partial)):
        return True
    return callable(value) and not type(value).__module__.startswith("jaxpar_magic")


def _module_parts(module) -> dict:
    """A module's functions, classes and submodules: the names a monkey patch would replace."""
    return {name: value for name, value in list(vars(module).items()) if _is_callable_part(value)}


def _class_parts(cls) -> dict:
    return {name: value for name, value in list(vars(cls).items()) if _is_callable_part(value)}


def _changed_keys(before: dict, now: dict) -> list[str]:
    changed = [key for key, value in before.items() if now.get(key, _ABSENT) is not value]
    # a new function or class on a module or class shadows what was found before (a new submodule is an import)
    added = [key for key, value in now.items() if key not in before and not isinstance(value, types.ModuleType)
             and _is_callable_part(value)]
    return [str(key) for key in changed + added]


def _put_attributes_back(owner, before: dict, now: dict) -> None:
    for key in _changed_keys(before, now):
        try:
            if key in before:
                setattr(owner, key, before[key])
            else:
                delattr(owner, key)
        except (AttributeError, TypeError):  # a read-only attribute was not changed either
            pass


def _guarded_module(name: str) -> bool:
    return name == "builtins" or name.split(".")[0] in _MODULES


def _modules(namespace: dict) -> list:
    """The modules whose functions a check calls: the package's, JAX's and NumPy's, builtins, and
    those of the same families the namespace holds (as `jnp`, `lax`, `nnx`)."""
    import builtins

    found = {id(builtins): builtins}
    for name, module in list(sys.modules.items()):
        if module is not None and (name.startswith("jaxpar_magic") or name in ("jax", "jax.numpy", "jax.lax", "numpy")):
            found[id(module)] = module
    for value in list(namespace.values()):
        if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in _MODULES:
            found[id(value)] = value
    return list(found.values())


def _classes(namespace: dict) -> list:
    """The package's own classes (a check's Attempt, NotRun) and the classes the namespace holds."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith("jaxpar_magic"):
            for value in list(vars(module).values()):
                if isinstance(value, type) and getattr(value, "__module__", "").startswith("jaxpar_magic"):
                    found[id(value)] = value
    for value in list(namespace.values()):
        if isinstance(value, type):
            found[id(value)] = value
    return list(found.values())


def _shell_hooks(shell) -> dict:
    """IPython's hooks, transformers and magics, and the interpreter's: what runs around every cell."""
    events = getattr(shell, "events", None)
    parts = {
        "event callbacks": {event: list(callbacks) for event, callbacks in (events.callbacks.items() if events else ())},
        "input transformers": (list(shell.input_transformers_cleanup), list(shell.input_transformers_post),
                               list(shell.ast_transformers)),
        "magics": {kind: dict(table) for kind, table in shell.magics_manager.magics.items()},
        "shell methods": {name: vars(shell).get(name) for name in _SHELL_METHODS},
        "display machinery": (shell.display_pub, shell.displayhook, shell.display_formatter, sys.displayhook,
                              sys.excepthook, sys.gettrace(), sys.getprofile()),
        "import machinery": (list(sys.meta_path), list(sys.path_hooks)),
        "namespace": (shell.user_ns, shell.user_global_ns),
    }
    return parts


_FRONT_END = ("matplotlib", "matplotlib_inline", "ipykernel", "ipywidgets", "IPython", "jaxpar_magic")


def _front_end_added(before: dict, now: dict) -> bool:
    """Only callbacks of the front end's own libraries were added (matplotlib's inline backend registers
    one when a cell makes the kernel's first figure), none removed or replaced."""
    for event, callbacks in now.items():
        kept = before.get(event, [])
        if [id(c) for c in callbacks[:len(kept)]] != [id(c) for c in kept]:
            return False
        if not all(map(_front_end_code, callbacks[len(kept):])):
            return False
    return True


def _front_end_code(function) -> bool:
    """The function's code lies in one of the front end's installed packages (its own file, not a
    cell's: a name or a __module__ can be set to anything)."""
    import os

    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return False
    where = os.path.realpath(code.co_filename)
    for name in _FRONT_END:
        package = sys.modules.get(name)
        home = os.path.dirname(os.path.realpath(getattr(package, "__file__", "") or "")) if package else ""
        if home and where.startswith(home + os.sep):
            return True
    return False


def _identities(value):
    """A structure of identities: equal when every object in it is the same object (the caller keeps
    the objects alive, so that no id is reused)."""
    if isinstance(value, dict):
        return {key: _identities(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_identities(item) for item in value)
    return id(value)


def _put_shell_hooks_back(shell, hooks: dict) -> None:
    now = _identities(_shell_hooks(shell))
    if now == _identities(hooks):
        return
    for event, callbacks in hooks["event callbacks"].items():
        shell.events.callbacks[event][:] = callbacks
    cleanup, post, ast_transformers = hooks["input transformers"]
    shell.input_transformers_cleanup[:] = cleanup
    shell.input_transformers_post[:] = post
    shell.ast_transformers[:] = ast_transformers
    for kind, table in hooks["magics"].items():
        current = shell.magics_manager.magics[kind]
        current.clear()
        current.update(table)
    for name, method in hooks["shell methods"].items():
        if method is None:
            vars(shell).pop(name, None)
        else:
            setattr(shell, name, method)
    display_pub, displayhook, formatter, sys_displayhook, excepthook, trace, profile = hooks["display machinery"]
    shell.display_pub, shell.displayhook, shell.display_formatter = display_pub, displayhook, formatter
    sys.displayhook, sys.excepthook = sys_displayhook, excepthook
    if now["display machinery"][5:] != _identities(hooks["display machinery"][5:]):
        sys.settrace(trace)
        sys.setprofile(profile)
    meta_path, path_hooks = hooks["import machinery"]
    sys.meta_path[:] = meta_path
    sys.path_hooks[:] = path_hooks
