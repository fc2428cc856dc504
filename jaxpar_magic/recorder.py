"""Record what every collective of a per-device function did, and turn the records into cards.

Device side. `record_collectives(fn, axis_names)` returns a `Recording`: call it inside a
`shard_map` body where you would call `fn`, and it returns `(fn's outputs, records)`. It traces
`fn` to a jaxpr and evaluates that jaxpr equation by equation in the enclosing trace (the pattern of
JAX's "Writing custom Jaxpr interpreters"), so the program computes exactly what `fn` computes; at
each collective it also keeps a bounded preview of the input and output (the first HEAD values,
and a HEAT x HEAT block-mean heat map of 2-D+ values), which leave the program as extra outputs:
a few KiB per device and collective call, whatever the array sizes. The user's source and
`jax.lax` are left alone.

- Calls inside `jit`, `custom_jvp`/`custom_vjp` and `checkpoint` are evaluated inline and
  recorded; `scan`, `fori_loop` and `while_loop` carry the previews and a counter, so a card says
  how often the call ran and shows its first and last iteration; `cond`/`switch` carry them
  through every branch, so a call in a branch is recorded when (and as often as) its branch runs.
- `lax.pmean` is a psum then a division; it is shown as one pmean call whose output is the mean
  (told by JAX's own frames in the equation's traceback; without them it shows as a psum).
- A collective the recorder cannot show (an unknown primitive, one inside a while loop's
  condition or inside a primitive it does not enter, such as a nested shard_map) still runs
  unchanged; its card says `recorded: false` and why.

The static facts of each call (`Site`) are collected at trace time into `Recording.sites`.

Host side. `collective_cards(sites, records, mesh, ...)` turns the sites and the records (NumPy
arrays with one leading axis per mesh axis, as shard_map returns them with `out_specs=P(*axes)`)
into the `cards` of the collectives view (jpm_schemas.md section 1); `collectives_state` wraps
them into the whole view state.
"""
from __future__ import annotations

import functools
import linecache
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .movement import (
    KIND, MAX_DEVICES_DRAWN, axis_index_order, estimated_bytes, groups_of, movement,
)

HEAD = 64  # values kept per preview (the first ones, flattened)
HEAT = 16  # a preview's heat map is at most HEAT x HEAT block means
MAX_CARDS = 64  # collective calls recorded per program; later ones are counted, not recorded
TEXT_VALUES = 8  # values written in a tile's text
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
_PSUMS = ("psum", "psum_invariant")
#: Primitives that only change a value's type over the mesh axes: no data moves.
_TYPE_CASTS = ("pvary", "pcast", "preduced", "vary_unreduced_cast_p", "reduced_vary_cast")
#: Call-like primitives evaluated inline, and the parameter holding their jaxpr.
_INLINE = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
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

    dirs = [os.path.dirname(jax.__file__), os.path.dirname(__file__)]
    try:
        import jaxlib

        dirs.append(os.path.dirname(jaxlib.__file__))
    except ImportError:  # jaxlib always comes with jax; this only keeps the lookup total
        pass
    return tuple(d + os.sep for d in dirs)


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


