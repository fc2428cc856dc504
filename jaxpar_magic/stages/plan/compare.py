"""`--compare NAME`: plan one cell under several layouts and rank them by estimated step time.

NAME is a dict in the namespace mapping a label to a layout, `{"mesh": mesh, "in": {"x": P("data",
None), "params": specs}, "out": {...}}` ("out" optional): each `in`/`out` value is one PartitionSpec
(or a pytree of them, passed to the engine as given). Every layout is one `plan_cell.plan_cell`, so a
row is exactly what planning that layout alone gives; a layout that fails to plan is a row with its
one-line reason. `search_layouts` proposes the standard candidates itself (`--search BATCH`).

Plain Python over the engines; no IPython.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import UsageError
from .plan_cell import engine_spec

LAYOUT_KEYS = ("mesh", "in", "out")
EXAMPLE = ('layouts = {"dp": {"mesh": mesh, "in": {"x": P("data", None), "w": P()}}, '
           '"fsdp": {"mesh": mesh, "in": {"x": P("data", None), "w": P("data", None)}}}')


@dataclass
class Row:
    label: str
    plan: object = None  # planning.Plan, or None when it failed
    error: str | None = None

    def state(self) -> dict:
        if self.plan is None:
            return {"label": self.label, "error": self.error}
        p, r = self.plan, self.plan.roofline
        moved = sum(c.bytes * c.calls for c in p.collectives if c.group_size > 1)
        largest = p.peak.largest if p.peak is not None else None
        return {
            "label": self.label, "error": None,
            "axes": [{"name": n, "size": s} for n, s in p.axes.items()],
            "memory": p.total_bytes, "peak": p.total_bytes, "capacity": p.capacity, "fits": p.fits,
            "largest": largest.state() if largest is not None else None, "compiler": p.compiler,
            "collective_bytes": moved, "collectives": sum(1 for c in p.collectives if c.group_size > 1),
            "flops": p.flops, "refused": p.refused,
            "compute_s": r.compute_s if r else None, "memory_s": r.memory_s if r else None,
            "collective_s": r.collective_s if r else None, "estimate_s": r.estimate_s if r else None,
            "serial_s": r.serial_s if r else None, "bound": r.bound if r else None,
            "bound_text": r.bound_text if r else None,
        }


def _specs(value, label: str, key: str, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise UsageError(
            f"--compare {name}: layout {label!r} has {key!r} = {type(value).__name__}; expected a dict from input "
            f"names to PartitionSpecs, e.g. {{\"x\": P(\"data\", None)}}. Example: `{EXAMPLE}`.")
    return {k: engine_spec(v) for k, v in value.items()}


def read_layouts(name: str, namespace: dict) -> dict:
    """The layouts dict called `name`, checked: label -> (mesh, in specs, out specs)."""
    from ...engines.shard import is_mesh

    if name not in namespace:
        raise UsageError(f"--compare {name}: no variable {name!r} in your namespace. Define a dict of layouts "
                         f"first, e.g. `{EXAMPLE}`.")
    value = namespace[name]
    if not isinstance(value, dict) or not value:
        empty = " (empty)" if isinstance(value, dict) else ""  # never `value == {}`: an array compares elementwise
        raise UsageError(f"--compare {name}: {name!r} is a {type(value).__name__}{empty}; "
                         f"expected a dict mapping each label to a layout, e.g. `{EXAMPLE}`.")
    layouts = {}
    for label, layout in value.items():
        if not isinstance(label, str):
            raise UsageError(f"--compare {name}: the label {label!r} is not a string; expected labels such as "
                             f"\"dp\" or \"fsdp\".")
        if not isinstance(layout, dict) or "mesh" not in layout or set(layout) - set(LAYOUT_KEYS):
            keys = sorted(layout, key=repr) if isinstance(layout, dict) else type(layout).__name__  # keys of any type
            raise UsageError(f"--compare {name}: layout {label!r} is {keys}; expected a dict with \"mesh\" (a Mesh), "
                             f"\"in\" (input name -> PartitionSpec) and optionally \"out\", e.g. `{EXAMPLE}`.")
        if not is_mesh(layout["mesh"]):
            raise UsageError(f"--compare {name}: layout {label!r} has \"mesh\" = {type(layout['mesh']).__name__}; "
                             f"expected a jax.sharding.Mesh (`%mesh data=8`, or jaxpar_magic.make_mesh(...)).")
        layouts[label] = (layout["mesh"], _specs(layout.get("in"), label, "in", name),
                          _specs(layout.get("out"), label, "out", name))
    return layouts


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def compare_cell(source: str, namespace: dict, layouts: dict, *, magic: str = "shard", hardware=None,
                 device_memory=None, topology: str | None = None, status: bool = False,
                 **engine_options) -> list[Row]:
    """Plan `source` once per layout (label -> (mesh, in specs, out specs)); rows best first: by
    estimated step time with a profile (else by memory per device), layouts that fail last. With
    `status` (the magic, whose view replaces it), one status line says which layout is planning."""
    from .hardware import parse_hardware
    from .topology import with_topology
    from .plan_cell import plan_cell
    from .topology import topology_for

    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    if topology is not None:
        hardware, topology = with_topology(hardware, topology), None
    if hardware is not None:  # a topology that does not fit a layout's mesh is the line's mistake: say so first
        for label, (mesh, _, _) in layouts.items():
            try:
                topology_for(hardware, {str(n): int(s) for n, s in mesh.shape.items()}, hardware.topology)
            except UsageError as err:
                raise UsageError(f"layout {label!r}: {err}") from None
    from ...views.progress import Progress

    rows = []
    line = Progress("planning layouts", enabled=None if status else False)  # one line for the whole comparison
    with line:
        for index, (label, (mesh, in_specs, out_specs)) in enumerate(layouts.items()):
            line.update(f"planning layout {index + 1}/{len(layouts)} ({label})")
            rows.append(_plan_row(plan_cell, label, source, namespace, magic, mesh, in_specs, out_specs, hardware,
                                  device_memory, topology, engine_options))
    return sorted(rows, key=_rank)


def _plan_row(plan_cell, label, source, namespace, magic, mesh, in_specs, out_specs, hardware, device_memory,
              topology, engine_options) -> Row:
    try:  # plan_cell shows no status line of its own: the comparison's says which layout is planning
        plan = plan_cell(source, namespace, magic=magic, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         hardware=hardware, device_memory=device_memory, topology=topology, bind=False,
                         **engine_options)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a layout that cannot be planned is a row, not the cell's failure
        return Row(label, error=_reason(exc))
    return Row(label, plan)


def _rank(row: Row) -> tuple:
    if row.plan is None:
        return (2, 0.0)
    r = row.plan.roofline
    return (0 if row.plan.fits is not False else 1, r.estimate_s if r is not None else row.plan.total_bytes)


def comparison_state(title: str, rows: list[Row], hardware) -> dict:
    """The plan view's state for a comparison (kind "compare")."""
    caveats = []
    for row in rows:
        if row.plan is not None:
            caveats = list(row.plan.caveats)
            break
    compilers = sorted({row.plan.target.describe() for row in rows if row.plan is not None and row.plan.target})
    return {"kind": "compare", "title": title, "hardware": hardware.state() if hardware is not None else None,
            "rows": [row.state() for row in rows], "caveats": caveats, "compilers": compilers}


