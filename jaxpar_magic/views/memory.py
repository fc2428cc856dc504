"""MemoryView: one device's live bytes over the compiled program's schedule (``js/memory.js``), the
peak marked, the device's memory drawn as a line, and the buffers that fill the peak listed beside it;
with static HTML (a table of the steps that raise memory most) and text (a sparkline and the same
steps in words) of the same state. The plan view embeds it (views/plan.py).

State: ``{"title", "compiler", "capacity", "peak": stages/plan/peak.MemoryPeak.state()}``.
"""
from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, esc, format_bytes, style_block

TEXT_WIDTH = 78  # text lines stay within 80 columns
SPARK = " ▁▂▃▄▅▆▇█"
KEY_STEPS = 6  # the steps that raise live memory most, listed in the static table and the text
MAX_BARS = 240  # the engines send at most 120 timeline points


def _fit(text: str) -> list[str]:
    """One line as lines within TEXT_WIDTH columns, wrapped at spaces under its own indent: a
    buffer's source line is what a reader acts on, so it is never cut."""
    from .textwidth import fit_line

    return fit_line(text, TEXT_WIDTH)


def shape_text(b: dict) -> str:
    if (b.get("count") or 1) > 1:
        return ""  # a group of buffers: sizes differ
    return f"{b.get('dtype')}[{','.join(str(d) for d in b.get('shape') or [])}]"


def where_text(b: dict) -> str:
    """`line 2: h = x @ w1`, or `line 4 of In[3], in layer(): h = x @ w` for a function's line."""
    o = b.get("origin")
    if o:
        inside = f", in {o['function']}()" if o.get("function") else ""
        return f"line {o.get('line')} of {o.get('cell')}{inside}" + (f": {o['source']}" if o.get("source") else "")
    if b.get("line") is None:
        return ""
    return f"line {b['line']}" + (f": {b['source']}" if b.get("source") else "")


def what_text(b: dict) -> str:
    """`argument params['w1']`, `output grads['w1']`, `temporary from dot_general (fusion.4)`,
    `all-gather of params['w1'] (all-gather.3)`, `5 buffers: activation saved for the backward pass, from
    tanh` (the twin of `whatText` in js/memory.js)."""
    space = f" in {b['space']}" if b.get("space") else ""
    count = b.get("count") or 1
    if b.get("kind") in ("argument", "output"):
        text = f"{b['kind']} {b.get('name')}" if b.get("name") else f"{b['kind']}s"
    else:
        op = b.get("op") or b.get("instruction")
        made = f"from {op}" + (f" ({b['instruction']})" if b.get("instruction") and b["instruction"] != op else "")
        text = f"{b['role']}, {made}" if b.get("role") else f"temporary {made}"
    return (f"{count} buffers: " if count > 1 else "") + text + space


def step_text(p: dict) -> str:
    """`fusion.4 (dot_general), line 2: h = x @ w1`."""
    op = p.get("op")
    name = p.get("instruction") or ""
    head = f"{name} ({op})" if op and op != name else name
    where = where_text(p)
    return head + (f", {where}" if where else "")


def place(peak: dict, point: dict) -> dict:
    """A timeline point's operation and line (the state lists each place once)."""
    places = peak.get("places") or []
    at = point.get("at")
    return places[at] if isinstance(at, int) and 0 <= at < len(places) else point


def key_steps(peak: dict, count: int = KEY_STEPS) -> list[dict]:
    """The timeline points where live memory rises most (the peak's step always among them), in order,
    each with its place's fields and its rise."""
    points = [{**place(peak, p), **p} for p in peak.get("timeline") or []]
    rises = []
    for i, p in enumerate(points):  # the arguments are live before the first step: not its rise
        before = points[i - 1]["bytes"] if i else int(peak.get("start_bytes") or 0)
        rises.append((p["bytes"] - before, i))
    chosen = {i for _, i in sorted(rises, reverse=True)[:count] if rises[i][0] > 0}
    at_peak = next((i for i, p in enumerate(points) if p.get("step") == peak.get("step")), None)
    if at_peak is not None:
        chosen.add(at_peak)
    return [dict(points[i], rise=rises[i][0]) for i in sorted(chosen)]


