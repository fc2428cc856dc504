"""Small summaries of results and programs: the states our views are built from (a result view's
per-device values: views/values.py).

Nothing here ships array data: a view gets shapes, dtypes and at most a few values per device,
for at most MAX_TILES devices, whatever the array's size.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections import OrderedDict

from ..cell.hlo import Collective, operands_text
from ..cell.loops import calls_text

MAX_TILES = 16  # per-device tiles shipped per output
VALUES_PER_TILE = 4  # values shown per tile
MAX_GROUPS = 64
MAX_PAIRS = 256


def format_values(values, shape, dtype) -> str:
    """`3.5` for a scalar; `[1. 2. 3. …]` for the first values of a larger block (NumPy's
    `array2string` at precision 4, whose text the views show)."""
    import numpy as np

    vals = np.asarray(values)
    size = math.prod(int(n) for n in shape) if shape else 1  # np.prod is a ufunc reduction: ~5 µs
    flat = vals.reshape(-1)
    body = _whole_numbers(flat)  # the common cases, without array2string's cost (~30-100 µs a call)
    if body is None:
        body = _positional(flat)
    if body is None:
        if not shape:
            return np.array2string(vals.reshape(()), precision=4, suppress_small=True)
        body = np.array2string(flat, precision=4, suppress_small=True, separator=" ",
                               max_line_width=10_000)[1:-1].strip()
    if not shape:
        return body
    return f"[{body}{' …' if size > vals.size else ''}]"


def _whole_numbers(flat) -> str | None:
    """array2string's text for integers, and float32/float64 values that all hold whole numbers below
    1e6 (each right-aligned to the widest, floats ending in '.'), else None. The checks run on Python
    floats (exact for both types): NumPy's reductions cost ~2 µs each on a tile's few values."""
    kind = flat.dtype.kind
    if kind not in "iuf" or flat.size == 0 or (kind == "f" and flat.dtype.itemsize not in (4, 8)):
        return None  # float16 prints 1000 as 1.e+03: left to array2string
    values = flat.tolist()
    if kind == "f":
        if not all(math.isfinite(v) and abs(v) < 1e6 and v == round(v) for v in values):
            return None
        if any(v == 0 and math.copysign(1.0, v) < 0 for v in values):  # -0. has a sign array2string keeps
            return None
        words = [f"{int(v)}." for v in values]
    else:
        words = [str(v) for v in values]
    width = max(len(w) for w in words)
    return " ".join(w.rjust(width) for w in words).strip()


#: Below this, array2string prints a float type in fixed point: 10**min(8, its decimal precision).
_FIXED_BELOW = {"f": 1e6, "d": 1e8}


def _positional(flat) -> str | None:
    """array2string's text (precision 4, suppress_small, NumPy's default print options) for finite
    float32/float64 values below _FIXED_BELOW, which it prints in fixed point: each value's shortest
    digits at that precision, integer parts right-aligned and fractions left-aligned to the widest;
    else None."""
    import numpy as np

    below = _FIXED_BELOW.get(flat.dtype.char)
    if below is None or flat.size == 0:
        return None
    options = np.get_printoptions()
    if options["floatmode"] != "maxprec" or options["sign"] != "-" or options["legacy"] is not False:
        return None
    if not all(math.isfinite(v) and abs(v) < below for v in flat.tolist()):
        return None  # nan, inf, or scientific notation: left to array2string
    parts = [np.format_float_positional(v, precision=4, unique=True, fractional=True, trim=".").split(".")
             for v in flat]  # NumPy scalars of the array's own type: their shortest digits are its own
    left, right = max(len(i) for i, _ in parts), max(len(f) for _, f in parts)
    return " ".join(f"{i.rjust(left)}.{f.ljust(right)}" for i, f in parts).strip()


def is_key_array(value) -> bool:
    """A typed PRNG key array (`jax.random.key`, dtype `key<fry>`): no NumPy form, no arithmetic."""
    import jax

    dtype = getattr(value, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def numbers_of(value):
    """The numbers a view may show of `value`: a key array's key data (its uint32 words, a trailing
    dimension more, laid out as the keys are), any other array unchanged."""
    import jax

    return jax.random.key_data(value) if is_key_array(value) else value


def to_host(value):
    """A small device value as NumPy. In a cluster a global array is not all on this process's
    devices: every process then gathers it (the processes run this same code together)."""
    import numpy as np

    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _groups_text(groups: list[list[int]], total: int) -> str:
    if not groups:
        return f"all {total} devices together"
    sizes = {len(g) for g in groups}
    size = f"{sizes.pop()}" if len(sizes) == 1 else "mixed sizes"
    return f"{len(groups)} group{'s' if len(groups) != 1 else ''} of {size}"


def collective_state(c: Collective, total: int, source_line: str | None) -> dict:
    return {
        "op": c.op,
        "reduction": c.reduction,
        "shape": c.shape,
        "bytes": c.bytes,
        "groups": c.groups[:MAX_GROUPS],
        "groups_text": (f"{len(c.pairs)} send{'s' if len(c.pairs) != 1 else ''} between pairs of devices"
                        if c.pairs and not c.groups else _groups_text(c.groups, total)) + calls_text(c.count, c.backward, c.per_trip, c.at_most)
                       + operands_text(c),
        "count": c.count,
        "pairs": [list(p) for p in c.pairs[:MAX_PAIRS]],
        "pairs_omitted": max(0, len(c.pairs) - MAX_PAIRS),
        "source_line": source_line,
    }


@functools.lru_cache(maxsize=16)
def mesh_coords(mesh) -> tuple[list[int], list[tuple]]:
    """Device ids in mesh order and each one's mesh coordinates (read once per mesh: every shown
    result view asks; callers must not change the lists)."""
    import numpy as np

    ids = [d.id for d in mesh.devices.flat]
    coords = [tuple(int(c) for c in idx) for idx in np.ndindex(mesh.devices.shape)]
    return ids, coords


def program_state(facts, total: int, line_text) -> list:
    """The compiled program's collectives, each with the user's line that issued it."""
    if facts is None:
        return []
    return [collective_state(c, total, line_text(c.line) if c.line else None) for c in facts.collectives]


def program_report_state(title: str, mesh, facts, run_ms: float, line_text) -> dict:
    """A result-view state with no per-device outputs: what the compiled program communicates."""
    ids, _ = mesh_coords(mesh)
    colls = program_state(facts, len(ids), line_text)
    return {
        "title": title,
        "axes": [{"name": n, "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": list(ids),
        "outputs": [],
        "collectives": colls,
        "report": report_figures(facts, run_ms),
    }


def report_figures(facts, run_ms: float) -> dict:
    """--report's figures: first compile, this run, and XLA's cost analysis."""
    return {"compile_ms": facts.compile_ms, "run_ms": run_ms, "flops": facts.flops,
            "bytes_accessed": facts.bytes_accessed}


# --- meshes and shardings ----------------------------------------------------------------------

#: Blocks listed per sharding state; past this, `blocks` stops (row-major) and the rest are not sent.
MAX_SHARDING_TILES = 4096


def mesh_state(mesh, name: str = "mesh") -> dict:
    """The mesh view's state: axes, device ids in row-major mesh order (positions when abstract)."""
    import jax

    abstract = isinstance(mesh, jax.sharding.AbstractMesh)
    sizes = tuple(int(s) for s in mesh.shape.values())
    total = 1
    for s in sizes:
        total *= s
    ids = list(range(total)) if abstract else [int(d.id) for d in mesh.devices.flat]
    kinds = [] if abstract else sorted({str(d.device_kind) for d in mesh.devices.flat})
    types = getattr(mesh, "axis_types", None) or ()
    return {
        "name": name,
        "axes": [{"name": str(n), "size": s} for n, s in zip(mesh.axis_names, sizes)],
        "device_ids": ids,
        "axis_types": [getattr(t, "name", str(t)) for t in types],
        "abstract": abstract,
        "kinds": kinds,
    }


