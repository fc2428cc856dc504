"""MeshView: a device mesh laid out by its coordinates (``js/mesh.js``), with static HTML and
text renderings of the same state."""

from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_coords, png_data_uri, product, swatch_style, unravel
from .palette import device_rgb

#: Past this many cells the static HTML draws each facet as a small PNG (one pixel per cell).
HTML_CELL_LIMIT = 1024
#: Past this many cells the text rendering prints only the first facet.
TEXT_CELL_LIMIT = 512
WRAP_1D = 64
#: Past this many rows a facet is drawn with small unlabelled cells, and its text keeps the first
#: and last rows: a tall mesh (data=32 × model=8) stays a compact picture. Twin of js/mesh.js's.
COMPACT_ROWS = 16
TEXT_HEAD_ROWS, TEXT_TAIL_ROWS = 6, 2
_NEUTRAL_RGB = (201, 206, 212)


def _axes(state: dict[str, Any]) -> list[dict[str, Any]]:
    axes = state.get("axes") or [{"name": "", "size": len(state.get("device_ids") or [0])}]
    return [{"name": str(a["name"]), "size": int(a["size"])} for a in axes]


def _layout(state: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int], list[tuple[list[int], int, int]]]:
    """Axes, ids, and facets as ``(prefix coords, rows, cols)``; a 1-D mesh is one facet."""
    axes = _axes(state)
    sizes = [a["size"] for a in axes]
    ids = [int(i) for i in (state.get("device_ids") or [])][: product(sizes)]
    if len(axes) == 1:
        n = len(ids)
        cols = min(n, WRAP_1D) or 1
        return axes, ids, [([], -(-n // cols), cols)]
    lead = sizes[:-2]
    rows, cols = sizes[-2:]
    return axes, ids, [(unravel(f, lead), rows, cols) for f in range(product(lead))]


def _header(state: dict[str, Any], axes: list[dict[str, Any]], total: int) -> tuple[str, str]:
    abstract = bool(state.get("abstract"))
    noun = "positions" if abstract else ("device" if total == 1 else "devices")
    dims = " × ".join(f"{a['name']}={a['size']}" for a in axes)
    sub = f"{dims} · {total} {noun}"
    return sub, noun


def _abstract_rgb(row: int, col: int) -> tuple[int, int, int]:
    """Positions of an abstract mesh: a neutral checkerboard, so each cell stays visible."""
    return _NEUTRAL_RGB if (row + col) % 2 == 0 else tuple(max(0, v - 40) for v in _NEUTRAL_RGB)


def _grid_table(ids: list[int], rows: int, cols: int, px: int, font: int, row_ticks: bool, abstract: bool,
                where: Any) -> str:
    """A facet's cells as a table (a sanitizer keeps no grid template): at most ``px`` square, narrower
    when the output is; column numbers on top and row numbers on the left when cells are labelled."""
    gap = 1 if px < 20 else 2
    width = cols * (px + gap) + gap + (24 if font and row_ticks else 0)
    out = [f'<table class="jpm-grid{" jpm-tight" if px < 20 else ""}" style="width:100%;max-width:{width}px">']
    if font:
        out.append("<tr>" + ('<th style="width:22px"></th>' if row_ticks else "")
                   + "".join(f"<th>{c}</th>" for c in range(cols)) + "</tr>")
    for r in range(-(-len(ids) // cols)):
        out.append("<tr>" + (f'<td class="jpm-axis-y" style="width:22px">{r}</td>' if font and row_ticks else ""))
        for k in range(r * cols, min(len(ids), (r + 1) * cols)):
            dev = ids[k]
            what = f"{'position' if abstract else 'device'} {dev} · {where(k)}"
            style = f"height:{px}px" + ("" if abstract else ";" + swatch_style(dev)) + (f";font-size:{font}px" if font else "")
            cls = ' class="jpm-cell jpm-abstract"' if abstract else ' class="jpm-cell"'
            out.append(f'<td{cls} style="{style}" title="{esc(what)}">{dev if font else ""}</td>')
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a mesh state (no script; every string escaped)."""
    axes, ids, facets = _layout(state)
    total = len(ids)
    abstract = bool(state.get("abstract"))
    sub, _ = _header(state, axes, total)
    chips = "".join(chip(k) for k in state.get("kinds") or [])
    for k, t in enumerate(state.get("axis_types") or []):
        if t and t != "Auto" and k < len(axes):
            chips += chip(f"{axes[k]['name']}:", str(t))
    if abstract:
        chips += '<span class="jpm-badge jpm-warn">abstract</span>'
    out = [
        '<div class="jpm-view jpm-mesh">',
        f'<div class="jpm-head"><span class="jpm-title">Mesh <code>{esc(str(state.get("name") or "mesh"))}</code></span>'
        f'<span class="jpm-sub">{esc(sub)}</span><span class="jpm-chips">{chips}</span></div>',
        '<div class="jpm-section jpm-facets">',
    ]
    big = total <= HTML_CELL_LIMIT
    one_d = len(axes) == 1
    col_axis = axes[-1]
    row_axis = None if one_d else axes[-2]
    per = facets[0][1] * facets[0][2] if not one_d else 0
    for f, (prefix, rows, cols) in enumerate(facets):
        chunk = ids if one_d else ids[f * per : (f + 1) * per]
        label = format_coords(axes, prefix)
        out.append(f'<div class="jpm-facet" title="{esc(label)}">')
        if prefix and len(facets) <= 64:
            out.append(f'<div class="jpm-facet-title">{esc(label)}</div>')
        note = f" (wrapped every {WRAP_1D})" if one_d and total > WRAP_1D else ""
        out.append(
            '<div class="jpm-frame">'
            f'<div class="jpm-axis-x"><span class="jpm-axis-name">{esc(col_axis["name"])}</span> · {col_axis["size"]} →{note}'
            + (f' · down: <span class="jpm-axis-name">{esc(row_axis["name"])}</span> · {row_axis["size"]} ↓'
               if row_axis is not None else "")
            + "</div>"
        )
        if big:
            px = 11 if rows > COMPACT_ROWS else 40 if cols <= 16 and total <= 256 else 26 if cols <= 32 else 11
            label_ids = px >= 26 and (px == 40 or max(ids, default=0) < 1000)
            font = 13 if px == 40 else 10
            out.append(_grid_table(chunk, rows, cols, px, font if label_ids else 0, row_axis is not None, abstract,
                                   lambda k, prefix=prefix: format_coords(axes, prefix + unravel(k, [rows, cols] if not one_d else [total]))))
        else:
            px = 11 if cols <= 64 else 6
            pixels = [
                [
                    (_abstract_rgb(r, c) if abstract else device_rgb(chunk[r * cols + c]))
                    if r * cols + c < len(chunk)
                    else (255, 255, 255)
                    for c in range(cols)
                ]
                for r in range(rows)
            ]
            out.append(
                f'<img class="jpm-pixels jpm-grid" src="{png_data_uri(pixels)}" width="{cols * px}" '
                f'height="{rows * px}" alt="{esc(label or "mesh")}: {rows}×{cols} cells">'
            )
        out.append("</div></div>")
    out.append("</div>")
    if not big:
        what = "one square per mesh position (an abstract mesh has no devices)" if abstract else \
            "one coloured square per device"
        out.append(f'<div class="jpm-note">Static view: {what}; the live widget shows ids on hover.</div>')
    out.append("</div>")
    return "".join(out)


def _text_grid(ids: list[int], rows: int, cols: int, row_name: str | None, col_name: str) -> list[str]:
    width = max([len(str(i)) for i in ids] + [len(str(cols - 1))])
    rlabel = max(len(str(rows - 1)), 1)
    lead = f"{row_name} " if row_name else ""
    pad = " " * (len(lead) + rlabel + 2)
    lines = [pad + col_name + " →", pad + " ".join(str(c).rjust(width) for c in range(cols))]
    shown = list(range(rows))
    if rows > COMPACT_ROWS:
        shown = shown[:TEXT_HEAD_ROWS] + shown[-TEXT_TAIL_ROWS:]
    for r in shown:
        if r == rows - TEXT_TAIL_ROWS and len(shown) < rows:
            hidden = ids[TEXT_HEAD_ROWS * cols : (rows - TEXT_TAIL_ROWS) * cols]
            lines.append(f"{' ' * len(lead)}{'⋮'.rjust(rlabel)}  … rows {TEXT_HEAD_ROWS}–{rows - TEXT_TAIL_ROWS - 1} "
                         f"(devices {hidden[0]}…{hidden[-1]}) not shown")
        cells = " ".join(str(i).rjust(width) for i in ids[r * cols : (r + 1) * cols])
        name = lead if r == 0 else " " * len(lead)
        lines.append(f"{name}{str(r).rjust(rlabel)}  {cells}")
    return lines


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a mesh state."""
    axes, ids, facets = _layout(state)
    total = len(ids)
    sub, _ = _header(state, axes, total)
    kinds = ", ".join(str(k) for k in state.get("kinds") or [])
    title = f"Mesh {state.get('name') or 'mesh'!r}: {sub}" + (f" ({kinds})" if kinds else "")
    if state.get("abstract"):
        title += " [abstract]"
    lines = [title]
    if len(axes) == 1:
        cols = facets[0][2]
        lines += _text_grid(ids, facets[0][1], cols, None, f"{axes[0]['name']}")
        return "\n".join(lines)
    per = facets[0][1] * facets[0][2]
    shown = facets if total <= TEXT_CELL_LIMIT else facets[:1]
    for f, (prefix, rows, cols) in enumerate(shown):
        if prefix:
            lines.append(f"[{format_coords(axes, prefix)}]")
        lines += _text_grid(ids[f * per : (f + 1) * per], rows, cols, axes[-2]["name"], axes[-1]["name"])
    if len(shown) < len(facets):
        lines.append(f"… {len(facets) - len(shown)} more facets over {', '.join(a['name'] for a in axes[:-2])}")
    return "\n".join(lines)


class MeshView(ViewBase):
    """A device mesh: ``MeshView(state={...})`` with the MeshView state dict."""

    _esm = bundle_esm("mesh.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