def _open(jaxpr_like):
    """(Jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    inner = getattr(jaxpr_like, "jaxpr", None)
    return (inner, list(jaxpr_like.consts)) if inner is not None else (jaxpr_like, [])


class _Planner:
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
            elif name in _INLINE and why_not is None:
                self._nested(key, [(_open(eqn.params[_INLINE[name]])[0], key)], loops, "inline")
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
                    self.walk(_open(sub)[0], key + ("other", n), loops,
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
            if name in _PSUMS and op == "pmean":
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


# --- previews ---------------------------------------------------------------------------------------

def _heat_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    if len(shape) < 2 or math.prod(shape) == 0:
        return None
    return min(HEAT, math.prod(shape[:-1])), min(HEAT, shape[-1])


def _bin_sums(m, bins: int):
    """Sums of `bins` runs of consecutive rows of `m` (runs differ in length by at most one)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    length = m.shape[0]
    if length == bins:
        return m
    if length % bins == 0:
        return m.reshape((bins, length // bins) + m.shape[1:]).sum(axis=1)
    if length * bins < 2**31:
        ids = lax.iota(jnp.int32, length) * bins // length
    else:  # i * bins would overflow int32: equal runs of ceil(length / bins), the last one shorter
        ids = lax.iota(jnp.int32, length) // -(-length // bins)
    return jax.ops.segment_sum(m, ids, num_segments=bins, indices_are_sorted=True)


def _bin_counts(length: int, bins: int) -> list[int]:
    """How many rows each of `_bin_sums`'s runs holds: run b is rows ceil(b L / bins) up to
    ceil((b + 1) L / bins)."""
    def ceil(b):
        return -(-b * length // bins)

    if length % bins == 0 or length * bins < 2**31:
        return [ceil(b + 1) - ceil(b) for b in range(bins)]
    run = -(-length // bins)
    return [max(0, min(run, length - b * run)) for b in range(bins)]


def _heat(x, shape):
    """Block means of `x` seen as a (rows, last axis) matrix, at most HEAT x HEAT, in float32."""
    import jax.numpy as jnp
    import numpy as np

    rows, cols = _heat_shape(shape)
    m = jnp.reshape(x, (-1, shape[-1]))
    m = jnp.abs(m) if jnp.iscomplexobj(m) else m
    m = m.astype(jnp.float32)
    m = _bin_sums(m, rows)  # (rows, last axis)
    m = _bin_sums(m.T, cols).T  # (rows, cols)
    counts = np.outer(_bin_counts(math.prod(shape[:-1]), rows), _bin_counts(shape[-1], cols))
    return m / counts.astype(np.float32)


def _varying(x) -> frozenset:
    """The mesh axes `x` varies over, as shard_map's check_vma tracks them (empty without it)."""
    import jax

    aval = jax.typeof(x)
    state = getattr(aval, "manual_axis_type", None)
    return frozenset(getattr(state, "varying", None) or getattr(aval, "vma", None) or ())


def _varying_over(tree, axes: tuple[str, ...]):
    """Mark every leaf as varying over all `axes`: records then have one type whether they come
    from a varying input, an invariant psum output or the zeros a loop starts from, which loops
    and branches require. Without check_vma this changes nothing."""
    import jax
    from jax import lax

    def cast(x):
        missing = tuple(a for a in axes if a not in _varying(x))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)


def _preview(x, shape, dtype):
    import jax.numpy as jnp

    x = jnp.reshape(jnp.asarray(x), shape)  # the shape the user wrote (see _untiled_all_to_all)
    preview = {"head": jnp.reshape(x, (-1,))[:HEAD].astype(dtype)}  # astype: never weakly typed
    if _heat_shape(shape) is not None:
        preview["heat"] = _heat(x, shape)
    return preview


def _empty_preview(shape, dtype):
    import jax.numpy as jnp

    preview = {"head": jnp.zeros((min(HEAD, math.prod(shape)),), dtype)}
    heat = _heat_shape(shape)
    if heat is not None:
        preview["heat"] = jnp.zeros(heat, jnp.float32)
    return preview


def _empty_record(site: Site):
    import jax.numpy as jnp

    record: dict[str, Any] = {"count": jnp.zeros((), jnp.int32)}
    if site.recorded:
        parts = {"out": _empty_preview(site.out_shape, site.out_dtype)}
        if site.in_shape is not None:
            parts["in"] = _empty_preview(site.in_shape, site.in_dtype)
        record["first"] = parts
        if site.in_loop:
            record["last"] = dict(parts)
    return record


# --- the interpreter --------------------------------------------------------------------------------

class _Interpreter:
    """Evaluates a planned jaxpr in the current trace; `state` maps record slots to records."""

    def __init__(self, planner: _Planner, axis_names: tuple[str, ...]):
        self.actions = planner.actions
        self.axis_names = axis_names

    def run(self, jaxpr, consts, args, state: dict, path: tuple):
        from jax.extend.core import Literal

        env: dict = {}

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for i, eqn in enumerate(jaxpr.eqns):
            key = path + (i,)
            invals = [read(v) for v in eqn.invars]
            action = self.actions.get(key)
            if action is None:
                outvals = _bind(eqn, invals)
            else:
                outvals, state = getattr(self, "_" + action.kind)(eqn, invals, state, key, action)
            env.update(zip(eqn.outvars, outvals))
        return [read(v) for v in jaxpr.outvars], state

    # collectives

    def _record(self, state, site: Site, part: str, value, shape, dtype, first):
        import jax
        import jax.numpy as jnp

        preview = _varying_over(_preview(value, shape, dtype), self.axis_names)
        record = {**state[site.slot]}
        record["first"] = {**record["first"]}
        if site.in_loop:
            record["last"] = {**record["last"], part: preview}
            preview = jax.tree.map(lambda new, old: jnp.where(first, new, old), preview, record["first"][part])
        record["first"][part] = preview
        return {**state, site.slot: record}

    def _collective(self, eqn, invals, state, key, action):
        import jax

        outvals = _bind(eqn, invals)
        with jax.named_scope("collective_record"):
            for k, site in action.sites:
                count = state[site.slot]["count"]
                if site.recorded:
                    if site.in_shape is not None:
                        state = self._record(state, site, "in", invals[k], site.in_shape, site.in_dtype, count == 0)
                    if site.op != "pmean" or site.primitive not in _PSUMS:
                        state = self._record(state, site, "out", outvals[k], site.out_shape, site.out_dtype,
                                             count == 0)
                state = {**state, site.slot: {**state[site.slot], "count": count + 1}}
        return outvals, state

    def _pmean_out(self, eqn, invals, state, key, action):
        import jax

        outvals = _bind(eqn, invals)
        (_, site), = action.sites
        with jax.named_scope("collective_record"):
            count = state[site.slot]["count"]  # already counted by the psum
            state = self._record(state, site, "out", outvals[0], site.out_shape, site.out_dtype, count == 1)
        return outvals, state

    # control flow and calls

    def _inline(self, eqn, invals, state, key, action):
        jaxpr, consts = _open(eqn.params[_INLINE[eqn.primitive.name]])
        with _user_context(eqn):
            return self.run(jaxpr, consts, invals, state, key)

    def _scan(self, eqn, invals, state, key, action):
        from jax import lax

        p = eqn.params
        jaxpr, consts = _open(p["jaxpr"])
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        fixed, init, xs = invals[:n_consts], invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]

        def body(carry, x):
            values, records = carry
            outs, records = self.run(jaxpr, consts, [*fixed, *values, *x], records, key + ("body",))
            return (outs[:n_carry], records), outs[n_carry:]

        carried = {s: state[s] for s in action.slots}
        with _user_context(eqn):
            (values, records), ys = lax.scan(body, (list(init), carried), list(xs), length=p["length"],
                                             reverse=p["reverse"], unroll=p["unroll"])
        return [*values, *ys], {**state, **records}

    def _while(self, eqn, invals, state, key, action):
        from jax import lax

        p = eqn.params
        cond_jaxpr, cond_consts = _open(p["cond_jaxpr"])
        body_jaxpr, body_consts = _open(p["body_jaxpr"])
        n_cond, n_body = p["cond_nconsts"], p["body_nconsts"]
        cond_fixed, body_fixed, init = invals[:n_cond], invals[n_cond:n_cond + n_body], invals[n_cond + n_body:]

        def cond(carry):
            (pred,), _ = self.run(cond_jaxpr, cond_consts, [*cond_fixed, *carry[0]], {}, key + ("cond",))
            return pred

        def body(carry):
            values, records = carry
            return self.run(body_jaxpr, body_consts, [*body_fixed, *values], records, key + ("body",))

        carried = {s: state[s] for s in action.slots}
        with _user_context(eqn):
            values, records = lax.while_loop(cond, body, (list(init), carried))
        return list(values), {**state, **records}

    def _cond(self, eqn, invals, state, key, action):
        from jax import lax

        index, operands = invals[0], invals[1:]

        def branch(n, closed):
            jaxpr, consts = _open(closed)
            return lambda values, records: self.run(jaxpr, consts, values, records, key + (n,))

        carried = {s: state[s] for s in action.slots}
        branches = [branch(n, b) for n, b in enumerate(eqn.params["branches"])]
        with _user_context(eqn):
            values, records = lax.switch(index, branches, list(operands), carried)
        return list(values), {**state, **records}


def _user_context(eqn):
    """Make what we bind carry the equation's own source line and name scope (so the compiled
    program's collectives still point at the user's line)."""
    from jax.extend import source_info_util as siu

    name_stack = siu.current_name_stack() + eqn.source_info.name_stack
    return siu.user_context(eqn.source_info.traceback, name_stack=name_stack)


def _bind(eqn, invals):
    """What jax.core.eval_jaxpr does for one equation, in the current trace."""
    params = eqn.primitive.get_bind_params(eqn.params)  # JAX 0.10: sub-functions are in the params
    with _user_context(eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return out if eqn.primitive.multiple_results else [out]


# --- the recording function ------------------------------------------------------------------------

class Recording:
    """`fn` that also returns the records of its collective calls: `(out, records) = rec(*args)`.

    Call it inside a `shard_map` body (or anywhere the mesh axes in `axis_names` are bound).
    Arguments that are not traced (Python numbers, NumPy arrays, objects) reach `fn` unchanged, and
    outputs that are not traced come back as the very objects `fn` returned, so callers that tell
    traced outputs from static ones (runner.capture_outputs) see what they would without recording.
    `records` is a list (empty when nothing is recorded) of small dicts of arrays, one per record
    slot; `sites` are the calls' static facts from the latest trace.
    """

    def __init__(self, fn: Callable, axis_names: Sequence[str], max_cards: int = MAX_CARDS,
                 label_output: Callable | None = None, label_input: Callable | None = None):
        self.fn = fn
        self.axis_names = tuple(axis_names)
        self.max_cards = max_cards
        self.sites: list[Site] = []
        # key path -> the name a card gives a value (`grads['w1']`): of fn's outputs, of its arguments
        self.label_output = label_output
        self.label_input = label_input

    def __call__(self, *args):
        import jax

        leaves, tree = jax.tree.flatten(args)
        traced = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)]
        returned: dict = {}

        def traced_fn(*values):
            full = list(leaves)
            for i, value in zip(traced, values):
                full[i] = value
            out = self.fn(*jax.tree.unflatten(tree, full))
            with_paths, out_tree = jax.tree_util.tree_flatten_with_path(out)
            out_leaves = [leaf for _, leaf in with_paths]
            keep = [i for i, leaf in enumerate(out_leaves) if isinstance(leaf, jax.core.Tracer)]
            returned.update(leaves=out_leaves, tree=out_tree, keep=keep, paths=[with_paths[i][0] for i in keep])
            return [out_leaves[i] for i in keep]

        closed = jax.make_jaxpr(traced_fn)(*[leaves[i] for i in traced])
        planner = _Planner(self.max_cards)
        planner.walk(closed.jaxpr, (), (), None)
        self.sites = planner.sites
        in_paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
        _name_values(closed.jaxpr, planner.sites, self._labels(self.label_output, returned["paths"]),
                     self._labels(self.label_input, [in_paths[i] for i in traced]))
        by_slot = {s.slot: s for s in planner.sites if s.slot is not None}
        state = {slot: _varying_over(_empty_record(site), self.axis_names) for slot, site in by_slot.items()}
        outs, state = _Interpreter(planner, self.axis_names).run(
            closed.jaxpr, closed.consts, [leaves[i] for i in traced], state, ())
        out_leaves = list(returned["leaves"])
        for i, value in zip(returned["keep"], outs):
            out_leaves[i] = value
        records = [state[slot] for slot in range(planner.slots)]
        return jax.tree.unflatten(returned["tree"], out_leaves), records


    @staticmethod
    def _labels(label, paths) -> list:
        return [label(path) for path in paths] if label is not None else [None] * len(paths)


#: Primitives that pass a value on unchanged in meaning (a dtype, a shape, a scale): a collective's
#: result that reaches a named output only through these is that output.
_PASS_ON = {"convert_element_type", "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p",
            "mul", "div", "neg"}


def _name_values(jaxpr, sites, output_labels, input_labels) -> None:
    """Name each top-level collective call by the value it moves: the named output its result
    becomes (`grads['w1']` for `grads = lax.pmean(grads, 'i')`), else the input it reduces."""
    outputs = {id(v): label for v, label in zip(jaxpr.outvars, output_labels) if label}
    inputs = {id(v): label for v, label in zip(jaxpr.invars, input_labels) if label}
    users: dict[int, list] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            users.setdefault(id(v), []).append(eqn)
    for site in sites:
        operand, result = site.variables
        var = result
        for _ in range(6):  # a few pass-on steps at most: beyond that it is a new value
            if var is None or id(var) in outputs:
                break
            consumers = users.get(id(var), [])
            if len(consumers) != 1 or consumers[0].primitive.name not in _PASS_ON:
                var = None
                break
            var = consumers[0].outvars[0]
        if var is not None and id(var) in outputs:
            site.value = outputs[id(var)]
        elif operand is not None and id(operand) in inputs:
            site.value = inputs[id(operand)]


def record_collectives(fn: Callable, axis_names: Sequence[str], max_cards: int = MAX_CARDS, *,
                       label_output: Callable | None = None, label_input: Callable | None = None) -> Recording:
    """`fn` (a per-device function) made to also return bounded records of its collective calls.
    `label_output` / `label_input` name fn's output and argument leaves by key path, for the cards."""
    return Recording(fn, axis_names, max_cards, label_output, label_input)


# --- host side: the cards ------------------------------------------------------------------------------

#: The compiled (XLA) collective each movement kind becomes, to put its bytes beside our estimate.
_XLA_OP = {"all-reduce": "all-reduce", "all-gather": "all-gather", "reduce-scatter": "reduce-scatter",
           "all-to-all": "all-to-all", "permute": "collective-permute"}


def _np_dtype(dtype):
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with NumPy; JAX needs it)
    import numpy as np

    return np.dtype(dtype)


