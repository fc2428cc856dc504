"""ProfileView: a measured step (`--profile`), one lane per device (or XLA:CPU thread), a bar per op
coloured by what it did (compute; each collective in its own colour; copies; waits drawn as waits),
a step selector, the share of the step in compute, collectives, copies and waiting, the top ops with
their lines, and the plan's estimate beside the measurement (``js/profile.js``). The static HTML
and the text show the median step.

State (stages/profile/state.py): ``{"title", "source", "headline", "steps": [{"span_us", "wall_us"}],
"median_step", "kinds", "names": [[name, what, collective, line]], "lanes": [{"label", "events":
[[step, start_us, duration_us, kind, name, in_flight]], "dropped": [[step, count, us]]}], "lanes_total",
"shares", "shares_text", "ops": [...], "ops_total", "collectives": [...], "beside", "notes"}``.
"""
from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, esc, format_seconds

TEXT_WIDTH = 78
MERGE = 0.004  # of the step: same-coloured events this close are one bar in the static picture
TRACK = 56  # characters of a lane in the text form
LABEL = 14
# One character per kind in the text form: collectives and compute solid, a wait dotted, idle blank.
GLYPHS = {"compute": "#", "collective": "=", "copy": "c", "wait": "."}
COLLECTIVE_CLASSES = {"all-reduce": "ar", "all-gather": "ag", "reduce-scatter": "rs", "all-to-all": "aa",
                      "ragged-all-to-all": "aa", "collective-permute": "cp"}
SHARES = (("compute", "compute"), ("collective", "collectives"), ("wait", "waiting"), ("copy", "copies"),
          ("idle", "idle"))


def _fit(text: str) -> list[str]:
    from .textwidth import fit_line

    return fit_line(text, TEXT_WIDTH)


def us(value: float | None) -> str:
    return "—" if value is None else format_seconds(value * 1e-6)


def bar_class(kind: str, collective: str | None) -> str:
    """`jpm-pf-compute`, `jpm-pf-wait`, `jpm-pf-copy`, or a collective's own: `jpm-pf-ar` (all-reduce)."""
    if kind == "collective":
        return f"jpm-pf-{COLLECTIVE_CLASSES.get(collective or '', 'cx')}"
    return f"jpm-pf-{kind}"


def step_events(state: dict, lane: dict, step: int) -> list[dict]:
    """A lane's events of one step, as dicts with their instruction's facts."""
    kinds, names = state.get("kinds") or [], state.get("names") or []
    out = []
    for s, start, duration, kind, name, flight in lane.get("events") or []:
        if s != step:
            continue
        fact = names[name] if 0 <= name < len(names) else ["?", "", None, None]
        out.append({"start": start, "duration": duration, "kind": kinds[kind] if 0 <= kind < len(kinds) else "?",
                    "name": fact[0], "what": fact[1], "collective": fact[2], "line": fact[3], "in_flight": bool(flight)})
    return out


def event_text(e: dict) -> str:
    """`psum.7 (all-reduce, line 3): 1.20 ms at 0.41 ms, waiting` — the twin of `eventText` in js/profile.js."""
    what = e.get("collective") or e.get("what") or ""
    where = f", line {e['line']}" if e.get("line") is not None else ""
    doing = {"wait": ", waiting", "copy": ", copy"}.get(e.get("kind"), "")
    if e.get("in_flight"):
        doing = ", in flight"
    return f"{e['name']} ({what}{where}): {us(e['duration'])} at {us(e['start'])}{doing}"


def span_of(state: dict, step: int) -> float:
    steps = state.get("steps") or []
    return max(1e-9, (steps[step].get("span_us") or 0) if 0 <= step < len(steps) else 0)


def _step_title(state: dict, step: int) -> str:
    total = len(state.get("steps") or [])
    return f"step {step + 1} of {total} (the median), {us(span_of(state, step))}"


