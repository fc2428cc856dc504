"""The tree view's state: one table of a pytree's array leaves, one row per distinct layout.

A 30-layer Adam state has hundreds of leaves but a handful of layouts (shape, dtype, sharding):
the state groups leaves by layout, so what it ships grows with the layouts, not the leaves.
Paths are per leaf, so each row lists a few and counts the rest; each layout's picture is the
sharding view's own state (summaries.sharding_state), built once per layout from its first leaf.
Nothing here reads array data.
"""
from __future__ import annotations

import json

from ..cell.nnx_graphs import leaves_with_paths
from .summaries import dtype_of, sharding_state

#: Rows (distinct layouts) listed; past this the rest are counted.
MAX_ROWS = 64
#: Paths listed per row (the row counts the rest).
PATHS_PER_ROW = 6
#: A longer path keeps its start and end around an ellipsis.
MAX_PATH_CHARS = 100
#: Kinds of static (non-array) leaves listed; past this the rest are counted.
MAX_STATIC_GROUPS = 8
#: JSON characters of pictures (sharding states) one tree state may carry. A picture of an
#: 8-device layout is ~1 KB, one over 4,096 devices ~40 KB: past the budget, rows go without.
PICTURE_BUDGET = 120_000


def is_array_leaf(leaf) -> bool:
    """What the tree view (and the sharding view) draws: a jax.Array, a ShapeDtypeStruct, or host
    data with a shape and dtype (NumPy)."""
    import jax
    import numpy as np

    return isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic))


def is_bare_array(value) -> bool:
    """One array, not a container of them: the sharding view shows it, as it always has."""
    return is_array_leaf(value)


def short_path(path: str) -> str:
    if len(path) <= MAX_PATH_CHARS:
        return path
    keep = (MAX_PATH_CHARS - 1) // 2
    return path[:keep] + "…" + path[-keep:]


def tree_state(name: str, value) -> dict:
    """The tree view's state for `value`, any pytree (``None`` leaves and other non-arrays are
    static leaves: counted by kind, with a few paths, never shipped)."""
    import jax

    flat = leaves_with_paths(value, is_leaf=lambda x: x is None)  # NNX Variables without their `.value`
    layouts: dict = {}  # layout key -> [first leaf, paths]
    statics: dict[str, list[str]] = {}
    for where, leaf in flat:
        if is_array_leaf(leaf):
            layouts.setdefault(_layout_key(leaf), [leaf, []])[1].append(where)
        else:
            statics.setdefault(_static_kind(leaf), []).append(where)
    rows, pictures, per_device = [], [], {}
    budget = PICTURE_BUDGET
    for leaf, paths in layouts.values():
        holds = _device_bytes(leaf)
        for device, nbytes in holds.items():
            per_device[device] = per_device.get(device, 0) + nbytes * len(paths)
        if len(rows) == MAX_ROWS:
            continue
        picture = sharding_state(name + paths[0], leaf)
        row = _row(leaf, paths, picture, holds)
        cost = len(json.dumps(picture, separators=(",", ":")))
        if cost <= budget:
            budget -= cost
            row["picture"] = len(pictures)
            pictures.append(picture)
        rows.append(row)
    arrays = sum(len(paths) for _, paths in layouts.values())
    shown = sum(r["count"] for r in rows)
    return {
        "name": name,
        "type": type(value).__name__,
        "arrays": arrays,
        "layouts": len(layouts),
        "rows": rows,
        "rows_omitted": {"layouts": len(layouts) - len(rows), "leaves": arrays - shown},
        "bytes": sum(_nbytes(leaf) * len(paths) for leaf, paths in layouts.values()),
        "device_bytes": max(per_device.values(), default=None),
        "abstract": any(_kind(leaf) == "abstract" for leaf, _ in layouts.values()),
        "static": _static_state(statics),
        "pictures": pictures,
        "process_count": jax.process_count(),
    }