# --- --search: the standard candidates ------------------------------------------------------------

def _factor_pairs(n: int) -> list[tuple[int, int]]:
    return [(d, n // d) for d in range(2, n) if n % d == 0]


def _sharded(shape, axes: list[str | None], sizes: dict) -> tuple:
    """A spec putting each mesh axis on the largest dimension it divides (not yet taken)."""
    spec: list = [None] * len(shape)
    for axis in axes:
        if axis is None:
            continue
        options = [i for i in sorted(range(len(shape)), key=lambda i: -shape[i])
                   if spec[i] is None and shape[i] % sizes[axis] == 0]
        if options:
            spec[options[0]] = axis
    return tuple(spec)


def search_layouts(namespace: dict, batch: tuple[str, ...], inputs: tuple[str, ...], devices: int) -> dict:
    """DP, FSDP, TP and FSDP x TP over the factorisations of `devices`: label -> layout dict.

    Batch inputs are split over 'data' on their first dimension; every other input (weights) is
    replicated (DP), split over 'data' (FSDP), over 'model' (TP) or over both (FSDP x TP), each mesh
    axis on the largest dimension it divides. A pytree input gets a pytree of specs."""
    import jax
    from jax.sharding import PartitionSpec as P

    from ...engines.shard import make_mesh

    missing = [n for n in batch if n not in namespace]
    if missing:
        raise UsageError(f"--search {' '.join(batch)}: {missing[0]!r} is not defined; name the batch inputs "
                         f"(e.g. `--search batch`), the ones whose first dimension is split over 'data'.")

    def specs(mesh, batch_axes, weight_axes):
        sizes = {str(n): int(s) for n, s in mesh.shape.items()}
        out = {}
        for name in inputs:
            axes = batch_axes if name in batch else weight_axes

            def spec(leaf, axes=axes, is_batch=name in batch):
                shape = tuple(getattr(leaf, "shape", ()))
                if not shape:
                    return P()
                if is_batch:
                    first = axes[0] if axes and axes[0] is not None and shape[0] % sizes[axes[0]] == 0 else None
                    return P(first, *[None] * (len(shape) - 1))
                return P(*_sharded(shape, list(axes), sizes))

            out[name] = jax.tree.map(spec, namespace[name])  # one spec per leaf of a pytree input
        return out

    layouts = {}
    # Auto axes: a proposal lays out the inputs only and lets the compiler place the rest, which the
    # user's unannotated step (no out_sharding=) needs; Explicit axes would refuse its sharded matmuls.
    flat = make_mesh(f"data={devices}", axis_types="auto")
    layouts["dp"] = {"mesh": flat, "in": specs(flat, ["data"], [])}
    layouts["fsdp"] = {"mesh": flat, "in": specs(flat, ["data"], ["data"])}
    model = make_mesh(f"model={devices}", axis_types="auto")
    layouts["tp"] = {"mesh": model, "in": specs(model, [None], ["model"])}
    for d, m in _factor_pairs(devices):
        mesh = make_mesh(f"data={d} model={m}", axis_types="auto")
        layouts[f"fsdp{d}xtp{m}"] = {"mesh": mesh, "in": specs(mesh, ["data"], ["data", "model"])}
    return layouts


def search_note(devices: int) -> str:
    pairs = len(_factor_pairs(devices))
    return (f"--search proposed DP, FSDP, TP and {pairs} FSDP x TP split{'s' if pairs != 1 else ''} of {devices} "
            f"devices: batch inputs split over 'data' on their first dimension, weights on their largest "
            f"divisible dimensions. It knows nothing of pipelining, sequence or expert parallelism, activation "
            f"checkpointing or optimizer state layout; treat the ranking as a first cut to plan further.")


def devices_of(mesh, namespace: dict) -> int:
    """Devices a --search spans: the line's mesh if it names one, else every device."""
    import jax

    from ...engines.shard import is_mesh

    if isinstance(mesh, str):
        mesh = namespace.get(mesh, mesh)
    elif mesh is None:
        mesh = namespace.get("mesh")
    if isinstance(mesh, jax.sharding.AbstractMesh):
        layout = ", ".join(f"{n}={s}" for n, s in mesh.shape.items())
        raise UsageError(
            f"--search: the mesh ({layout}) is an AbstractMesh, which has no devices to lay the candidate layouts "
            f"onto. Simulate the devices (`%devices --simulate {math.prod(mesh.axis_sizes)}` in a fresh kernel) and "
            f"give a Mesh (`%mesh {' '.join(f'{n}={s}' for n, s in mesh.shape.items())}`), or let --search use all "
            f"devices: drop --mesh.")
    if is_mesh(mesh):
        return int(math.prod(mesh.devices.shape))
    if hasattr(mesh, "sizes"):  # --mesh data=4,model=2 on the line
        return int(math.prod(mesh.sizes))
    return jax.device_count()
