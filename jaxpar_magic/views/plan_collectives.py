"""The plan view's collectives: each one the compiler inserted (its groups, calls, time, whether the
compiled schedule overlaps it, and why it is there), a summary by op and axis when there are more than a
screenful, what XLA's partitioner said, a pipeline's bubble, and the inputs the cell hands back in
another layout. Static HTML and text of the plan state's entries (the twins of js/plan_collectives.js)."""

from __future__ import annotations

from typing import Any

from .base import esc, format_bytes, format_seconds, op_words
from .memory import TEXT_WIDTH
from .textwidth import fit_line

MAX_COLLECTIVES = 256
#: Collectives the text rendering lists (a terminal screenful); more get a summary by op and axis first.
TEXT_COLLECTIVES = 24
SLICED = ("XLA:CPU makes an all-reduce that each device then slices; XLA:TPU and XLA:GPU can make it this "
          "reduce-scatter, which the plan shows and costs")


def where(c: dict[str, Any]) -> str:
    """`line 2 of In[3], in layer(): h = x @ w (called from line 1)`, or the cell's own line (the
    twin of `where` in js/plan_collectives.js)."""
    line = f"line {c['line']}" if c.get("line") is not None else ""
    here = ": ".join(p for p in (line, str(c.get("source") or "")) if p)
    o = c.get("origin")
    if not o:
        return here
    inside = f", in {o['function']}()" if o.get("function") else ""
    text = f"line {o.get('line')} of {o.get('cell')}{inside}" + (f": {o['source']}" if o.get("source") else "")
    return text + (f" (called from {line})" if line else "")


def sliced_note(c: dict[str, Any]) -> str:
    return SLICED if c.get("sliced_from") else ""


def overlap_words(c: dict[str, Any]) -> str:
    """What the compiled schedule does with it: `overlapped` (async), `exposed` (synchronous), or "" (the
    twin of `overlapWords` in js/plan_collectives.js)."""
    return {True: "overlapped", False: "exposed"}.get(c.get("overlapped"), "")


def time_words(c: dict[str, Any]) -> str:
    """`40.0 µs (latency-bound, exposed)`."""
    said = [w for w in (f"{c['bound']}-bound" if c.get("bound") else "", overlap_words(c)) if w]
    return format_seconds(c.get("seconds")) + (f" ({', '.join(said)})" if said else "")


def why_text(c: dict[str, Any]) -> str:
    why = c.get("why") or {}
    return str(why.get("text") or "")


