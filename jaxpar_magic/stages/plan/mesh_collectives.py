"""A compiled program's collectives on the mesh: which devices each one joins and along which mesh
axes, what one device sends with a ring algorithm, and the line of the user's code that needs it.
"""
from __future__ import annotations

import linecache
import os
from collections.abc import Callable

from ...cell.hlo import Collective, operands_text
from ...cell.loops import calls_text
from ...errors import PACKAGE_DIR
from .plan import PlannedCollective

# Ring algorithms: the share of an array each device sends, for a group of n devices (the
# collective's `traffic_bytes`; its time comes from stages/plan/costs.py, on the mesh's topology).
RING_FACTORS = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0,
}


# --- collectives over the mesh -----------------------------------------------------------------

def _quoted(axes) -> str:
    return " x ".join(repr(a) for a in axes)


def _varying_axes(positions, shape, names) -> tuple[list[str], int]:
    """Mesh axes the devices at `positions` differ along, and how many devices those axes span."""
    import numpy as np

    coords = np.array(np.unravel_index(np.asarray(positions), shape)).reshape(len(shape), -1)
    varying = [i for i in range(len(shape)) if coords[i].min() != coords[i].max()]
    return [names[i] for i in varying], int(np.prod([shape[i] for i in varying]))


def _describe_groups(groups, shape, names) -> tuple[tuple[str, ...], int, str]:
    """(axes, group size, text) for replica groups given as mesh positions."""
    sizes = sorted({len(g) for g in groups})
    axes: list[str] = []
    partial = False
    for group in groups:
        varying, span = _varying_axes(group, shape, names)
        axes.extend(a for a in varying if a not in axes)
        partial = partial or span != len(group)
    axes = [n for n in names if n in axes]  # mesh order
    size = sizes[-1]
    count = f"{len(groups)} group{'s' if len(groups) != 1 else ''}"
    of = f"of {size}" if len(sizes) == 1 else f"of {sizes[0]} to {size}"
    if size == 1:
        return (), 1, f"{count} of 1 (no data moves)"
    over = f"over part of {_quoted(axes)}" if partial else f"over {_quoted(axes)}"
    return tuple(axes), size, f"{count} {of} {over}"


def _describe_pairs(pairs, shape, names) -> tuple[tuple[str, ...], int, list[list[int]], str]:
    """(axes, group size, groups, text) for a collective-permute's (source, target) positions."""
    sends = [(a, b) for a, b in pairs if a != b]
    if not sends:
        return (), 1, [], "no device sends (every device keeps its block)"
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    axes: list[str] = []
    for a, b in sends:
        parent[root(a)] = root(b)
        varying, _ = _varying_axes([a, b], shape, names)
        axes.extend(v for v in varying if v not in axes)
    components: dict[int, list[int]] = {}
    for x in list(parent):
        components.setdefault(root(x), []).append(x)
    groups = sorted(sorted(c) for c in components.values())
    axes = [n for n in names if n in axes]
    size = max(len(g) for g in groups)
    text = f"{len(sends)} send{'s' if len(sends) != 1 else ''} between pairs of devices along {_quoted(axes)}"
    return tuple(axes), size, groups, text


def _across_slices(mesh, shape, names) -> tuple[tuple[str, ...], int, list[list[int]], str]:
    """(axes, group size, groups, text) of a Megascale transfer: each device with the devices at its
    place in the other slices (XLA:TPU has reduced within each slice over ICI first)."""
    slices: dict[int, list[int]] = {}
    for position, device in enumerate(mesh.devices.flat):
        slices.setdefault(int(getattr(device, "slice_index", 0) or 0), []).append(position)
    members = list(slices.values())
    groups = [list(g) for g in zip(*members)] if len({len(m) for m in members}) == 1 else [sum(members, [])]
    axes, size, _ = _describe_groups(groups, shape, names)
    text = f"the cross-slice stage: {len(members)} slices over DCN (Megascale), {len(groups)} groups of {size}"
    return axes, size, groups, text


def _ring_array_bytes(c: Collective, size: int) -> int:
    """The array a ring algorithm passes around: a reduce-scatter's input (`size` blocks), else the result."""
    if c.op != "reduce-scatter":
        return c.bytes
    return c.operand_bytes if c.operand_bytes is not None else c.bytes * size