def short_dtype(dtype) -> str:
    """XLA's short spelling of a dtype: f32, bf16, s32, u8, pred, c64."""
    d = _np_dtype(dtype)
    if d == bool:
        return "pred"
    if d.name == "bfloat16":
        return "bf16"
    if d.name.startswith("float8"):
        return "f8" + d.name[len("float8_"):]
    bits = d.itemsize * 8
    return {"f": f"f{bits}", "i": f"s{bits}", "u": f"u{bits}", "c": f"c{bits}"}.get(d.kind, d.name)


def shape_text(shape, dtype) -> str | None:
    if shape is None or dtype is None:
        return None
    return f"{short_dtype(dtype)}[{','.join(str(n) for n in shape)}]"


def _number(v):
    """A JSON number (None for NaN and infinities, which JSON cannot carry)."""
    if isinstance(v, complex):
        v = v.real
    if isinstance(v, (bool, int)):
        return int(v)
    v = float(v)
    return v if math.isfinite(v) else None


def _tile(device: int, shape, dtype, preview: dict | None) -> dict:
    import numpy as np

    from .summaries import format_values

    tile = {"device": int(device), "shape": list(shape), "dtype": str(dtype), "text": "did not run",
            "values": [], "heat": None}
    if preview is None:
        return tile
    head = np.asarray(preview["head"])
    shown = head if head.dtype.kind in "biufc" else head.astype(np.float32)  # bfloat16, float8
    tile["text"] = format_values(shown[:TEXT_VALUES], tuple(shape), head.dtype)
    tile["values"] = [_number(v) for v in shown.tolist()]
    if "heat" in preview:
        heat = np.asarray(preview["heat"], dtype=np.float64)
        finite = heat[np.isfinite(heat)]
        tile["heat"] = {
            "rows": int(heat.shape[0]), "cols": int(heat.shape[1]),
            "values": [_number(v) for v in heat.reshape(-1).tolist()],
            "min": float(finite.min()) if finite.size else 0.0,
            "max": float(finite.max()) if finite.size else 0.0,
        }
    return tile