def static_bars(state: dict, lane: dict, step: int) -> list[tuple[str, float, float, str]]:
    """A lane's bars in the static picture, (class, left %, width %, title): the events of one step,
    each run of same-coloured events that touch (closer than MERGE of the step) drawn as one bar, so a
    loop's hundred small ops cost one bar, not a hundred (the live view draws every event)."""
    span = span_of(state, step)
    runs: list[list] = []  # [class, start, end, events]
    for e in sorted(step_events(state, lane, step), key=lambda e: e["start"]):
        cls = bar_class(e["kind"], e["collective"]) + (" jpm-pf-flight" if e["in_flight"] else "")
        end = e["start"] + e["duration"]
        if runs and runs[-1][0] == cls and e["start"] - runs[-1][2] <= MERGE * span:
            runs[-1][2] = max(runs[-1][2], end)
            runs[-1][3].append(e)
        else:
            runs.append([cls, e["start"], end, [e]])
    bars = []
    for cls, start, end, events in runs:
        left = max(0.0, min(100.0, 100 * start / span))
        width = max(0.2, min(100.0 - left, 100 * (end - start) / span))
        if len(events) == 1:
            title = event_text(events[0])
        else:
            names = ", ".join(dict.fromkeys(e["name"] for e in events[:3]))
            title = f"{len(events)} ops ({names}…): {us(end - start)} from {us(start)}"
        bars.append((cls, left, width, title))
    return bars


def lanes_html(state: dict, step: int) -> str:
    span = span_of(state, step)
    rows = []
    for lane in state.get("lanes") or []:
        bars = [f'<span class="jpm-pf-bar {cls}" style="left:{left:.1f}%;width:{width:.1f}%" title="{esc(title)}">'
                f'</span>' for cls, left, width, title in static_bars(state, lane, step)]
        dropped = [d for d in lane.get("dropped") or [] if d[0] == step]
        more = f" (+{dropped[0][1]} shorter ops, {us(dropped[0][2])})" if dropped else ""
        rows.append(f'<tr><td class="jpm-pf-label jpm-mono" title="{esc(lane["label"] + more)}">{esc(lane["label"])}'
                    f'</td><td class="jpm-pf-cell"><div class="jpm-pf-track">{"".join(bars)}</div></td></tr>')
    hidden = (state.get("lanes_total") or 0) - len(state.get("lanes") or [])
    extra = f'<div class="jpm-note">and {hidden} more lanes, not drawn</div>' if hidden > 0 else ""
    return (f'<table class="jpm-pf-lanes">{"".join(rows)}</table>'
            f'<table class="jpm-tl-axis"><tr><td class="jpm-tl-left">0</td><td class="jpm-tl-mid">{esc(_step_title(state, step))}'
            f'</td><td class="jpm-tl-right">{esc(us(span))}</td></tr></table>{extra}')


def legend_html() -> str:
    keys = [("jpm-pf-compute", "compute"), ("jpm-pf-ar", "all-reduce"), ("jpm-pf-ag", "all-gather"),
            ("jpm-pf-rs", "reduce-scatter"), ("jpm-pf-aa", "all-to-all"), ("jpm-pf-cp", "permute"),
            ("jpm-pf-copy", "copy"), ("jpm-pf-wait", "waiting")]
    return '<div class="jpm-note">' + " ".join(
        f'<span class="jpm-pf-key {cls}"></span> {esc(text)}' for cls, text in keys) + "</div>"


def shares_html(state: dict) -> str:
    shares = state.get("shares") or {}
    parts = "".join(f'<span class="jpm-pf-share jpm-pf-{"idle" if key == "idle" else key}" '
                    f'style="width:{100 * max(0.0, shares.get(key, 0.0)):.2f}%" title="{esc(text)} '
                    f'{shares.get(key, 0.0):.0%}"></span>' for key, text in SHARES)
    return (f'<div class="jpm-pf-shares">{parts}</div><div class="jpm-note">{esc(state.get("shares_text") or "")}</div>')


