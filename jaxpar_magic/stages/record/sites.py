"""The static facts of a per-device function's collective calls: one `Site` per call, found by
walking its jaxpr once in program order (`Planner`), with the actions the recorder's interpreter
(stages/record/recorder.py) takes at each equation.

A `Site` says what the call is (the op the user called, told by JAX's own frames in the equation's
traceback), where it was written, its per-device shapes and JSON-able parameters, the loops around
it, and its record slot; a call the recorder cannot show still gets a Site saying why.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

from ...errors import PACKAGE_DIR

MAX_CARDS = 64  # collective calls recorded per program; later ones are counted, not recorded
MAX_FRAMES = 4  # user frames kept per call (innermost first)

#: The ops the cards name (what the user called); anything else is named by its primitive.
OPS = ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute", "pshuffle",
       "axis_index")
#: Collective primitives the recorder shows, and the op each one is when JAX's frames do not say.
SUPPORTED = {
    "psum": "psum", "psum_invariant": "psum", "pmax": "pmax", "pmin": "pmin", "all_gather": "all_gather",
    "all_gather_invariant": "all_gather", "reduce_scatter": "psum_scatter", "all_to_all": "all_to_all",
    "ppermute": "ppermute", "axis_index": "axis_index",
}
#: The primitives of a psum (a pmean is one of them, then a division).
PSUMS = ("psum", "psum_invariant")
#: Primitives that only change a value's type over the mesh axes: no data moves.
_TYPE_CASTS = ("pvary", "pcast", "preduced", "vary_unreduced_cast_p", "reduced_vary_cast")
#: Call-like primitives evaluated inline, and the parameter holding their jaxpr.
INLINE_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "remat2": "jaxpr",
           "checkpoint": "jaxpr"}
_LOOP_FUNCTIONS = ("fori_loop", "scan", "while_loop", "map")
_FRONT_FUNCTIONS = OPS + ("all_gather_invariant", "pbroadcast", "pswapaxes", "ragged_all_to_all", "psend", "precv")


# --- static facts ----------------------------------------------------------------------------------

@dataclass
class Site:
    """One collective call in the program: what it is, where it was written, and its record slot."""

    index: int  # program order
    op: str  # what the user called (OPS), or the primitive's name
    primitive: str
    axes: tuple[str, ...]  # the mesh axes, as the call named them
    axis_index_groups: tuple[tuple[int, ...], ...] | None  # linear indices over `axes`
    params: dict  # JSON-able, op specific
    in_shape: tuple[int, ...] | None  # per device; None: no input (axis_index)
    in_dtype: str | None
    out_shape: tuple[int, ...] | None
    out_dtype: str | None
    frames: tuple[tuple[str, int, str], ...] = ()  # (file, line, function) of user frames, innermost first
    loops: tuple[str, ...] = ()  # enclosing loops, outermost first: "fori_loop", "scan", "while_loop"
    recorded: bool = True
    why_not: str | None = None
    slot: int | None = None  # its entry in the records: None when nothing (not even a count) is kept
    value: str | None = None  # the value it moves, by name and leaf path (`grads['w1']`), when it can be told
    variables: tuple = field(default=(None, None), repr=False, compare=False)  # (operand, result) jaxpr vars

    @property
    def in_loop(self) -> bool:
        return bool(self.loops)


@dataclass
class _Action:
    kind: str  # "collective", "pmean_out", "inline", "scan", "while", "cond"
    sites: list = field(default_factory=list)
    slots: tuple = ()  # slots a loop or branch carries


def _named_axes(params) -> tuple[str, ...]:
    value = params.get("axes", params.get("axis_name"))
    names = value if isinstance(value, (tuple, list)) else (value,)
    return tuple(n for n in names if isinstance(n, str))


def _is_collective(eqn) -> bool:
    name = eqn.primitive.name
    if name in SUPPORTED:
        return True
    return bool(_named_axes(eqn.params)) and name not in _TYPE_CASTS and "cast" not in name


@functools.lru_cache(maxsize=1)
def _package_dirs() -> tuple[str, ...]:
    import jax

    dirs = [os.path.dirname(jax.__file__), PACKAGE_DIR]
    try:
        import jaxlib

        dirs.append(os.path.dirname(jaxlib.__file__))
    except ImportError:  # jaxlib always comes with jax; this only keeps the lookup total
        pass
    return tuple(d + os.sep for d in dirs)


def is_library_file(file: str) -> bool:
    """Whether a frame's file is JAX's, jaxlib's or ours rather than the user's code."""
    return file.startswith(_package_dirs())


def _frames(eqn) -> tuple[list, list]:
    """(JAX's own frames up to the first user frame, the user frames), innermost first."""
    traceback = getattr(eqn.source_info, "traceback", None)
    frames = list(getattr(traceback, "frames", None) or [])
    ours = _package_dirs()
    inner, user = [], []
    for frame in frames:
        if frame.file_name.startswith(ours):
            if not user:
                inner.append(frame)
        elif len(user) < MAX_FRAMES:
            user.append(frame)
    return inner, user


def _front(inner_frames, names) -> str | None:
    """The outermost JAX function among `names` below the user's frame: what the user called."""
    found = None
    for frame in inner_frames:
        if frame.function_name in names:
            found = frame.function_name
    return found


def _json_params(eqn, operand: int, operands: int) -> dict:
    p = eqn.params
    name = eqn.primitive.name
    out: dict[str, Any] = {}
    if name in ("all_gather", "all_gather_invariant"):
        out = {"tiled": bool(p["tiled"]), "axis": int(p["all_gather_dimension"])}
    elif name == "reduce_scatter":
        out = {"tiled": bool(p["tiled"]), "scatter_dimension": int(p["scatter_dimension"])}
    elif name == "all_to_all":
        out = {"tiled": bool(p.get("tiled", False)), "split_axis": int(p["split_axis"]),
               "concat_axis": int(p["concat_axis"])}
    elif name == "ppermute":
        out = {"perm": [[int(s), int(d)] for s, d in p["perm"]]}
    elif name not in SUPPORTED:
        out = {k: v for k, v in p.items() if isinstance(v, (bool, int, float, str))}
    if operands > 1:
        out.update(operand=operand, operands=operands)
    return out


def _shape_dtype(var) -> tuple[tuple[int, ...] | None, str | None]:
    """Shape and dtype of an array of numbers; (None, None) for anything else (a token, PRNG keys)."""
    import jax

    aval = getattr(var, "aval", None)
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return None, None
    return tuple(int(n) for n in shape), str(dtype)


def open_jaxpr(jaxpr_like):
    """(Jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    inner = getattr(jaxpr_like, "jaxpr", None)
    return (inner, list(jaxpr_like.consts)) if inner is not None else (jaxpr_like, [])


class Planner:
    """Walks a jaxpr once, in program order: one Site per collective operand, and the actions the
    interpreter takes, keyed by the path of equation indices (a jaxpr shared by two call sites,
    such as one jitted helper called twice, gives two paths and so two sites)."""

    def __init__(self, max_cards: int):
        self.max_cards = max_cards
        self.sites: list[Site] = []
        self.actions: dict[tuple, _Action] = {}
        self.slots = 0

    def _new_slot(self) -> int:
        self.slots += 1
        return self.slots - 1

    def walk(self, jaxpr, path: tuple, loops: tuple, why_not: str | None) -> None:
        from jax.extend.core import jaxprs_in_params

        for i, eqn in enumerate(jaxpr.eqns):
            key = path + (i,)
            name = eqn.primitive.name
            if _is_collective(eqn):
                self._collective(jaxpr, i, eqn, key, loops, why_not)
            elif name in INLINE_CALLS and why_not is None:
                self._nested(key, [(open_jaxpr(eqn.params[INLINE_CALLS[name]])[0], key)], loops, "inline")
            elif name == "scan" and why_not is None:
                loop = loops + (self._loop_name(eqn, "scan"),)
                self._nested(key, [(eqn.params["jaxpr"].jaxpr, key + ("body",))], loop, "scan")
            elif name == "while" and why_not is None:
                loop = loops + (self._loop_name(eqn, "while_loop"),)
                self.walk(eqn.params["cond_jaxpr"].jaxpr, key + ("cond",), loop,
                          "it is in a while_loop's condition, which cannot carry records")
                self._nested(key, [(eqn.params["body_jaxpr"].jaxpr, key + ("body",))], loop, "while")
            elif name == "cond" and why_not is None:
                branches = [(b.jaxpr, key + (n,)) for n, b in enumerate(eqn.params["branches"])]
                self._nested(key, branches, loops, "cond")
            else:
                for n, sub in enumerate(jaxprs_in_params(eqn.params)):
                    self.walk(open_jaxpr(sub)[0], key + ("other", n), loops,
                              why_not or f"it is inside `{name}`, which the recorder does not enter")

    def _loop_name(self, eqn, default: str) -> str:
        inner, _ = _frames(eqn)
        return _front(inner, _LOOP_FUNCTIONS) or default

    def _nested(self, key, bodies, loops, kind: str) -> None:
        first = self.slots
        for jaxpr, path in bodies:
            self.walk(jaxpr, path, loops, None)
        if self.slots > first:  # only calls with something to record are re-expressed
            self.actions[key] = _Action(kind, slots=tuple(range(first, self.slots)))

    def _collective(self, jaxpr, i, eqn, key, loops, why_not) -> None:
        name = eqn.primitive.name
        inner, user = _frames(eqn)
        front = _front(inner, _FRONT_FUNCTIONS)
        operands = max(1, min(len(eqn.invars), len(eqn.outvars))) if name != "axis_index" else 1
        action = _Action("collective")
        for k in range(operands):
            invar = eqn.invars[k] if k < len(eqn.invars) else None
            outvar = eqn.outvars[k]
            op = front if front in OPS else SUPPORTED.get(name, name)
            finisher = None
            if name in PSUMS and op == "pmean":
                finisher = _mean_of(jaxpr, i, outvar)
                if finisher is None:  # not the psum-then-divide pmean we know: show what ran
                    op = "psum"
                else:
                    outvar = jaxpr.eqns[finisher].outvars[0]
            in_shape, in_dtype = _shape_dtype(invar) if invar is not None else (None, None)
            out_shape, out_dtype = _shape_dtype(outvar)
            params = _json_params(eqn, k, operands)
            if name == "all_to_all" and in_shape is not None and out_shape is not None:
                in_shape, out_shape, params = _untiled_all_to_all(in_shape, out_shape, params)
            groups = eqn.params.get("axis_index_groups")
            site = Site(
                index=len(self.sites), op=op, primitive=name, axes=_named_axes(eqn.params),
                axis_index_groups=tuple(tuple(int(j) for j in g) for g in groups) if groups else None,
                params=params, in_shape=in_shape, in_dtype=in_dtype,
                out_shape=out_shape, out_dtype=out_dtype,
                frames=tuple((f.file_name, int(f.line_num), f.function_name) for f in user), loops=loops,
            )
            site.variables = (invar, outvar)
            if why_not is not None:
                site.recorded, site.why_not = False, why_not
            elif len(self.sites) >= self.max_cards:
                site.recorded, site.why_not = False, f"only the first {self.max_cards} collective calls are recorded"
            elif name not in SUPPORTED:
                site.recorded, site.why_not = False, f"the recorder does not support `{name}`"
                site.slot = self._new_slot()  # still counted
            elif out_shape is None or (invar is not None and in_shape is None):
                site.recorded, site.why_not = False, "its operand is not an array of numbers (a PRNG key, a token)"
                site.slot = self._new_slot()
            else:
                site.slot = self._new_slot()
            self.sites.append(site)
            if site.slot is not None:
                action.sites.append((k, site))
                if finisher is not None and site.recorded:
                    self.actions[key[:-1] + (finisher,)] = _Action("pmean_out", sites=[(0, site)])
        if action.sites:
            self.actions[key] = action


def _untiled_all_to_all(in_shape, out_shape, params):
    """The shapes and axes the user wrote for an untiled all_to_all.

    `lax.all_to_all(x, ..., tiled=False)` inserts a unit axis at concat_axis, binds the primitive,
    and squeezes the (then unit) split axis away; show the call as written. Dropping unit axes
    keeps the row-major order, so the recorded values only need a reshape.
    """
    split, concat = params["split_axis"], params["concat_axis"]
    if params["tiled"] or split == concat or in_shape[concat] != 1 or out_shape[split] != 1:
        return in_shape, out_shape, params
    user_in = in_shape[:concat] + in_shape[concat + 1:]
    user_out = out_shape[:split] + out_shape[split + 1:]
    if split < concat:
        concat -= 1
    else:
        split -= 1
    return user_in, user_out, {**params, "split_axis": split, "concat_axis": concat}


def _mean_of(jaxpr, i: int, var) -> int | None:
    """Index of the `div` that turns psum's output `var` into pmean's (through a dtype convert)."""
    from jax.extend.core import Literal

    for j in range(i + 1, len(jaxpr.eqns)):
        eqn = jaxpr.eqns[j]
        if not any(v is var for v in eqn.invars):
            continue
        if eqn.primitive.name == "convert_element_type":
            var = eqn.outvars[0]
            continue
        if eqn.primitive.name == "div" and eqn.invars[0] is var and isinstance(eqn.invars[1], Literal):
            return j
        return None
    return None