def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are not the user's: JAX, jaxlib, this package, Python's own."""
    import sysconfig

    import jax
    import jaxlib

    dirs = {os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__), PACKAGE_DIR}
    dirs.update(p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")) if p)
    return tuple(os.path.join(d, "") for d in dirs)


def is_user_file(file: str) -> bool:
    """A frame in the user's code: a notebook cell (registered in linecache) or a file outside the
    libraries (`_library_dirs`)."""
    if file.startswith("<"):
        return file in linecache.cache
    return not file.startswith(_LIBRARIES or _libraries())


_LIBRARIES: tuple[str, ...] = ()


def _libraries() -> tuple[str, ...]:
    global _LIBRARIES
    _LIBRARIES = _library_dirs()
    return _LIBRARIES


def cell_label(file: str) -> str:
    """`In[3]` for a notebook cell (IPython's own name for it), the file's name otherwise."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        named = shell.compile.format_code_name(file) if shell is not None else None
    except Exception:  # no IPython, or one without format_code_name
        named = None
    if named:
        return named[1]
    return file if file.startswith("<") else os.path.basename(file)


def origin_of(frame: tuple | None) -> dict | None:
    """A user frame (file, line, function) as the views show it: function, line, its text, the cell."""
    if frame is None:
        return None
    file, line, function = frame
    return {"function": function or None, "line": line, "source": linecache.getline(file, line).strip() or None,
            "cell": cell_label(file)}


def plan_collectives(found: list[Collective], mesh, line_text: Callable[[int], str] | None = None,
                     filename: str | None = None, rewritten: bool = True) -> list[PlannedCollective]:
    """The compiled program's collectives with their groups mapped to mesh axes and device ids.
    `found` holds replica-group positions in mesh order (hlo.collectives without device ids).
    `rewritten`: the reduce-scatters that cell/scatter.py made of a sliced all-reduce are the
    target's, not this compiler's (XLA:CPU), and say so."""
    shape = tuple(mesh.devices.shape)
    names = [str(n) for n in mesh.axis_names]
    ids = [d.id for d in mesh.devices.flat]
    total = len(ids)
    planned = []
    for c in found:
        if c.over_dcn:
            axes, size, groups, text = _across_slices(mesh, shape, names)
        elif c.op == "collective-permute":
            axes, size, groups, text = _describe_pairs(c.pairs, shape, names)
        else:
            groups = c.groups or [list(range(total))]
            axes, size, text = _describe_groups(groups, shape, names)
        traffic = RING_FACTORS[c.op](size) * _ring_array_bytes(c, size) if size > 1 else 0.0
        if c.whole_bytes and size > 1:  # the elements summed whole are gathered back after the scatter
            traffic += RING_FACTORS["all-gather"](size) * c.whole_bytes
        text += calls_text(c.count, c.backward, c.per_trip, c.at_most) + operands_text(c)
        if c.windowed:
            of = "an operand of the matmul" if c.windowed == "all-gather" else "the matmul's result"
            calls = f"{c.windowed_calls:,} permutes" if c.windowed_calls is not None else "permutes"
            text += f"; XLA:TPU's windowed einsum: the {c.windowed} of {of} at this line, done as {calls} a step"
        source = None
        if c.line is not None:
            source = line_text(c.line) if line_text is not None else linecache.getline(filename or "", c.line).strip()
        planned.append(PlannedCollective(
            op=c.op, shape=c.shape, bytes=c.bytes, traffic_bytes=traffic, count=c.count, group_size=size,
            groups=[[ids[p] for p in g] for g in groups], axes=axes, groups_text=text, line=c.line,
            source=source or None, upcast_from=c.upcast_from, operand_bytes=c.operand_bytes,
            origin=origin_of(c.origin), sliced_from=c.sliced_from if rewritten else None,
            reduction=c.reduction, over_dcn=c.over_dcn, operands=c.operands,
            whole_bytes=c.whole_bytes if rewritten else 0, per_trip=c.per_trip, at_most=c.at_most,
            overlapped=None if rewritten or c.over_dcn else c.overlapped,
        ))
    return planned
