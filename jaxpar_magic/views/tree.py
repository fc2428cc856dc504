"""TreeView: a pytree's array leaves as one table, a row per distinct layout (``js/tree.js``),
with static HTML and text renderings of the same state (``tree_summary.tree_state``).

A row's picture is a sharding view's state, drawn by the sharding view's own code: in the
widget on hover or click, in the static HTML for the first few layouts (a ``<details>`` each).
"""

from __future__ import annotations

from typing import Any

from . import sharding
from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_shape

#: Pictures the static HTML carries (the widget draws any row's on demand).
HTML_PICTURES = 4
#: Characters of picture HTML past which the static HTML carries no more pictures (the first is
#: always there): a 256-block picture drawn as <div>s is ~60 KB.
HTML_PICTURE_BUDGET = 60_000
#: Rows the text rendering lists.
TEXT_ROWS = 32


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def summary(state: dict[str, Any]) -> str:
    """`121 array leaves in 3 layouts`; the twin of ``summary`` in ``js/tree.js``."""
    leaves = _plural(int(state.get("arrays") or 0), "array leaf", "array leaves")
    return f"{leaves} in {_plural(int(state.get('layouts') or 0), 'layout')}"


def layout_text(row: dict[str, Any]) -> str:
    """`P('data', None) · split dim 0 8× over data`, or the words alone; twin of ``layoutText``."""
    return f"{row['spec']} · {row['where']}" if row.get("spec") else str(row.get("where") or "")


def paths_text(paths: list[str], more: int) -> str:
    """The paths a row lists, then how many it leaves out; the twin of ``pathsText``."""
    listed = ", ".join(paths)
    return f"{listed}, … and {more} more" if more else listed


def omitted_text(state: dict[str, Any]) -> str | None:
    left = state.get("rows_omitted") or {}
    if not left.get("layouts"):
        return None
    return f"… {_plural(int(left['layouts']), 'more layout')} ({_plural(int(left['leaves']), 'leaf', 'leaves')}) not listed"


def static_text(state: dict[str, Any]) -> str | None:
    """`static leaves: 2 · function ×1 (.activation) · None ×1 (['n'])`; twin of ``staticText``."""
    static = state.get("static") or {}
    if not static.get("count"):
        return None
    parts = [f"{g['kind']} ×{g['count']} ({paths_text(g['paths'], g['more_paths'])})" for g in static.get("groups") or []]
    if static.get("groups_omitted"):
        parts.append(f"{static['groups_omitted']} more kinds")
    return f"static leaves (not arrays, not shipped): {static['count']} · " + " · ".join(parts)


def device_bytes_text(n: Any) -> str:
    """A row's bytes per device, or "—" where no device holds it (host data, no sharding yet)."""
    return "—" if n is None else format_bytes(n)


def _head_chips(state: dict[str, Any]) -> str:
    out = chip("", str(state.get("type") or "")) + chip(summary(state))
    out += chip("all leaves", format_bytes(state.get("bytes")))
    if state.get("device_bytes") is not None:
        out += chip("per device", format_bytes(state["device_bytes"]))
    if state.get("abstract"):
        out += '<span class="jpm-badge jpm-warn">abstract</span>'
    if (state.get("process_count") or 1) > 1:
        out += f'<span class="jpm-badge">{int(state["process_count"])} processes</span>'
    return out


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a tree state (no script; every string escaped)."""
    name = esc(str(state.get("name") or "tree"))
    rows = state.get("rows") or []
    out = [
        f'<div class="jpm-view jpm-tree"><div class="jpm-head"><span class="jpm-title"><code>{name}</code></span>'
        f"{_head_chips(state)}</div>",
    ]
    if rows:
        out.append('<table class="jpm-table jpm-tree-table"><thead><tr><th>leaves</th><th>shape</th><th>layout</th>'
                   "<th>per device</th><th>paths</th></tr></thead><tbody>")
        for row in rows:
            out.append(
                f'<tr><td class="jpm-num">{int(row["count"])}</td>'
                f'<td class="jpm-mono">{esc(format_shape(row["dtype"], row["shape"]))}</td>'
                f"<td>{esc(layout_text(row))}</td><td class=\"jpm-num\">{esc(device_bytes_text(row.get('device_bytes')))}</td>"
                f'<td class="jpm-mono jpm-paths">{esc(paths_text(row["paths"], row["more_paths"]))}</td></tr>'
            )
        out.append("</tbody></table>")
    else:
        out.append('<div class="jpm-note">no array leaves</div>')
    for line in (omitted_text(state), static_text(state)):
        if line:
            out.append(f'<div class="jpm-note">{esc(line)}</div>')
    out.append(_pictures_html(state))
    out.append("</div>")
    return "".join(out)


def _pictures_html(state: dict[str, Any]) -> str:
    pictures = state.get("pictures") or []
    drawn, spent = [], 0
    with_picture = [r for r in state.get("rows") or [] if r.get("picture") is not None]
    for k, row in enumerate(with_picture[:HTML_PICTURES]):
        body = sharding.picture_html(pictures[int(row["picture"])])
        if drawn and spent + len(body) > HTML_PICTURE_BUDGET:
            break
        spent += len(body)
        title = f"{format_shape(row['dtype'], row['shape'])} · {layout_text(row)} · {_plural(int(row['count']), 'leaf', 'leaves')}"
        drawn.append(f'<details class="jpm-tree-pic"{" open" if k == 0 else ""}><summary>{esc(title)}'
                     f"</summary>{body}</details>")
    left = len(state.get("rows") or []) - len(drawn)
    note = f'<div class="jpm-note">pictures of {_plural(left, "more layout")}: in the live view</div>' if left > 0 else ""
    return f'<div class="jpm-section">{"".join(drawn)}{note}</div>' if drawn or note else ""


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a tree state: the same table."""
    head = f"{state.get('name') or 'tree'}: {state.get('type') or ''} · {summary(state)} · {format_bytes(state.get('bytes'))}"
    if state.get("device_bytes") is not None:
        head += f" · {format_bytes(state['device_bytes'])} per device"
    if state.get("abstract"):
        head += " [abstract]"
    rows = state.get("rows") or []
    table = [["leaves", "shape", "layout", "per device", "paths"]]
    for row in rows[:TEXT_ROWS]:
        table.append([str(row["count"]), format_shape(row["dtype"], row["shape"]), layout_text(row),
                      device_bytes_text(row.get("device_bytes")), paths_text(row["paths"], row["more_paths"])])
    widths = [max(len(r[c]) for r in table) for c in range(4)]
    lines = [head]
    if rows:
        lines += ["  " + "  ".join(r[c].rjust(widths[c]) if c in (0, 3) else r[c].ljust(widths[c])
                                   for c in range(4)) + "  " + r[4] for r in table]
    else:
        lines.append("  no array leaves")
    if len(rows) > TEXT_ROWS:
        lines.append(f"  … {len(rows) - TEXT_ROWS} more rows in the live view")
    lines += ["  " + line for line in (omitted_text(state), static_text(state)) if line]
    return "\n".join(lines)


class TreeView(ViewBase):
    """A pytree's leaves by layout: ``TreeView(state={...})`` with a tree_summary.tree_state dict."""

    _esm = bundle_esm("tree.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