def _kind(leaf) -> str:
    import jax

    if isinstance(leaf, jax.ShapeDtypeStruct):
        return "abstract"
    return "array" if isinstance(leaf, jax.Array) else "host"


def _layout_key(leaf):
    sharding = getattr(leaf, "sharding", None)
    try:
        hash(sharding)
    except TypeError:  # a sharding that cannot be a dict key is its own layout
        sharding = ("unhashable", id(sharding))
    return _kind(leaf), tuple(int(n) for n in leaf.shape), dtype_of(leaf).name, sharding


def _nbytes(leaf) -> int:
    import math

    return math.prod(int(n) for n in leaf.shape) * dtype_of(leaf).itemsize


def _device_bytes(leaf) -> dict:
    """Bytes one leaf puts on each device, by id; under "every" for the positions of an abstract
    mesh (no devices yet, the same shard shape at every position)."""
    import math

    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        return {}
    shape = tuple(int(n) for n in leaf.shape)
    itemsize = dtype_of(leaf).itemsize
    try:
        where = sharding.devices_indices_map(shape)
    except ValueError:  # an AbstractMesh says its devices are "not implemented"
        return {"every": math.prod(sharding.shard_shape(shape)) * itemsize}
    return {int(d.id): math.prod(len(range(*s.indices(n))) for s, n in zip(index, shape)) * itemsize
            for d, index in where.items()}


def _row(leaf, paths: list[str], picture: dict, holds: dict) -> dict:
    from .base import format_spec

    return {
        "shape": picture["shape"],
        "dtype": picture["dtype"],
        "kind": _kind(leaf),
        "spec": format_spec(picture["spec"]) if picture["mesh_axes"] else "",
        "where": layout_words(picture),
        "bytes": _nbytes(leaf),
        "device_bytes": max(holds.values(), default=None),
        "count": len(paths),
        "paths": [short_path(p) for p in paths[:PATHS_PER_ROW]],
        "more_paths": max(0, len(paths) - PATHS_PER_ROW),
        "picture": None,
    }


def layout_words(picture: dict) -> str:
    """A sharding state's layout in words: "split dim 0 8× over data; replicated over model",
    "replicated on 8 devices", "single device (3)", "abstract, no sharding"..."""
    import math

    total = picture["total_devices"]
    abstract = picture["abstract"]
    if not total and not picture["mesh_axes"]:
        return "abstract, no sharding" if abstract else "host memory (NumPy), on no device"
    tail = " (abstract)" if abstract else ""
    grid = picture["grid"]
    spare = [a["name"] for a in picture["mesh_axes"] if a["name"] in picture["replicated_over"] and a["size"] > 1]
    if math.prod(grid) == 1:
        if total == 1:
            held = picture["blocks"][0] if picture["blocks"] and not picture["mesh_axes"] else None
            return (f"single device ({held})" if isinstance(held, int) else "single device") + tail
        return f"replicated on {total} devices" + tail
    if not picture["mesh_axes"]:
        return f"{math.prod(grid)} blocks over {total} devices" + tail
    splits = []
    for k, entry in enumerate(picture["spec"]):
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        if axes and grid[k] > 1:
            splits.append(f"dim {k} {grid[k]}× over {'×'.join(axes)}")
    words = "split " + ", ".join(splits) + (f"; replicated over {', '.join(spare)}" if spare else "")
    return words + tail


def _static_kind(leaf) -> str:
    if leaf is None:
        return "None"
    if callable(leaf) and not isinstance(leaf, type):
        return "function"
    return type(leaf).__name__


def _static_state(statics: dict[str, list[str]]) -> dict:
    groups = [{"kind": kind, "count": len(paths), "paths": [short_path(p) for p in paths[:PATHS_PER_ROW]],
               "more_paths": max(0, len(paths) - PATHS_PER_ROW)}
              for kind, paths in list(statics.items())[:MAX_STATIC_GROUPS]]
    return {"count": sum(len(p) for p in statics.values()), "groups": groups,
            "groups_omitted": max(0, len(statics) - MAX_STATIC_GROUPS)}
