"""Sample view states computed independently of the package (an oracle for the views' tests)."""
from __future__ import annotations

from typing import Any


def sharding_state(
    shape: list[int],
    mesh: list[tuple[str, int]],
    spec: list[Any],
    *,
    dtype: str = "float32",
    name: str = "x",
) -> dict[str, Any]:
    """A sharding state computed the way jax does for evenly divisible shapes."""
    import itertools

    sizes = dict(mesh)
    names = [a for a, _ in mesh]
    entries = [[] if e is None else ([e] if isinstance(e, str) else list(e)) for e in spec]
    entries += [[]] * (len(shape) - len(entries))
    grid = [1] * len(shape)
    for k, e in enumerate(entries):
        for a in e:
            grid[k] *= sizes[a]
    used = {a for e in entries for a in e}
    holders: dict[tuple[int, ...], list[int]] = {}
    total = 1
    for _, s in mesh:
        total *= s
    for dev, coords in enumerate(itertools.product(*[range(s) for _, s in mesh])):
        at = dict(zip(names, coords))
        block = []
        for e in entries:
            b = 0
            for a in e:
                b = b * sizes[a] + at[a]
            block.append(b)
        holders.setdefault(tuple(block), []).append(dev)
    # The compact form summaries.sharding_state sends: cut points per dimension, then who holds
    # each block in row-major order (an id, or a list when several devices hold it).
    bounds = [[b * (d // g) for b in range(g + 1)] for d, g in zip(shape, grid)]
    blocks = [
        devs[0] if len(devs) == 1 else devs
        for devs in (holders[key] for key in itertools.product(*[range(g) for g in grid]))
    ]
    nbytes = 4
    for d in shape:
        nbytes *= d
    return {
        "name": name,
        "shape": shape,
        "dtype": dtype,
        "spec": spec,
        "mesh_axes": [{"name": a, "size": s} for a, s in mesh],
        "grid": grid,
        "bounds": bounds,
        "blocks": blocks,
        "replicated_over": [a for a in names if a not in used],
        "total_devices": total,
        "abstract": False,
        "process_count": 1,
        "nbytes": nbytes,
    }
