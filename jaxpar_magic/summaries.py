"""Small summaries of results and programs: the states our views are built from.

Nothing here ships array data: a view gets shapes, dtypes and at most a few values per device,
for at most MAX_TILES devices, whatever the array's size.
"""
from __future__ import annotations

from .hlo import Collective

MAX_TILES = 16  # per-device tiles shipped per output
VALUES_PER_TILE = 4  # values shown per tile
MAX_GROUPS = 64
MAX_PAIRS = 256


def format_values(values, shape, dtype) -> str:
    """`3.5` for a scalar; `[1. 2. 3. …]` for the first values of a larger block."""
    import numpy as np

    vals = np.asarray(values)
    if not shape:
        return np.array2string(vals.reshape(()), precision=4, suppress_small=True)
    size = int(np.prod(shape))
    body = np.array2string(vals.reshape(-1), precision=4, suppress_small=True, separator=" ",
                           max_line_width=10_000)[1:-1].strip()
    return f"[{body}{' …' if size > vals.size else ''}]"


def per_device_summary(name: str, stacked, k: int, device_ids: list[int], coords: list[tuple]) -> dict:
    """One output's tiles: each device's value, or one line when every device holds the same."""
    import jax.numpy as jnp
    import numpy as np

    total = len(device_ids)
    per_shape = tuple(stacked.shape[k:])
    flat = jnp.reshape(stacked, (total, -1))
    width = min(VALUES_PER_TILE, flat.shape[1])
    same = bool(jnp.all(flat == flat[:1])) if flat.shape[1] else True
    shown = 1 if same else min(total, MAX_TILES)
    head = np.asarray(flat[:shown, :width])  # the only values that ever leave the device
    tiles = []
    for row in range(shown):
        ids = device_ids if same else [device_ids[row]]
        tiles.append({
            "devices": ids[:MAX_TILES],
            "coords": list(coords[row]),
            "text": format_values(head[row], per_shape, stacked.dtype),
        })
    return {
        "name": name,
        "shape": list(per_shape),
        "dtype": str(stacked.dtype),
        "same_on_all": same,
        "tiles": tiles,
        "omitted": 0 if same else total - shown,
        "same_text": f"same on all {total} devices" if same else None,
    }


def _groups_text(groups: list[list[int]], total: int) -> str:
    if not groups:
        return f"all {total} devices together"
    sizes = {len(g) for g in groups}
    size = f"{sizes.pop()}" if len(sizes) == 1 else "mixed sizes"
    return f"{len(groups)} group{'s' if len(groups) != 1 else ''} of {size}"


def collective_state(c: Collective, total: int, source_line: str | None) -> dict:
    return {
        "op": c.op,
        "shape": c.shape,
        "bytes": c.bytes,
        "groups": c.groups[:MAX_GROUPS],
        "groups_text": (f"{len(c.pairs)} send{'s' if len(c.pairs) != 1 else ''} between pairs of devices"
                        if c.pairs and not c.groups else _groups_text(c.groups, total)),
        "pairs": [list(p) for p in c.pairs[:MAX_PAIRS]],
        "pairs_omitted": max(0, len(c.pairs) - MAX_PAIRS),
        "source_line": source_line,
    }


def mesh_coords(mesh) -> tuple[list[int], list[tuple]]:
    import numpy as np

    ids = [d.id for d in mesh.devices.flat]
    coords = [tuple(int(c) for c in idx) for idx in np.ndindex(mesh.devices.shape)]
    return ids, coords


def program_state(facts, total: int, line_text) -> tuple[list, dict | None]:
    """Collectives (with the user's line that issued each) and the --report figures."""
    if facts is None:
        return [], None
    colls = [collective_state(c, total, line_text(c.line) if c.line else None) for c in facts.collectives]
    return colls, facts


def result_state(title: str, mesh, outputs: dict, facts=None, line_text=lambda n: None,
                 report: dict | None = None) -> dict:
    """The per-device result view's state for named per-device outputs (pytrees are flattened)."""
    import jax

    ids, coords = mesh_coords(mesh)
    k = len(mesh.axis_names)
    items = []
    for name, value in outputs.items():
        leaves = jax.tree_util.tree_leaves_with_path(value)
        for path, leaf in leaves:
            label = name + jax.tree_util.keystr(path)
            items.append(per_device_summary(label, leaf, k, ids, coords))
    colls, _ = program_state(facts, len(ids), line_text)
    return {
        "title": title,
        "axes": [{"name": n, "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": ids,
        "outputs": items,
        "collectives": colls,
        "report": report,
    }


def program_report_state(title: str, mesh, facts, run_ms: float, line_text) -> dict:
    """A result-view state with no per-device outputs: what the compiled program communicates."""
    ids, _ = mesh_coords(mesh)
    colls, _ = program_state(facts, len(ids), line_text)
    return {
        "title": title,
        "axes": [{"name": n, "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": ids,
        "outputs": [],
        "collectives": colls,
        "report": report_figures(facts, run_ms),
    }


def report_figures(facts, run_ms: float) -> dict:
    """--report's figures: first compile, this run, and XLA's cost analysis."""
    return {"compile_ms": facts.compile_ms, "run_ms": run_ms, "flops": facts.flops,
            "bytes_accessed": facts.bytes_accessed}


# --- meshes and shardings ----------------------------------------------------------------------

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


def sharding_state(name: str, value) -> dict:
    """The sharding view's state for a jax.Array, a ShapeDtypeStruct with a sharding, or host data.

    Built from shape, dtype and sharding only: its size depends on the number of shards.
    """
    import jax
    import numpy as np

    from .layout import named_tiles, spec_axes, tiles_from_index_map

    shape = tuple(int(n) for n in value.shape)
    dtype = np.dtype(value.dtype)
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
        from .layout import Tile

        tiles = [Tile((0,) * len(shape), tuple((0, n) for n in shape), ())]
        total = 0
    grid = [max((t.block[d] for t in tiles), default=0) + 1 for d in range(len(shape))]
    return {
        "name": name,
        "shape": list(shape),
        "dtype": dtype.name,
        "spec": spec,
        "mesh_axes": mesh_axes,
        "grid": grid,
        "tiles": [
            {"block": list(t.block), "index": [list(i) for i in t.index], "shard_shape": list(t.shard_shape),
             "devices": list(t.devices)}
            for t in tiles[:MAX_SHARDING_TILES]
        ],
        "replicated_over": replicated,
        "total_devices": total,
        "abstract": abstract,
        "process_count": jax.process_count(),
        "nbytes": int(np.prod(shape, dtype=object)) * dtype.itemsize,
    }