def _spec_entry(entry):
    if entry is None or isinstance(entry, str):
        return entry
    return [str(e) for e in entry]


def dtype_of(value):
    """`value`'s dtype with a `name` and an `itemsize`: NumPy's, or JAX's own for extended dtypes
    (PRNG key arrays, `key<fry>`, which NumPy cannot interpret)."""
    import jax
    import numpy as np

    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended):
        return value.dtype
    return np.dtype(value.dtype)


def sharding_state(name: str, value) -> dict:
    """The sharding view's state for a jax.Array, a ShapeDtypeStruct with a sharding, or host data.

    Built from shape, dtype and sharding only: its size depends on the number of shards. Where
    the blocks are is written once per dimension, who holds them once per block:

    - ``grid[d]``: how many blocks dimension ``d`` is cut into.
    - ``bounds[d]``: the ``grid[d] + 1`` cut points along dimension ``d``, non-decreasing, from 0
      to ``shape[d]`` (``[0, 500, 1000, ..., 4000]``); block ``b`` spans ``[bounds[d][b],
      bounds[d][b + 1])``, so its index slices and shard shape follow.
    - ``blocks[k]``: who holds the ``k``-th block in row-major order over ``grid``: a device id
      when one device holds it, else the list of ids (several: replicas; none: host data, or a
      part of the array no device holds). At most MAX_SHARDING_TILES entries: a shorter list
      than ``prod(grid)`` means the remaining blocks were not sent.

    ``expand_sharding_tiles`` turns this back into one ``{block, index, shard_shape, devices}``
    per block, and ``js/sharding.js`` decodes it the same way.
    """
    import jax
    import numpy as np

    from ..cell.layout import named_tiles, spec_axes, tiles_from_index_map

    shape = tuple(int(n) for n in value.shape)
    dtype = dtype_of(value)
    sharding = getattr(value, "sharding", None)
    mesh_axes, spec, replicated = [], [], []
    abstract = isinstance(value, jax.ShapeDtypeStruct)  # a plan: a shape and a layout, no data
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        state = mesh_state(mesh)
        names = tuple(a["name"] for a in state["axes"])
        sizes = tuple(a["size"] for a in state["axes"])
        tiles = named_tiles(shape, names, sizes, state["device_ids"], sharding.spec)
        mesh_axes = state["axes"]
        spec = [_spec_entry(e) for e in sharding.spec]
        used = {a for axes in spec_axes(sharding.spec, len(shape)) for a in axes}
        replicated = [n for n in names if n not in used]
        total = len(state["device_ids"])
    elif sharding is not None:
        tiles = tiles_from_index_map(shape, sharding.devices_indices_map(shape))
        total = len(sharding.device_set)
    else:  # a NumPy array: in host memory, on no device
        from ..cell.layout import Tile

        tiles = [Tile((0,) * len(shape), tuple((0, n) for n in shape), ())]
        total = 0
    grid, bounds, blocks = compact_tiles(shape, tiles)
    return {
        "name": name,
        "shape": list(shape),
        "dtype": dtype.name,
        "spec": spec,
        "mesh_axes": mesh_axes,
        "grid": grid,
        "bounds": bounds,
        "blocks": blocks[:MAX_SHARDING_TILES],
        "replicated_over": replicated,
        "total_devices": total,
        "abstract": abstract,
        "process_count": jax.process_count(),
        "nbytes": int(np.prod(shape, dtype=object)) * dtype.itemsize,
    }