def _collectives(state: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    colls = list(state.get("collectives") or [])
    return colls[:MAX_COLLECTIVES], int(state.get("collectives_omitted") or 0) + max(0, len(colls) - MAX_COLLECTIVES)


def summary_line(s: dict[str, Any]) -> str:
    """`collective-permute over 'data': 493 instructions, 3,944 calls, 2.0 GiB moved, 4.10 ms (1.20 ms
    exposed)` (the twin of `summaryLine` in js/plan_collectives.js)."""
    axes = " x ".join(repr(a) for a in s.get("axes") or []) or "no axis"
    count = int(s.get("instructions") or 0)
    calls = s.get("calls")
    called = f", {calls:,} calls" if calls is not None and calls != count else ""
    timed = ""
    if s.get("seconds") is not None:
        exposed = f" ({format_seconds(s['exposed_s'])} exposed)" if s.get("exposed_s") else ""
        timed = f", {format_seconds(s['seconds'])}{exposed}"
    return (f"{s.get('op')} over {axes}: {count:,} instruction{'s' if count != 1 else ''}{called}, "
            f"{format_bytes(s.get('bytes'))} moved per device{timed}")


def pipeline_text(p: dict[str, Any]) -> str:
    """`pipeline bubble: 3 of 11 ticks (27%) ...` (the twin of `pipelineText` in js/plan_collectives.js)."""
    at = f" (the loop at line {p['line']})" if p.get("line") is not None else ""
    both = ", forward and backward passes" if p.get("passes") == 2 else ""
    return (f"pipeline bubble: {p['bubble']} of {p['ticks']} ticks ({100 * p['fraction']:.0f}%) — {p['stages']} stages "
            f"over {p['axis']!r} pass {p['microbatches']} microbatches{both}{at}; each stage idles {p['bubble']} "
            f"ticks a step. More microbatches make it smaller.")


def layout_change_text(change: dict[str, Any]) -> str:
    return (f"{change.get('name')} comes in as {change.get('before')} and leaves as {change.get('after')}: "
            f"the next step starts with a reshard")


def partitioner_text(row: dict[str, Any]) -> str:
    at = f" (line {row['line']}: {row['source']})" if row.get("line") is not None and row.get("source") else (
        f" (line {row['line']})" if row.get("line") is not None else "")
    return str(row.get("text")) + at


def collectives_html(state: dict[str, Any]) -> str:
    colls, omitted = _collectives(state)
    out = [f'<div class="jpm-section"><div class="jpm-h">Collectives the compiler inserted ({len(colls) + omitted})</div>']
    summary = state.get("collective_summary") or []
    if summary:
        out.append('<div class="jpm-note">by op and axis:</div><ul class="jpm-summary">'
                   + "".join(f'<li class="jpm-mono">{esc(summary_line(s))}</li>' for s in summary) + "</ul>")
    if not colls:
        out.append('<div class="jpm-note">none: the compiled program moves no data between devices</div>')
    else:
        timed = any(c.get("seconds") is not None for c in colls)
        head = ["op", "shape", "bytes / device", "groups", "source"] + (["time"] if timed else [])
        out.append('<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr>'
                   + "".join(f"<th>{esc(t)}</th>" for t in head) + "</tr></thead><tbody>")
        for c in colls:
            groups = c.get("groups_text") or ", ".join(str(a) for a in c.get("axes") or [])
            op = op_words(c) + (" *" if c.get("sliced_from") else "")
            out.append(
                f'<tr><td class="jpm-op" title="{esc(sliced_note(c))}">{esc(op)}</td><td class="jpm-mono">{esc(str(c.get("shape")))}</td>'
                f'<td class="jpm-num">{esc(format_bytes(c.get("bytes")))}</td><td>{esc(str(groups))}</td>'
                f'<td class="jpm-mono jpm-srccell" title="{esc(where(c))}">{esc(where(c) or "—")}</td>'
                + (f'<td class="jpm-num" title="{esc(time_words(c))}">{esc(time_words(c))}</td>' if timed else "")
                + "</tr>")
            if why_text(c):
                out.append(f'<tr class="jpm-why"><td></td><td colspan="{len(head) - 1}">why: {esc(why_text(c))}</td></tr>')
        out.append("</tbody></table></div>")
    if any(c.get("sliced_from") for c in colls):
        out.append(f'<div class="jpm-note">* {esc(SLICED)}</div>')
    if omitted:
        out.append(f'<div class="jpm-note">… {omitted} more collectives not listed</div>')
    out += [f'<div class="jpm-note jpm-partitioner">{esc(partitioner_text(r))}</div>' for r in state.get("partitioner") or []]
    if state.get("pipeline"):
        out.append(f'<div class="jpm-note jpm-pipeline">{esc(pipeline_text(state["pipeline"]))}</div>')
    out.append("</div>")
    changes = state.get("layout_changes") or []
    if changes:
        out.append('<div class="jpm-section"><div class="jpm-h">Layouts the cell changes</div>'
                   + "".join(f'<div class="jpm-note jpm-mono">{esc(layout_change_text(ch))}</div>' for ch in changes)
                   + "</div>")
    return "".join(out)


def collectives_text(state: dict[str, Any]) -> list[str]:
    colls, omitted = _collectives(state)
    lines = [f"Collectives the compiler inserted ({len(colls) + omitted})" + (": none" if not colls else ":")]
    summary = state.get("collective_summary") or []
    if summary:
        lines.append("  by op and axis:")
        lines += [piece for s in summary for piece in fit_line(f"    {summary_line(s)}", TEXT_WIDTH)]
    for c in colls[:TEXT_COLLECTIVES]:
        groups = c.get("groups_text") or ", ".join(str(a) for a in c.get("axes") or [])
        op = op_words(c) + (" (XLA:CPU: all-reduce + slice)" if c.get("sliced_from") else "")
        parts = [op, str(c.get("shape")), f"{format_bytes(c.get('bytes'))}/device", str(groups)]
        if c.get("seconds") is not None:
            parts.append(time_words(c))
        lines += fit_line("  " + " · ".join(parts), TEXT_WIDTH)  # wrapped, never cut: read at 80 columns
        if where(c):
            lines += fit_line(f"    at {where(c)}", TEXT_WIDTH)
        if why_text(c):
            lines += fit_line(f"    why: {why_text(c)}", TEXT_WIDTH)
    if len(colls) + omitted > TEXT_COLLECTIVES:
        lines.append(f"  … {len(colls) + omitted - min(len(colls), TEXT_COLLECTIVES)} more")
    for row in state.get("partitioner") or []:
        lines += fit_line(f"  {partitioner_text(row)}", TEXT_WIDTH)
    if state.get("pipeline"):
        lines += fit_line(f"  {pipeline_text(state['pipeline'])}", TEXT_WIDTH)
    changes = state.get("layout_changes") or []
    if changes:
        lines.append("Layouts the cell changes:")
        lines += [piece for ch in changes for piece in fit_line(f"  {layout_change_text(ch)}", TEXT_WIDTH)]
    return lines