def start_sentence(peak: dict) -> str:
    """What is live before the first step: the arguments (the twin of `startSentence` in js/memory.js)."""
    return f"before step 0: {format_bytes(peak.get('start_bytes') or 0)} of arguments, live when the program starts"


def peak_sentence(state: dict) -> str:
    peak = state.get("peak") or {}
    at = peak.get("at") or {}
    where = step_text(at) if at else ""
    return (f"peak {format_bytes(peak.get('live'))} live at step {peak.get('step')} of {peak.get('steps')}"
            + (f": {where}" if where else ""))


def capacity_sentence(state: dict) -> str:
    cap = state.get("capacity")
    peak = state.get("peak") or {}
    reported = peak.get("reported") or 0
    if not cap:
        return "device memory unknown (give --hardware or --device-memory)"
    share = 100 * reported / cap
    if reported > cap:
        return f"device memory {format_bytes(cap)}: the peak of {format_bytes(reported)} does not fit"
    return f"device memory {format_bytes(cap)}: the peak of {format_bytes(reported)} is {share:.1f}% of it"


def _scale(state: dict) -> tuple[float, bool]:
    """The chart's top, and whether the device memory line is on it (not when it is far above)."""
    peak = state.get("peak") or {}
    top = max(1, peak.get("live") or 0, peak.get("reported") or 0)
    cap = state.get("capacity")
    on = bool(cap) and cap <= 2 * top
    return (max(top, cap) if on else top), on


def rows(peak: dict) -> list[tuple[int, str, str, str]]:
    """(bytes, what, shape, where) per row: the buffers, then 'other' and the compiler's reserve."""
    out = [(b["bytes"], what_text(b), shape_text(b), where_text(b)) for b in peak.get("buffers") or []]
    if peak.get("other_count"):
        out.append((peak["other_bytes"], f"other: {peak['other_count']} smaller buffer{'s' if peak['other_count'] != 1 else ''}", "", ""))
    out += [(part["bytes"], part["note"], "", "") for part in peak.get("reserve") or []]
    return out


def buffers_html(peak: dict) -> str:
    """The peak's buffers as a table whose sizes add up to the reported peak."""
    body = "".join(
        f'<tr><td class="jpm-num">{esc(format_bytes(n))}</td><td>{esc(what)}</td><td class="jpm-mono">{esc(shape)}</td>'
        f'<td class="jpm-mono jpm-srccell" title="{esc(where)}">{esc(where or "—")}</td></tr>'
        for n, what, shape, where in rows(peak))
    total = (f'<tr><td class="jpm-num"><b>{esc(format_bytes(peak.get("reported")))}</b></td>'
             f'<td colspan="3">the peak per device</td></tr>')
    said = (f'<div class="jpm-note jpm-disagreement">{esc(peak["disagreement"])}</div>'
            if peak.get("disagreement") else "")
    return ('<div class="jpm-scroll"><table class="jpm-table jpm-plan-table jpm-peak-table"><thead><tr><th>size</th>'
            '<th>what</th><th>array</th><th>source</th></tr></thead><tbody>' + body + total + "</tbody></table></div>"
            + said)


CHART_PX = 96  # the chart's height: the static form sizes its bars in pixels (a table cell has no % height)