_shown_layouts: OrderedDict = OrderedDict()  # (name, layout) -> its sharding state, for views shown again
SHOWN_LAYOUTS = 64


def shown_sharding_state(name: str, value) -> dict:
    """sharding_state of a value a view shows, one dict per name and layout: a re-run that shows an
    output of the same shape, dtype and sharding gets the very same state (the magic layer then
    shows its widget again: face/magics.py). The state is read-only: never change it in place."""
    import jax

    sharding = getattr(value, "sharding", None)
    key = (name, isinstance(value, jax.ShapeDtypeStruct), tuple(value.shape), str(value.dtype), sharding)
    try:
        state = _shown_layouts.get(key)
    except TypeError:  # an unhashable sharding: no reuse
        return sharding_state(name, value)
    if state is None:
        state = _shown_layouts[key] = sharding_state(name, value)
        while len(_shown_layouts) > SHOWN_LAYOUTS:
            _shown_layouts.popitem(last=False)
    else:
        _shown_layouts.move_to_end(key)
    return state


def compact_tiles(shape, tiles) -> tuple[list[int], list[list[int]], list[int | list[int]]]:
    """(grid, bounds, blocks) of `tiles` (layout.Tile), as `sharding_state` documents them.

    Every layout JAX can describe is a product grid: an HloSharding cuts each dimension at fixed
    points, whatever the other dimensions do, and `named_tiles` / `tiles_from_index_map` number
    blocks by their position along each dimension. A layout whose blocks disagree on a cut point
    is not one, and cannot be drawn as a grid: ValueError. A block no tile covers (a layout that
    leaves part of the array on no device) is kept, held by no device: ``[]``.
    """
    ndim = len(shape)
    grid = [max((t.block[d] for t in tiles), default=0) + 1 for d in range(ndim)]
    cuts: list[list[int | None]] = [[None] * (g + 1) for g in grid]
    held: dict[tuple[int, ...], tuple[int, ...]] = {}
    for t in tiles:
        for d, (b, (start, stop)) in enumerate(zip(t.block, t.index)):
            for at, value in ((b, start), (b + 1, stop)):
                if cuts[d][at] not in (None, value):
                    raise ValueError(
                        f"blocks of a {tuple(shape)} array disagree on where dimension {d} is cut "
                        f"(cut {at}: {cuts[d][at]} or {value}): not a grid of blocks"
                    )
                cuts[d][at] = value
        held[tuple(t.block)] = tuple(t.devices)
    if any(c is None for dim in cuts for c in dim):
        raise ValueError(f"tiles of a {tuple(shape)} array leave a row of blocks out: not a grid of blocks")
    bounds = [[int(c) for c in dim] for dim in cuts]
    blocks = []
    for block in itertools.product(*(range(g) for g in grid)):
        devices = held.get(block, ())
        blocks.append(int(devices[0]) if len(devices) == 1 else [int(d) for d in devices])
    return grid, bounds, blocks


def expand_sharding_tiles(state: dict) -> list[dict]:
    """The blocks of a sharding state, one ``{block, index, shard_shape, devices}`` each.

    The one decoder of ``bounds`` and ``blocks`` on the Python side (``js/sharding.js`` has its
    twin): blocks in row-major order over ``grid``, the blocks a capped state did not send left out.
    """
    grid = [int(g) for g in state.get("grid") or []]
    bounds = state.get("bounds") or []
    blocks = state.get("blocks") or []
    if len(bounds) != len(grid) or any(len(b) != g + 1 for b, g in zip(bounds, grid)):
        raise ValueError(f"sharding state: bounds {bounds!r} do not match grid {grid!r}")
    if len(blocks) > math.prod(grid):
        raise ValueError(f"sharding state: {len(blocks)} blocks for a grid of {math.prod(grid)}")
    tiles = []
    for block, held in zip(itertools.product(*(range(g) for g in grid)), blocks):
        index = [[int(bounds[d][b]), int(bounds[d][b + 1])] for d, b in enumerate(block)]
        tiles.append({
            "block": list(block),
            "index": index,
            "shard_shape": [stop - start for start, stop in index],
            "devices": [int(held)] if isinstance(held, int) else [int(d) for d in held],
        })
    return tiles
