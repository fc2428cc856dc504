"""Turning foreseeable mistakes into one-paragraph UsageErrors that point at the user's line.

Everything that explains a JAX error in our own words lives here, so the engines only
decide *that* something went wrong and this module decides *how to say it*.
"""
from __future__ import annotations

import linecache
import os
import re
import traceback

from IPython.core.error import UsageError

__all__ = ["UsageError", "user_line", "explain_trace_error", "explaining", "PACKAGE_DIR"]

# The package's own folder, whichever subpackage a module sits in: frames under it are ours, not the user's.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_line(exc: BaseException, filename: str) -> tuple[int, str] | None:
    """The deepest frame of `exc`'s traceback that ran the user's cell: (line number, text)."""
    found = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == filename:
            found = (lineno, linecache.getline(filename, lineno).strip())
    return found


def _user_text(exc: BaseException, filename: str) -> str:
    hit = user_line(exc, filename)
    return hit[1] if hit else ""


def where(exc: BaseException, filename: str) -> str:
    hit = user_line(exc, filename)
    return f"line {hit[0]} of the cell (`{hit[1]}`)" if hit else "the cell"


def _whole_array_cell(filename: str) -> bool:
    """A %%shard cell: cells are compiled under `<{label}-{n}>`, the label naming the magic
    (cell/analysis.py: 'shard-cell', 'shard-plan'; %%shard_map's start 'shard_map-')."""
    return filename.startswith("<shard-")


def explain_trace_error(exc: BaseException, filename: str, axis_names: tuple[str, ...]) -> UsageError | None:
    """Our explanation of an error raised while JAX traced the cell, or None to let it through.

    Only errors we can foresee are explained; an error of the user's own code (a ZeroDivisionError,
    a shape mismatch in their matmul) propagates unchanged.
    """
    import jax

    at = where(exc, filename)
    axes = ", ".join(repr(a) for a in axis_names)
    if isinstance(exc, jax.errors.TracerBoolConversionError):
        return UsageError(
            f"{at}: Python `if`/`bool()`/`and`/`or` on a traced value. Inside a parallel cell every "
            "array is abstract (its value is known only on the device), so Python cannot branch on it. "
            "Use `jnp.where(cond, a, b)` or `jax.lax.cond(cond, f, g, x)` instead, or make the value a "
            "plain Python constant outside the cell."
        )
    if isinstance(exc, (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)):
        return UsageError(
            f"{at}: this needs a concrete Python value, but inside a parallel cell the value is traced "
            f"({type(exc).__name__}). Compute it from shapes (`x.shape[0]`) or pass it as a constant; "
            "use `jnp` functions on arrays instead of `int()`/`float()`/`range()` of an array."
        )
    if isinstance(exc, NameError) and "unbound axis name" in str(exc):
        name = str(exc).split("unbound axis name:", 1)[-1].split(".", 1)[0].strip()
        if _whole_array_cell(filename):  # %%shard has no --axis-name, and no axis is mapped in it
            return UsageError(
                f"{at}: a collective over the axis {name!r} in a %%shard cell. %%shard runs the cell on whole "
                f"arrays, as jax.jit does, so no axis is mapped and there are no per-device values to reduce "
                f"(plain jax.jit raises the same). Reduce the whole array instead (`jnp.sum(x, axis=0)` for "
                f"`lax.psum`, `jnp.mean(x, axis=0)` for `lax.pmean`), or run the per-device code in %%shard_map "
                f"(`--in x=P({axis_names[0]!r})`) or %%pmap, where a collective over {axis_names[0]!r} reduces "
                f"over the devices."
            )
        return UsageError(
            f"{at}: unknown axis name {name!r} in a collective. This cell runs over the axis names "
            f"{axes}; use one of them (e.g. `lax.psum(x, {axis_names[0]!r})`), or name the axis with "
            f"`--axis-name {name}` / `--mesh {name}=N,...`."
        )
    if isinstance(exc, NotImplementedError) and "axis_index_groups" in _user_text(exc, filename):
        return UsageError(
            f"{at}: `axis_index_groups` with JAX's varying-axes checks on: JAX 0.10 implements grouped "
            "collectives inside shard_map only with those checks off. Add --no-check-vma to the line (then give "
            "every output an --out spec), or split the mesh so that each group is a mesh axis of its own."
        )
    if isinstance(exc, ValueError) and "can only accept axis_name which corresponds to one of varying" in str(exc):
        return UsageError(
            f"{at}: a collective over an axis along which the value is already the same on every device. "
            "With JAX's varying-axes checks (shard_map's default), `lax.psum(v, axes)` needs `v` to vary over "
            "every axis it names; a value read whole (not split by --in) or already reduced does not. Reduce over "
            "the axes it varies over only (`jax.typeof(v)` shows them as {V:...}), mark it varying with "
            "`lax.pvary(v, axes)`, or turn the checks off with --no-check-vma."
        )
    scatter = re.search(r"scatter dimension size (\d+) must match shard count (\d+)", str(exc))
    if isinstance(exc, ValueError) and scatter:
        size, count = scatter.groups()
        return UsageError(
            f"{at}: `lax.psum_scatter` without `tiled=True` gives each of the {count} devices one entry of the "
            f"scattered dimension, so that dimension must have {count} entries; it has {size}. Pass `tiled=True` "
            f"to cut it into {count} equal blocks instead (each device keeps its block of the sum)."
        )
    if isinstance(exc, OverflowError):
        explained = _explain_overflowing_int(exc, filename, at)
        if explained is not None:
            return explained
    if type(exc).__name__ == "ShardingTypeError":  # jax._src.core's; no public name to catch it by
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return UsageError(
            f"{at}: the mesh has Explicit axes (what `%mesh` and `jax.make_mesh` give by default), where every "
            f"operation must say how its result is sharded, and this one is ambiguous ({first}). Say it with "
            "the operation's `out_sharding=P(...)` (e.g. `jnp.matmul(a, b, out_sharding=P('data', None))`), "
            "reshard the operands first with `jax.reshard(x, P(...))`, or build the mesh with automatic axes, "
            "which let the compiler choose (`%mesh data=8 --axis-types auto`)."
        )
    return None