def _per_device(record, mesh_shape: tuple[int, ...]):
    """A record's arrays with the mesh's leading axes folded into one, in mesh order."""
    import numpy as np

    if isinstance(record, dict):
        return {k: _per_device(v, mesh_shape) for k, v in record.items()}
    array = np.asarray(record)
    k = len(mesh_shape)
    if array.shape[:k] == mesh_shape:
        return array.reshape((-1,) + array.shape[k:])
    return array  # already one leading device axis


def _where(site: Site, filename: str | None, line_text: Callable[[int], str] | None):
    """(line, source text) of the call: the frame in `filename` (the cell), else the innermost."""
    frames = [f for f in site.frames if filename is None or f[0] == filename]
    if not frames:
        return None, None
    file, line, _ = frames[0]
    text = line_text(line) if line_text is not None and filename is not None else linecache.getline(file, line).strip()
    return int(line), (text or None)


def _compiled_bytes(compiled, line, kind) -> int | None:
    """The compiled collective's bytes when exactly one of the program's collectives matches."""
    if not compiled or line is None or kind not in _XLA_OP:
        return None
    matches = [c for c in compiled if c.line == line and c.op == _XLA_OP[kind]]
    return int(matches[0].bytes) if len(matches) == 1 else None


def _nbytes(shape, dtype) -> int:
    return 0 if shape is None else math.prod(shape) * _np_dtype(dtype).itemsize


