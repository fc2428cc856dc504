"""Tracers hidden in what a cell returns besides arrays: a plain object holding a traced value
(`sc = Scaler(x * 2)`), a closure over one (`fn = lambda v: v + x`), a partial of one. Only
pytrees of arrays leave a compiled program; such a value would keep the placeholder JAX traced
with, and fail when used after the cell (plain jax.jit refuses the return type at once). Found
while the cell is traced, so a re-run pays nothing.
"""
from __future__ import annotations

import functools
import types

from ..errors import UsageError

_MOST = 2_000  # objects looked into per output: deep object graphs are not walked to the end


def refuse_hidden(cell, outs: dict, final) -> None:
    """A UsageError naming the first output (or the final expression) that holds a tracer inside a
    non-pytree value, the path to it, and the fix."""
    import jax

    named = list(outs.items()) + ([(None, final)] if final is not None else [])
    for name, value in named:
        try:
            leaves = jax.tree_util.tree_leaves_with_path(value)
        except (ValueError, TypeError):  # a dict JAX cannot flatten: capture_outputs says so (dict_keys)
            continue
        for path, leaf in leaves:
            if isinstance(leaf, jax.core.Tracer):
                continue  # an array computed on the devices: it leaves the program
            where = _hidden(leaf, [], set(), [0])
            if where is not None:
                label = (name or "") + jax.tree_util.keystr(path)
                raise _error(cell, name, leaf, _render(label, where))


def _hidden(value, path: list, seen: set, count: list):
    """The path (attribute, closure variable...) to a tracer inside `value`, or None."""
    import jax

    if isinstance(value, jax.core.Tracer):
        return path
    if id(value) in seen or count[0] > _MOST or isinstance(value, (type, types.ModuleType, str, bytes)):
        return None
    seen.add(id(value))
    count[0] += 1
    for step, inner in _parts(value):
        found = _hidden(inner, path + [step], seen, count)
        if found is not None:
            return found
    return None


def _parts(value):
    """(the step: a suffix such as `.w`, or (what, its name) for a closure variable, what it reaches)
    for what a value holds."""
    if isinstance(value, types.FunctionType):
        names = value.__code__.co_freevars
        for name, cell in zip(names, value.__closure__ or ()):
            try:
                yield ("closure variable", name), cell.cell_contents
            except ValueError:  # an empty closure cell
                continue
        for index, default in enumerate(value.__defaults__ or ()):
            yield ("default argument", f"#{index + 1}"), default
        return
    if isinstance(value, types.MethodType):
        yield ".__self__", value.__self__
        yield ".__func__", value.__func__
        return
    if isinstance(value, functools.partial):
        yield ".func", value.func
        for index, arg in enumerate(value.args):
            yield f".args[{index}]", arg
        for key, arg in value.keywords.items():
            yield f".keywords[{key!r}]", arg
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            yield f"[{index}]", item
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"[{key!r}]", item
        return
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        for key, item in attributes.items():
            yield f".{key}", item


def _render(label: str, steps: list) -> str:
    """`sc.w`, or `fn`'s closure variable `x`: the path to a hidden tracer, as code where it is code."""
    code, text = label, ""
    for step in steps:
        if isinstance(step, str):
            code += step
        else:
            text += f"`{code}`'s {step[0]} "
            code = step[1]
    return text + f"`{code}`"


def _error(cell, name, leaf, where: str) -> UsageError:
    kind = "function" if callable(leaf) and isinstance(leaf, (types.FunctionType, functools.partial)) else \
        f"{type(leaf).__name__} object"
    at = f"the cell's output `{name}` (line {cell.last_assigned(name)} of the cell: " \
         f"`{cell.line(cell.last_assigned(name))}`)" if name is not None else "the cell's final expression"
    return UsageError(
        f"{at} is a {kind} that holds a value traced inside the cell (at {where}). Only arrays, pytrees "
        f"of arrays and plain Python values leave a compiled cell; this {kind} would keep JAX's placeholder (a "
        f"tracer) and fail when used after the cell (plain jax.jit refuses to return it). Return the arrays "
        f"themselves (assign them to names) and build the {kind} in a plain cell after this one, or make its class "
        f"a pytree (`jax.tree_util.register_dataclass`, an `equinox.Module`) so its arrays leave the program. If it "
        f"is a temporary, `del {name or 'it'}` at the end of the cell (or, in %%shard and %%shard_map, leave it out "
        f"of --out)."
    )