def timeline_html(state: dict) -> str:
    """The timeline as a sanitizer keeps it (views/inline.py): one table row of bottom-aligned cells,
    each bar a block of its height in pixels, the device memory an absolute dashed line, the axis a
    table of three cells; the live view (js/memory.js) draws the same bars with flex."""
    peak = state.get("peak") or {}
    points = (peak.get("timeline") or [])[:MAX_BARS]
    top, cap_on = _scale(state)
    cells = []  # no title per bar: static pages list the steps in a table instead
    for p in points:
        cls = "jpm-tl-bar jpm-tl-peak" if p.get("step") == peak.get("step") else "jpm-tl-bar"
        px = max(1, round(CHART_PX * (p.get("bytes") or 0) / top)) if p.get("bytes") else 0
        cells.append(f'<td class="jpm-tl-cell"><span class="{cls}" style="height:{px}px"></span></td>')
    cap = ""
    if cap_on:
        cap = (f'<span class="jpm-tl-cap" style="bottom:{round(CHART_PX * state["capacity"] / top)}px" '
               f'title="{esc(capacity_sentence(state))}"></span>')
    steps = "".join(
        f'<tr><td class="jpm-num">{p.get("step")}</td><td class="jpm-num">{esc(format_bytes(p.get("bytes")))}</td>'
        f'<td class="jpm-num">+{esc(format_bytes(p.get("rise")))}</td><td class="jpm-mono jpm-srccell" '
        f'title="{esc(step_text(p))}">{esc(step_text(p))}</td></tr>' for p in key_steps(peak))
    return (
        f'<div class="jpm-timeline" role="img" aria-label="{esc(peak_sentence(state))}">'
        f'<table class="jpm-tl-table"><tr>{"".join(cells)}</tr></table>{cap}</div>'
        f'<table class="jpm-tl-axis"><tr><td class="jpm-tl-left">step 0</td><td class="jpm-tl-mid">the schedule</td>'
        f'<td class="jpm-tl-right">step {peak.get("steps", 1) - 1}</td></tr></table>'
        f'<div class="jpm-note">{esc(peak_sentence(state))}; {esc(capacity_sentence(state))}</div>'
        f'<div class="jpm-note">{esc(start_sentence(peak))}</div>'
        '<details class="jpm-tl-steps"><summary class="jpm-note">the steps that raise memory most</summary>'
        '<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr><th>step</th><th>live</th>'
        f'<th>rise</th><th>operation and line</th></tr></thead><tbody>{steps}</tbody></table></div></details>'
    )


def section_html(state: dict) -> str:
    """The memory section a plan view embeds: the timeline, then the peak's buffers."""
    compiler = state.get("compiler") or "the compiler"
    return (f'<div class="jpm-section jpm-memory"><div class="jpm-h">Live memory per device, over {esc(compiler)}\'s '
            f'schedule</div>{timeline_html(state)}<div class="jpm-h jpm-sub-h">What fills memory at the peak</div>'
            f'{buffers_html(state.get("peak") or {})}</div>')


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a memory state (no script; every string escaped)."""
    title = state.get("title") or "memory"
    return (style_block() + f'<div class="jpm-view jpm-plan"><div class="jpm-head"><span class="jpm-title jpm-mono">'
            f'{esc(str(title))}</span><span class="jpm-badge">planned, not run</span></div>{section_html(state)}</div>')


def sparkline(points: list[dict], width: int = 60) -> str:
    if not points:
        return ""
    top = max(p["bytes"] for p in points) or 1
    stretch = max(1, -(-len(points) // width))
    cells = []
    for i in range(0, len(points), stretch):
        value = max(p["bytes"] for p in points[i:i + stretch])
        cells.append(SPARK[round((len(SPARK) - 1) * value / top)])
    return "".join(cells)


def section_text(state: dict) -> list[str]:
    peak = state.get("peak") or {}
    compiler = state.get("compiler") or "the compiler"
    lines = (_fit(f"Live memory per device over {compiler}'s schedule ({peak.get('steps')} steps):")
             + ["  " + sparkline(peak.get("timeline") or [])]
             + _fit("  " + peak_sentence(state)) + _fit("  " + capacity_sentence(state))
             + _fit("  " + start_sentence(peak)) + ["  steps that raise memory most:"])
    for p in key_steps(peak):
        lines += _fit(f"    step {p['step']}: +{format_bytes(p['rise'])} to {format_bytes(p['bytes'])}, {step_text(p)}")
    lines += _fit(f"What fills memory at the peak ({format_bytes(peak.get('reported'))} per device):")
    for n, what, shape, where in rows(peak):
        words = ", ".join(w for w in (what + (f" {shape}" if shape else ""), where) if w)
        lines += _fit(f"  {format_bytes(n):>10}  {words}")
    if peak.get("disagreement"):
        lines += _fit("  " + peak["disagreement"])
    return lines


def to_text(state: dict[str, Any]) -> str:
    return "\n".join([str(state.get("title") or "memory")] + section_text(state))


class MemoryView(ViewBase):
    """A plan's memory over the schedule: ``MemoryView(state={...})``."""

    _esm = bundle_esm("memory.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