def _card(site: Site, record, mesh_axes, ids, drawn: int, where, compiled) -> dict | None:
    counts = [int(c) for c in record["count"]] if record is not None else None
    if counts is not None and not any(counts):
        return None  # never ran: a branch not taken, a loop of no iterations
    op = site.op
    kind = "none" if op == "axis_index" else KIND.get(op, KIND.get(site.primitive, "none"))
    perm = [tuple(p) for p in site.params.get("perm", ())]
    names = [n for n, _ in mesh_axes]
    if all(a in names for a in site.axes):
        groups = groups_of(mesh_axes, ids, axis_index_order(site.axes, names, site.primitive), site.axis_index_groups)
    else:  # over axes of an inner shard_map's mesh, which these records do not span
        groups, kind = [], "none"
    shown = ids[:drawn]
    iterations = []
    if site.recorded and record is not None:
        labels = (("first", "first"), ("last", "last")) if site.in_loop and max(counts) > 1 else (("only", "first"),)
        for label, part in labels:
            iterations.append({
                "label": label,
                "before": _tiles(record[part].get("in"), site.in_shape, site.in_dtype, shown, counts),
                "after": _tiles(record[part]["out"], site.out_shape, site.out_dtype, shown, counts),
            })
    line, source = where
    estimate = estimated_bytes(kind, groups, ids, _nbytes(site.in_shape, site.in_dtype),
                               _nbytes(site.out_shape, site.out_dtype), perm)
    return {
        "index": 0,
        "op": op,
        "value": site.value,
        "primitive": site.primitive,
        "line": line,
        "source": source,
        "axes": list(site.axes),
        "groups": groups,
        "params": dict(site.params),
        "in_shape": shape_text(site.in_shape, site.in_dtype),
        "out_shape": shape_text(site.out_shape, site.out_dtype),
        "count": max(counts) if counts is not None else None,
        "recorded": bool(site.recorded),
        "why_not": site.why_not,
        "iterations": iterations,
        "devices_omitted": max(0, len(ids) - drawn),
        "movement": movement(kind, groups, perm, shown),
        "bytes": {"sent": estimate["sent"][:drawn], "received": estimate["received"][:drawn], "estimate": True,
                  "compiled": _compiled_bytes(compiled, line, kind)},
    }


