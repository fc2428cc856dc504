"""The comparison of several planned layouts (`--compare`), as static HTML and text, and the caveats
block every plan view ends with. views/plan.py draws a single plan and hands a comparison's state here."""

from __future__ import annotations

from typing import Any

from .base import esc, format_bytes, format_seconds, style_block
from .memory import TEXT_WIDTH, what_text
from .textwidth import fit_line

#: Caveats listed open up to this many; more are folded (a closed <details>).
FOLD_CAVEATS = 3


def caveats_html(caveats: list) -> str:
    """The caveats, folded when there are more than a few (they are the same in every plan)."""
    if not caveats:
        return ""
    opened = " open" if len(caveats) <= FOLD_CAVEATS else ""
    return (f'<details class="jpm-caveats" role="note"{opened}><summary class="jpm-h">How far to trust these figures '
            f'({len(caveats)} notes)</summary><ul>' + "".join(f"<li>{esc(str(c))}</li>" for c in caveats)
            + "</ul></details>")


def _row_cells(row: dict[str, Any]) -> dict[str, str]:
    """A comparison row's figures as text (the twin of `rowCells` in js/plan.js)."""
    if row.get("error"):
        return {"error": f"failed: {row['error']}"}
    mesh = " × ".join(f"{a['name']}={a['size']}" for a in row.get("axes") or [])
    fit = "" if row.get("fits") is None else ("fits" if row["fits"] else "DOES NOT FIT")
    memory = format_bytes(row.get("memory")) + (f" of {format_bytes(row['capacity'])}" if row.get("capacity") else "")
    cells = {"mesh": mesh, "memory": memory, "fit": fit, "collective bytes": format_bytes(row.get("collective_bytes")),
             "largest buffer": largest_text(row.get("largest"))}
    if row.get("estimate_s") is not None:
        cells.update({"compute": format_seconds(row.get("compute_s")), "memory time": format_seconds(row.get("memory_s")),
                      "collectives": format_seconds(row.get("collective_s")),
                      "estimate": f"{format_seconds(row.get('estimate_s'))} – {format_seconds(row.get('serial_s'))}",
                      "bound": str(row.get("bound_text") or row.get("bound"))})
    return cells


COMPARE_COLUMNS = ("mesh", "memory", "fit", "largest buffer", "collective bytes", "compute", "memory time",
                   "collectives", "estimate", "bound")


def largest_text(b: dict | None) -> str:
    """A row's largest buffer at the peak: `4.0 MiB temporary from dot_general, line 2` (the twin of
    `largestText` in js/plan.js)."""
    if not b:
        return ""
    where = f", line {b['line']}" if b.get("line") is not None else ""
    if b.get("origin"):
        where = f", line {b['origin'].get('line')} of {b['origin'].get('cell')}"
    return f"{format_bytes(b.get('bytes'))} {what_text(b)}{where}"


def compare_text(state: dict[str, Any]) -> str:
    """One line per layout, best first, each starting with its label."""
    rows = state.get("rows") or []
    width = max([len(str(r.get("label"))) for r in rows] + [5])
    lines = [str(state.get("title") or "compare")]
    for row in rows:
        cells = _row_cells(row)
        if "error" in cells:
            lines.append(f"{row.get('label')!s:<{width}}  {cells['error']}")
            continue
        est = (f"estimate {cells['estimate']} ({cells['bound']}-bound) · " if "estimate" in cells else "")
        times = (f" · compute {cells['compute']}, memory {cells['memory time']}, collectives {cells['collectives']}"
                 if "estimate" in cells else "")
        largest = f" · largest buffer {cells['largest buffer']}" if cells.get("largest buffer") else ""
        lines.append(f"{row.get('label')!s:<{width}}  {est}{cells['memory']} per device{', ' + cells['fit'] if cells['fit'] else ''}"
                     f"{largest} · collectives move {cells['collective bytes']}{times} · {cells['mesh']}")
    lines += [f"Every layout {c}." for c in state.get("compilers") or []]
    if any(r.get("estimate_s") is not None for r in rows):
        lines.append("Estimates: communication overlapped with compute – none overlapped; best first, layouts that "
                     "do not fit after those that do.")
    else:
        lines.append("No step-time estimate (give --hardware): ranked by memory per device.")
    caveats = state.get("caveats") or []
    if caveats:
        lines.append("How far to trust these figures:")
        lines += [piece for c in caveats for piece in fit_line(f"  - {c}", TEXT_WIDTH)]  # wrapped, never cut
    return "\n".join(lines)


def compare_html(state: dict[str, Any]) -> str:
    rows = state.get("rows") or []
    timed = any(r.get("estimate_s") is not None for r in rows)
    columns = [c for c in COMPARE_COLUMNS if timed or c not in ("compute", "memory time", "collectives", "estimate", "bound")]
    out = [style_block(), '<div class="jpm-view jpm-plan" data-kind="compare"><div class="jpm-head">'
           f'<span class="jpm-title jpm-mono">{esc(str(state.get("title") or "compare"))}</span>'
           '<span class="jpm-badge">planned, not run</span></div>',
           "".join(f'<div class="jpm-compiler"><b>{esc(str(c))}</b></div>' for c in state.get("compilers") or []),
           '<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr><th>layout</th>'
           + "".join(f"<th>{esc(c)}</th>" for c in columns) + "</tr></thead><tbody>"]
    for row in rows:
        cells = _row_cells(row)
        label = f'<td class="jpm-mono">{esc(str(row.get("label")))}</td>'
        if "error" in cells:
            out.append(f'<tr class="jpm-bad">{label}<td colspan="{len(columns)}">{esc(cells["error"])}</td></tr>')
            continue
        bad = ' class="jpm-bad"' if row.get("fits") is False else ""
        out.append(f"<tr{bad}>{label}" + "".join(
            f'<td class="{"jpm-num" if c not in ("mesh", "bound", "fit", "largest buffer") else "jpm-mono"}">{esc(cells.get(c, ""))}</td>'
            for c in columns) + "</tr>")
    out.append("</tbody></table></div>")
    note = ("estimate: communication overlapped with compute – none overlapped; best first"
            if timed else "no step-time estimate (give --hardware): ranked by memory per device")
    out.append(f'<div class="jpm-note">{esc(note)}</div>')
    out.append(caveats_html(state.get("caveats") or []))
    out.append("</div>")
    return "".join(out)


