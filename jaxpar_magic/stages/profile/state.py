"""A Profile as the profile view's state, and as words: small summaries only. Events are capped per
lane and step (the longest kept, the rest counted), lanes are capped, and each instruction's name is
sent once, so a trace of 10^5 events is still a light view.

Plain Python; no JAX.
"""
from __future__ import annotations

from .beside import ms

KINDS = ("compute", "collective", "copy", "wait")
MAX_LANES = 16
MAX_EVENTS = 2000  # in the whole state
MIN_PER_LANE_STEP = 8
TOP_OPS = 8
TOP_COLLECTIVES = 16


def headline(profile) -> str:
    runs = profile.steps
    wall = f"; {ms(profile.wall_s)} wall clock per call" if profile.wall_s else ""
    return f"measured step {ms(profile.step_s)} (median of {runs} run{'s' if runs != 1 else ''}{wall})"


def shares_text(shares: dict) -> str:
    """"compute 61 % · waiting 10 % · collectives 22 % (9 % more under compute) · copies 1 % · idle 6 %"."""
    def pct(key):
        return f"{shares.get(key, 0.0):.0%}"

    hidden = shares.get("overlapped", 0.0)
    under = f" (and {hidden:.0%} of the step overlapped compute)" if hidden >= 0.005 else ""
    return (f"compute {pct('compute')} · waiting {pct('wait')} · collectives {pct('collective')}{under} · "
            f"copies {pct('copy')} · idle {pct('idle')}")


def op_text(op) -> str:
    where = f", line {op.line}" if op.line is not None else (f", {op.origin[2]}:{op.origin[1]}" if op.origin else "")
    what = op.collective or op.what
    waiting = f", {ms(op.wait_s)} of it waiting" if op.wait_s >= 0.005 * max(op.total_s, 1e-12) and op.wait_s else ""
    count = f" x{op.count:g}" if abs(op.count - 1) > 1e-9 else ""
    return f"{op.name} ({what}{where}){count}: {ms(op.total_s)}{waiting}"


def summary_text(profile) -> str:
    lines = [f"{headline(profile)} · {profile.source}", shares_text(profile.shares)]
    if profile.ops:
        lines.append("top: " + " · ".join(op_text(op) for op in profile.ops[:3]))
    if profile.beside is not None:
        lines.append(f"plan ({profile.beside.hardware}): " + profile.beside.sentence())
        if not profile.beside.same_machine:
            lines.append(profile.beside.label)
    lines += profile.notes
    return "\n".join(lines)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 2)


def median_step(profile) -> int:
    times = profile.step_times_s
    if not times:
        return 0
    ordered = sorted(range(len(times)), key=lambda i: times[i])
    return ordered[(len(ordered) - 1) // 2]


def profile_state(profile, title: str) -> dict:
    names: dict = {}
    table: list = []

    def name_index(event) -> int:
        index = names.get(event.name)
        if index is None:
            index = names[event.name] = len(table)
            table.append([event.name, event.what, event.collective, event.line])
        return index

    shown, walls = profile.lanes[:MAX_LANES], profile.wall_times_s
    steps = max(1, profile.steps)
    per = max(MIN_PER_LANE_STEP, MAX_EVENTS // max(1, len(shown) * steps))
    lanes = []
    for lane in shown:
        by_step: dict = {}
        for e in lane.events:
            by_step.setdefault(e.step, []).append(e)
        events, dropped = [], []
        for step, group in sorted(by_step.items()):
            ordered = sorted(group, key=lambda e: -e.duration_s)
            kept, rest = ordered[:per], ordered[per:]
            if rest:  # the shortest, counted: how many and how long together
                dropped.append([step, len(rest), _us(sum(e.duration_s for e in rest))])
            for e in sorted(kept, key=lambda e: e.start_s):
                events.append([step, _us(e.start_s), _us(e.duration_s), KINDS.index(e.kind), name_index(e),
                               1 if e.in_flight else 0])
        lanes.append({"label": lane.label, "device": lane.device, "thread": lane.thread, "events": events,
                      "dropped": dropped})
    return {
        "title": title,
        "source": profile.source,
        "platform": profile.platform,
        "headline": headline(profile),
        "step_s": profile.step_s,
        "wall_s": profile.wall_s,
        "steps": [{"span_us": _us(span), "wall_us": _us(walls[i]) if i < len(walls) else None}
                  for i, span in enumerate(profile.step_times_s)],
        "median_step": median_step(profile),
        "kinds": list(KINDS),
        "names": table,
        "lanes": lanes,
        "lanes_total": len(profile.lanes),
        "shares": {k: round(v, 4) for k, v in profile.shares.items()},
        "shares_text": shares_text(profile.shares),
        "ops": [{"name": o.name, "kind": o.kind, "count": round(o.count, 3), "total_us": _us(o.total_s),
                 "wait_us": _us(o.wait_s), "line": o.line, "what": o.what, "collective": o.collective,
                 "text": op_text(o)} for o in profile.ops[:TOP_OPS]],
        "ops_total": len(profile.ops),
        "collectives": [{"name": c.name, "op": c.op, "line": c.line, "count": round(c.count, 3),
                         "time_us": _us(c.time_s), "wait_us": _us(c.wait_s), "overlapped_us": _us(c.overlapped_s)}
                        for c in profile.collectives[:TOP_COLLECTIVES]],
        "beside": profile.beside.state() if profile.beside is not None else None,
        "notes": list(profile.notes),
    }
