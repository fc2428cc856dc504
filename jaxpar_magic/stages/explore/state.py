"""The explorer view's state (the JSON dict js/explorer.js draws; its keys are fixed with the view in
EXPLORER_CONTRACT.md): the controls, the current plan's figures, the difference from the previous
layout, and the tried layouts ranked. Built from the Plans, never from arrays."""
from __future__ import annotations

from ...views.base import format_bytes, format_seconds
from .controls import groups, mesh_shapes, topology_options, types_text

LARGEST = 5  # buffers at the peak the view lists
COLLECTIVES = 32  # collectives the view lists (the plan keeps them all)
BOUNDS = {"compute": "compute", "memory": "HBM", "ici": "ICI", "dcn": "DCN", "latency": "latency"}


def explorer_state(ex) -> dict:
    from ..plan.hardware import PROFILES

    layout = ex.current.layout
    specs = list(layout.specs)
    inputs = []
    for members in groups(ex.leaves, specs):
        first = ex.leaves[members[0]]
        inputs.append({"name": first.label, "group": first.input, "shape": list(first.shape), "dtype": first.dtype,
                       "spec": [list(axes) for axes in specs[members[0]]],
                       "paths": [ex.leaves[i].label for i in members], "count": len(members)})
    devices = ex.devices
    target = None
    if layout.hardware is not None:
        hardware = ex._profiles.get(layout.hardware)
        target = {"hardware": layout.hardware, "topology": layout.topology,
                  "options": {"hardware": sorted(PROFILES), "topology": topology_options(hardware, devices)}}
    return {
        "inputs": inputs,
        "mesh": {"axes": [[n, s] for n, s in zip(layout.shape.names, layout.shape.sizes)],
                 "types": [t.capitalize() for t in layout.types],
                 "shapes": mesh_shapes(layout.shape.names, devices), "devices": devices},
        "target": target,
        "status": ex._worker.status(),
        "message": ex.message,
        "plan": plan_summary(ex.current.plan),
        "diff": diff_text(ex.previous.plan, ex.current.plan) if ex.previous is not None else None,
        "tried": [{"rank": rank, "line": row.line, "peak_bytes": row.peak_bytes, "fits": row.fits,
                   "collective_bytes": row.collective_bytes, "estimate_s": row.estimate_s,
                   "bound": _bound(row.plan), "current": row is ex.current,
                   "mesh": f"{row.layout.shape} {types_text(row.layout.types)}"}
                  for rank, row in enumerate(ex.tried, 1)],
        "line": ex.current.line,
        "generation": ex.generation,
        "compiles": ex.compiles,
    }


def _bound(plan) -> str | None:
    r = plan.roofline
    return BOUNDS.get(r.bound, r.bound) if r is not None else None


def _where(line, source) -> str | None:
    if line is None:
        return None
    return f"line {line}: {source}" if source else f"line {line}"


def plan_summary(plan) -> dict:
    from ..plan.plan_program import largest_words

    buffers = plan.peak.buffers[:LARGEST] if plan.peak is not None else []
    moving = [c for c in plan.collectives if c.group_size > 1]
    r = plan.roofline
    return {
        "peak_bytes": int(plan.total_bytes), "capacity_bytes": plan.capacity, "fits": plan.fits,
        "largest": [{"what": largest_words(b), "bytes": int(b.bytes), "line": _where(b.line, b.source)}
                    for b in buffers],
        "collectives": [{"kind": c.op, "bytes": int(c.bytes * (c.count or 1)), "calls": c.count,
                         "what": f"{c.shape} over {', '.join(c.axes) or c.groups_text}"
                                 + (f" at {_where(c.line, c.source)}" if c.line is not None else "")}
                        for c in moving[:COLLECTIVES]],
        "collectives_omitted": max(0, len(moving) - COLLECTIVES),
        "estimate_s": r.estimate_s if r is not None else None,
        "bound": _bound(plan),
        "compiler": plan.compiler,
        "summary": summary(plan),
    }


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def summary(plan) -> str:
    """The plan in one line, its figures in the units the rest of the view gives them (views/base.py's
    formatters, the twins of the page's): `planned by XLA:CPU: 5.3 MiB per device (fits in 16.0 GiB) ·
    largest buffer 4.0 MiB · 1 collective · estimate 571 µs, bound by memory`."""
    if plan.refused:
        return plan.summary()
    fit = "" if plan.capacity is None else (f" (fits in {format_bytes(plan.capacity)})" if plan.fits else
                                            f" (DOES NOT FIT in {format_bytes(plan.capacity)})")
    largest = plan.peak.largest if plan.peak is not None else None
    big = f" · largest buffer {format_bytes(largest.bytes)}" if largest is not None else ""
    r = plan.roofline
    estimate = f" · estimate {format_seconds(r.estimate_s)}, bound by {r.bound_text}" if r is not None else ""
    moving = sum(1 for c in plan.collectives if c.group_size > 1)
    return (f"planned by {plan.compiler}: {format_bytes(plan.total_bytes)} per device{fit}{big} · "
            f"{plural(moving, 'collective')}{estimate}")


def _counts(plan) -> dict:
    found: dict = {}
    for c in plan.collectives:
        if c.group_size > 1:
            found[c.op] = found.get(c.op, 0) + 1
    return found


def diff_text(before, after) -> str:
    """`peak −3.2 GiB, +2 all-gathers, estimate +0.4 ms`: what changed from the previous layout's plan."""
    parts = []
    change = int(after.total_bytes) - int(before.total_bytes)
    parts.append("peak unchanged" if change == 0 else
                 f"peak {'+' if change > 0 else '−'}{format_bytes(abs(change))}")
    old, new = _counts(before), _counts(after)
    for op in sorted(set(old) | set(new)):
        more = new.get(op, 0) - old.get(op, 0)
        if more:
            parts.append(f"{'+' if more > 0 else '−'}{plural(abs(more), op)}")
    a, b = before.roofline, after.roofline
    if a is not None and b is not None:
        delta = b.estimate_s - a.estimate_s
        parts.append("estimate unchanged" if delta == 0 else
                     f"estimate {'+' if delta > 0 else '−'}{format_seconds(abs(delta))}")
    return ", ".join(parts)