def _tiles(previews: dict | None, shape, dtype, shown: list[int], counts: list[int]) -> list[dict]:
    """One tile per drawn device (mesh order); a device that never made the call says so."""
    if previews is None:
        return []  # no input (axis_index)
    return [_tile(d, shape, dtype, {k: v[i] for k, v in previews.items()} if counts[i] else None)
            for i, d in enumerate(shown)]


def collective_cards(sites: Sequence[Site], records, mesh, *, filename: str | None = None,
                     line_text: Callable[[int], str] | None = None, compiled=None,
                     max_cards: int = MAX_CARDS) -> tuple[list[dict], int]:
    """The cards of the calls that ran, in program order, and how many calls were left out.

    `records`: what the Recording returned, fetched to the host, each array with one leading axis
    per mesh axis (or one leading axis of all devices in mesh order). `filename`/`line_text`: the
    cell's file name and a line -> text lookup (cells.Cell.filename, Cell.line). `compiled`: the
    compiled program's collectives (hlo.Collective), for their bytes beside our estimate.
    """
    shape = tuple(int(n) for n in mesh.devices.shape)
    mesh_axes = [(str(n), s) for n, s in zip(mesh.axis_names, shape)]
    ids = [int(d.id) for d in mesh.devices.flat]
    drawn = min(len(ids), MAX_DEVICES_DRAWN)
    cards = []
    for site in sites[:max_cards]:
        record = _per_device(records[site.slot], shape) if site.slot is not None else None
        card = _card(site, record, mesh_axes, ids, drawn, _where(site, filename, line_text), compiled)
        if card is not None:
            card["index"] = len(cards)
            cards.append(card)
    return cards, max(0, len(sites) - max_cards)


def collectives_state(title: str, sites: Sequence[Site], records, mesh, *, filename: str | None = None,
                      line_text: Callable[[int], str] | None = None, compiled=None,
                      device_process: Sequence[int] | None = None) -> dict:
    """The collectives view's whole state (jpm_schemas.md section 1)."""
    cards, omitted = collective_cards(sites, records, mesh, filename=filename, line_text=line_text,
                                      compiled=compiled)
    return {
        "title": title,
        "axes": [{"name": str(n), "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": [int(d.id) for d in mesh.devices.flat],
        "device_process": list(device_process) if device_process is not None else None,
        "cards": cards,
        "omitted_cards": omitted,
    }