def _explain_overflowing_int(exc: OverflowError, filename: str, at: str) -> UsageError | None:
    """JAX's "overflow ... whose argument path is y" names a parameter of a jnp function, not the
    cell's value: name the Python int the user's line reads (from that frame's names), and the fix."""
    import jax

    found = re.search(r"overflow was encountered while parsing an argument.*Got <class 'int'> with value (-?\d+)",
                      str(exc), re.S)
    if found is None:
        return None
    value = int(found.group(1))
    frame = None
    for candidate, _ in traceback.walk_tb(exc.__traceback__):
        if candidate.f_code.co_filename == filename:
            frame = candidate
    hit = user_line(exc, filename)
    words = set(re.findall(r"[A-Za-z_]\w*", hit[1])) if hit else set()
    names = []
    for scope in ((frame.f_locals, frame.f_globals) if frame is not None else ()):
        names += [n for n, v in scope.items() if n in words and type(v) is int and v == value and n not in names]
    what = f"`{names[0]}` is the Python int {value}" if names else f"the Python int {value}"
    bits = 64 if jax.config.jax_enable_x64 else 32
    limit = "int64" if bits == 64 else "int32 (jax_enable_x64 is off)"
    example = names[0] if names else str(value)
    return UsageError(
        f"{at}: {what}, which does not fit JAX's {limit}, so JAX cannot pass it into the program (plain JAX "
        f"raises the same OverflowError). Make it a float (`float({example})`), an array of a dtype that holds it "
        f"(`jnp.float32({example})`), or a smaller int (a seed modulo 2**{bits - 1})."
    )


class explaining:
    """`with explaining(filename, axis_names):` an error JAX raises while tracing the cell is
    replaced by our explanation where we have one; our own UsageErrors and the user's own errors
    pass unchanged. A class, not a generator: it sits on every call of a pmapped function."""

    __slots__ = ("filename", "axis_names")

    def __init__(self, filename: str, axis_names):
        self.filename = filename
        self.axis_names = axis_names

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, UsageError):
            return False
        explained = explain_trace_error(exc, self.filename, tuple(self.axis_names))
        if explained is not None:
            raise explained from None
        return False