def ops_html(state: dict) -> str:
    body = "".join(
        f'<tr><td class="jpm-num">{esc(us(o["total_us"]))}</td><td class="jpm-mono">{esc(o["name"])}</td>'
        f'<td>{esc(o.get("collective") or o.get("what") or "")}</td><td class="jpm-num">{esc(str(o["line"]) if o.get("line") is not None else "—")}</td>'
        f'<td class="jpm-num">{o["count"]:g}</td><td class="jpm-num">{esc(us(o["wait_us"]) if o.get("wait_us") else "")}</td></tr>'
        for o in state.get("ops") or [])
    return ('<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr><th>time per step</th>'
            '<th>op</th><th>what</th><th>line</th><th>runs</th><th>waiting</th></tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def beside_html(beside: dict | None) -> str:
    if not beside:
        return ""
    rows = "".join(
        f'<tr><td>{esc(c["op"])}</td><td class="jpm-num">{esc(str(c["line"]) if c.get("line") is not None else "—")}</td>'
        f'<td class="jpm-num">{esc(format_seconds(c["estimated_s"]) if c.get("estimated_s") is not None else "—")}</td>'
        f'<td class="jpm-num">{esc(format_seconds(c["measured_s"]) if c.get("measured_s") is not None else "—")}</td>'
        f'<td class="jpm-num">{esc(overlap_text(c.get("overlapped")))}</td></tr>' for c in beside.get("collectives") or [])
    table = ('<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr><th>collective</th><th>line</th>'
             f'<th>estimated</th><th>measured</th><th>overlapped</th></tr></thead><tbody>{rows}</tbody></table></div>'
             if rows else "")
    return (f'<div class="jpm-section"><div class="jpm-h">Beside the plan ({esc(beside["hardware"])})</div>'
            f'<div>{esc(beside["sentence"])}</div>{table}<div class="jpm-note">{esc(beside["label"])}</div></div>')


def overlap_text(share: float | None) -> str:
    return "—" if share is None else f"{share:.0%}"


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a profile state: the median step (no script; every string escaped)."""
    step = int(state.get("median_step") or 0)
    notes = "".join(f'<div class="jpm-note">{esc(n)}</div>' for n in state.get("notes") or [])
    return (
        f'<div class="jpm-view jpm-profile"><div class="jpm-head"><span class="jpm-title jpm-mono">'
        f'{esc(str(state.get("title") or "profile"))}</span><span class="jpm-badge">measured</span></div>'
        f'<div>{esc(state.get("headline") or "")}</div><div class="jpm-note">{esc(state.get("source") or "")}</div>'
        f'<div class="jpm-section"><div class="jpm-h">Where the step went</div>{shares_html(state)}</div>'
        f'<div class="jpm-section"><div class="jpm-h">Timeline, one lane per '
        f'{"device" if any(l.get("device") is not None for l in state.get("lanes") or []) else "thread"}</div>'
        f'{lanes_html(state, step)}{legend_html()}</div>'
        f'<div class="jpm-section"><div class="jpm-h">Top ops, per step and lane</div>{ops_html(state)}</div>'
        f'{beside_html(state.get("beside"))}{notes}</div>')


def lane_text(state: dict, lane: dict, step: int) -> str:
    """A lane as TRACK characters, each the kind that fills most of its time (idle: blank)."""
    span = span_of(state, step)
    cells = [dict() for _ in range(TRACK)]
    for e in step_events(state, lane, step):
        if e["in_flight"]:
            continue
        begin, end = e["start"] / span * TRACK, (e["start"] + e["duration"]) / span * TRACK
        for k in range(max(0, int(begin)), min(TRACK, int(end) + 1)):
            cover = min(end, k + 1) - max(begin, k)
            if cover > 0:
                cells[k][e["kind"]] = cells[k].get(e["kind"], 0.0) + cover
    return "".join(_glyph(c) for c in cells)


def _glyph(cover: dict) -> str:
    """The kind a text cell shows: the first, in the shares' order (compute, wait, collective, copy),
    that fills half of it, else the one that fills most; blank when nothing ran."""
    if not cover:
        return " "
    chosen = next((k for k in ("compute", "wait", "collective", "copy") if cover.get(k, 0.0) >= 0.5), None)
    return GLYPHS.get(chosen or max(cover, key=cover.get), "?")


def to_text(state: dict[str, Any]) -> str:
    step = int(state.get("median_step") or 0)
    lines = _fit(str(state.get("title") or "profile")) + _fit(state.get("headline") or "")
    lines += _fit(state.get("source") or "") + _fit(state.get("shares_text") or "")
    lines += _fit(f"Timeline of {_step_title(state, step)}: # compute, = collective, c copy, . waiting")
    for lane in state.get("lanes") or []:
        lines.append(f"{lane['label'][:LABEL]:<{LABEL}}|{lane_text(state, lane, step)}|")
    hidden = (state.get("lanes_total") or 0) - len(state.get("lanes") or [])
    if hidden > 0:
        lines.append(f"and {hidden} more lanes")
    lines += _fit("Top ops, per step and lane:")
    for o in state.get("ops") or []:
        lines += _fit(f"  {o['text']}")
    beside = state.get("beside")
    if beside:
        lines += _fit(f"Beside the plan ({beside['hardware']}): {beside['sentence']}") + _fit("  " + beside["label"])
    for note in state.get("notes") or []:
        lines += _fit(note)
    return "\n".join(lines)


class ProfileView(ViewBase):
    """A measured profile: ``ProfileView(state=profile.state(title))``."""

    _esm = bundle_esm("profile.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
