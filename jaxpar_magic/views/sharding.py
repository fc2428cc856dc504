"""ShardingView: how an array is split over a mesh (``js/sharding.js``), with static HTML and
text renderings of the same state."""

from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_ids, format_shape, format_slices, format_spec, png_data_uri, product, swatch_style, unravel
from .palette import device_color, device_rgb
from .summaries import expand_sharding_tiles

MAX_FACETS = 16
#: Past this many blocks drawn in all (facets together) the static HTML draws PNGs (one pixel per
#: block): 4,096 blocks as <div>s would be ~800 KB of HTML in every exported notebook.
HTML_BLOCK_LIMIT = 256
#: The text rendering lists this many blocks.
TEXT_BLOCKS = 16
MAX_STRIPES = 8


def _entry_axes(entry: Any) -> list[str]:
    if entry is None:
        return []
    return [str(a) for a in entry] if isinstance(entry, (list, tuple)) else [str(entry)]


def _dim_caption(state: dict[str, Any], k: int) -> str:
    spec = state.get("spec") or []
    axes = _entry_axes(spec[k] if k < len(spec) else None)
    n = (state.get("grid") or [])[k] if k < len(state.get("grid") or []) else 1
    split = f"split {n}× over {'×'.join(axes)}" if axes else "not split"
    return f"dim {k} · {state['shape'][k]} · {split}"


def _side_caption(state: dict[str, Any], k: int, px: int) -> str:
    """The twin of ``sideCaption`` in ``js/sharding.js``."""
    full = _dim_caption(state, k)
    if len(full) * 7 <= px:
        return full
    return f"dim {k} · {state['shape'][k]}" if px >= 70 else f"dim {k}"


def _who(devs: list[int]) -> str:
    if not devs:
        return "no device"
    return f"device {devs[0]}" if len(devs) == 1 else f"devices {format_ids(devs, 8)} ({len(devs)}, replicated)"


def _legend_rows(state: dict[str, Any]) -> list[tuple[str, int, str]]:
    shape = state.get("shape") or []
    used: dict[str, int] = {}
    for k, e in enumerate(state.get("spec") or []):
        for a in _entry_axes(e):
            used[a] = k
    rows = []
    for a in state.get("mesh_axes") or []:
        name = str(a["name"])
        where = (
            f"splits dim {used[name]} ({shape[used[name]]})"
            if name in used
            else f"replicates: each block is copied across its {int(a['size'])} positions"
        )
        rows.append((name, int(a["size"]), where))
    return rows


def _block_count(state: dict[str, Any]) -> int:
    """Blocks in the grid, sent or not (a capped state lists the first MAX_SHARDING_TILES)."""
    return product(state.get("grid") or []) if state.get("blocks") is not None else 0


def _head_sub(state: dict[str, Any]) -> str:
    count = _block_count(state)
    n = state.get("total_devices", "?")
    blocks = f"{count} distinct block{'' if count == 1 else 's'}"
    if n == 0:  # no sharding: a plan's ShapeDtypeStruct not laid out yet, or host data (the twin of js/sharding.js)
        return f"{blocks}, not laid out on devices" if state.get("abstract") else f"{blocks} in host memory, on no device"
    return f"{blocks} on {n} device{'' if n == 1 else 's'}"


def process_of(state: dict[str, Any]) -> Any:
    """A device's process when the state spans several (optional ``device_process``,
    ``{"<device id>": process}``), else None for every device; the twin of ``processOf``."""
    procs = state.get("device_process")
    if not isinstance(procs, dict) or len(set(procs.values())) <= 1:
        return lambda d: None
    by_id = {str(k): int(v) for k, v in procs.items()}
    return lambda d: by_id.get(str(d))


def process_text(proc_of: Any, devs: list[int]) -> str:
    """`` · process 1``, `` · processes 0,1`` or ""; the twin of ``processText``."""
    procs = sorted({p for p in (proc_of(d) for d in devs) if p is not None})
    if not procs:
        return ""
    return f" · process {procs[0]}" if len(procs) == 1 else f" · processes {format_ids(procs, 4)}"


def process_lines(proc_of: Any, state: dict[str, Any], tiles: list[dict[str, Any]]) -> list[str]:
    """One line per process: its devices and how many blocks it holds a copy of."""
    devices: dict[int, list[int]] = {}
    for key in state.get("device_process") or {}:
        p = proc_of(int(key))
        if p is not None:
            devices.setdefault(p, []).append(int(key))
    lines = []
    for p in sorted(devices):
        held = sum(1 for t in tiles if any(proc_of(int(d)) == p for d in t.get("devices") or []))
        lines.append(f"process {p}: devices {format_ids(sorted(devices[p]), 6)} · holds {held} block{'' if held == 1 else 's'}")
    return lines


def copies_label(devs: list[int]) -> str:
    """A replicated block's label: ``2 copies: 0,1``; the twin of ``copiesLabel`` in js/sharding.js."""
    return f"{len(devs)} copies: {format_ids(devs, 2)}"


def _block_html(tile: dict[str, Any] | None, dtype: str, style: str, proc_of: Any = lambda d: None,
                label: bool = True) -> str:
    """One block as a table cell. A block one device holds has that device's colour and id; a
    block several devices hold is drawn as copies (the way jax.debug.visualize_array_sharding
    labels one cell with its devices): a neutral cell, "N copies: ids", and a small mark per copy
    in each device's colour, never side-by-side stripes, which would read as a split."""
    if tile is None:
        return f'<td style="{style};background:rgba(128,128,128,0.12)"></td>'
    devs = [int(d) for d in tile.get("devices") or []]
    detail = (
        f"block ({', '.join(str(b) for b in tile['block'])}) · index {format_slices(tile['index'])} · "
        f"shard {format_shape(dtype, tile['shard_shape'])} · {_who(devs)}{process_text(proc_of, devs)}"
    )
    if len(devs) == 1:
        return f'<td style="{style};{swatch_style(devs[0])}" title="{esc(detail)}">{devs[0] if label else ""}</td>'
    marks = "".join(f'<i style="background:{device_color(d)[0]}"></i>' for d in devs[:MAX_STRIPES])
    more = f"+{len(devs) - MAX_STRIPES}" if len(devs) > MAX_STRIPES else ""
    text = f'<div class="jpm-blabel">{esc(copies_label(devs))}</div>' if label else ""
    return (f'<td class="jpm-copies" style="{style}" title="{esc(detail)}">{text}'
            f'<div class="jpm-copy-marks">{marks}{esc(more)}</div></td>')


#: One pixel of a block no device holds, or one a capped state did not send (the light panel grey).
NO_DEVICE_RGB = (0xF2, 0xF3, 0xF5)


def _pixel(tile: dict[str, Any] | None) -> tuple[int, int, int]:
    devs = (tile or {}).get("devices") or []
    return device_rgb(int(devs[0])) if devs else NO_DEVICE_RGB


def box_size(facets: int, rows: int, cols: int, grid_rows: int, grid_cols: int) -> tuple[int, int]:
    """Pixel size of one facet's drawing; the twin of ``boxSize`` in ``js/sharding.js``."""
    max_w = 520 if facets == 1 else 300 if facets <= 4 else 200
    max_h = 340 if facets == 1 else 240 if facets <= 4 else 160
    aspect = max(0.15, min(6.0, rows / max(1, cols)))
    width, height = float(max_w), max_w * aspect
    if height > max_h:
        height = float(max_h)
        width = height / aspect
    width = max(width, 60, min(grid_cols * 6, 600))
    height = max(height, 36, min(grid_rows * 8, 600))
    return round(width), round(height)


def _extents(state: dict[str, Any], k: int) -> list[int]:
    """Sizes of the blocks along dimension ``k`` (from the state's cut points), all 1 when unknown."""
    bounds = state.get("bounds") or []
    cuts = bounds[k] if k < len(bounds) else []
    sizes = [max(0, int(b) - int(a)) for a, b in zip(cuts, cuts[1:])]
    return sizes or [1]


def _blocks_table(state: dict[str, Any], grid: list[int], at: Any, rows_n: int, cols_n: int, width: int,
                  height: int, dtype: str, proc_of: Any) -> str:
    """The blocks of one facet as a table, columns and rows in proportion to the blocks' sizes: at
    most ``width`` × ``height`` px, narrower when the output is (the rows keep their heights)."""
    nd = len(grid)
    cols = _extents(state, nd - 1) if nd else [1]
    rows = _extents(state, nd - 2) if nd >= 2 else [1]
    if len(cols) != cols_n:
        cols = [1] * cols_n
    if len(rows) != rows_n:
        rows = [1] * rows_n
    csum, rsum = sum(cols) or 1, sum(rows) or 1
    out = [f'<table class="jpm-blocks" style="max-width:{width + 4}px"><colgroup>'
           + "".join(f'<col style="width:{100 * c / csum:.2f}%">' for c in cols) + "</colgroup>"]
    for r in range(rows_n):
        h = max(12, round(height * rows[r] / rsum))
        out.append("<tr>")
        for c in range(cols_n):
            w = width * cols[c] / csum
            tile = at(r, c)
            devs = (tile or {}).get("devices") or []
            words = copies_label(devs) if len(devs) > 1 else str(devs[0]) if devs else ""
            label = h >= 15 and w >= 7 * min(len(words), 12) + 8
            out.append(_block_html(tile, dtype, f"height:{h}px", proc_of, label))
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a sharding state (no script; every string escaped)."""
    return picture_html(state)


def picture_html(state: dict[str, Any]) -> str:
    """:func:`to_html` without the stylesheet: for views that show several pictures under one."""
    shape = [int(s) for s in state.get("shape") or []]
    grid = [int(g) for g in state.get("grid") or [1] * len(shape)]
    dtype = str(state.get("dtype") or "")
    tiles = expand_sharding_tiles(state)
    by_block = {tuple(t["block"]): t for t in tiles}
    proc_of = process_of(state)
    head = f'<span class="jpm-title"><code>{esc(str(state.get("name") or "array"))}</code></span>' + chip(
        "", format_shape(dtype, shape)
    )
    if state.get("nbytes") is not None:
        head += chip("whole array", format_bytes(state["nbytes"]))
    head += f'<span class="jpm-sub">{esc(_head_sub(state))}</span>'
    if state.get("abstract"):
        head += '<span class="jpm-badge jpm-warn">abstract</span>'
    if (state.get("process_count") or 1) > 1:
        head += f'<span class="jpm-badge">{int(state["process_count"])} processes</span>'
    rep = state.get("replicated_over") or []
    legend = "".join(
        f'<div class="jpm-legend-row"><span class="jpm-mono">{esc(n)}</span><span>{s}</span><span>→ {esc(w)}</span></div>'
        for n, s, w in _legend_rows(state)
    )
    out = [
        f'<div class="jpm-view jpm-sharding"><div class="jpm-head">{head}</div>',
        f'<div class="jpm-section"><div class="jpm-head"><span class="jpm-spec">{esc(format_spec(state.get("spec") or []))}</span>'
        + (f'<span class="jpm-sub">replicated over {esc(", ".join(str(r) for r in rep))}</span>' if rep else "")
        + f'</div><div class="jpm-legend">{legend}</div>'
        + "".join(f'<div class="jpm-note jpm-procs">{esc(line)}</div>' for line in process_lines(proc_of, state, tiles))
        + "</div>",
        '<div class="jpm-section"><div class="jpm-facets">',
    ]
    nd = len(shape)
    if nd <= 1:
        rows_n, cols_n, lead, facets = 1, (grid[0] if nd else 1), [], 1
    else:
        rows_n, cols_n, lead = grid[-2], grid[-1], grid[:-2]
        facets = product(lead)
    for f in range(min(facets, MAX_FACETS)):
        prefix = unravel(f, lead)

        def at(r: int, c: int, prefix: list[int] = prefix) -> dict[str, Any] | None:
            key = tuple(prefix + [r, c]) if nd >= 2 else ((c,) if nd == 1 else ())
            return by_block.get(key)

        caption_x = _dim_caption(state, nd - 1) + " →" if nd else "scalar"
        caption_y = _dim_caption(state, nd - 2) if nd >= 2 else ""
        out.append('<div class="jpm-facet">')
        if lead:
            sample = at(0, 0)
            slices = [f"{a}:{b}" for a, b in sample["index"][: len(lead)]] if sample else [str(p) for p in prefix]
            out.append(f'<div class="jpm-facet-title">[{esc(", ".join(slices + [":", ":"]))}]</div>')
        out.append(f'<div class="jpm-frame"><div class="jpm-axis-x">{esc(caption_x)}</div>')
        width = 520 if facets == 1 else 300 if facets <= 4 else 200
        height = 36
        if nd >= 2:
            width, height = box_size(facets, shape[-2], shape[-1], rows_n, cols_n)
        if caption_y:
            side = _side_caption(state, nd - 2, height)
            out.append(
                f'<div class="jpm-axis-y"><span class="jpm-axis-label" title="{esc(caption_y)}">{esc(side)} →</span></div>'
            )
        if rows_n * cols_n * min(facets, MAX_FACETS) > HTML_BLOCK_LIMIT:
            # One pixel per block, scaled to the same box the <div> drawing would fill.
            pixels = [[_pixel(at(r, c)) for c in range(cols_n)] for r in range(rows_n)]
            out.append(
                f'<img class="jpm-pixels jpm-grid" src="{png_data_uri(pixels)}" width="{width}" '
                f'height="{height}" alt="{rows_n}×{cols_n} blocks, coloured by device">'
            )
        else:
            if nd < 2:
                width, height = min(560, max(120, cols_n * 40)), 36
            out.append(_blocks_table(state, grid, at, rows_n, cols_n, width, height, dtype, proc_of))
        out.append("</div></div>")
    if facets > MAX_FACETS:
        out.append(f'<div class="jpm-more">… {facets - MAX_FACETS} more facets over the leading dimensions</div>')
    out.append("</div></div></div>")
    return "".join(out)


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a sharding state."""
    shape = [int(s) for s in state.get("shape") or []]
    dtype = str(state.get("dtype") or "")
    every = expand_sharding_tiles(state)
    tiles = every[:TEXT_BLOCKS]
    count = _block_count(state)
    proc_of = process_of(state)
    head = f"{state.get('name') or 'array'}: {format_shape(dtype, shape)}"
    if state.get("nbytes") is not None:
        head += f" ({format_bytes(state['nbytes'])})"
    head += f" · {format_spec(state.get('spec') or [])}"
    rep = state.get("replicated_over") or []
    if rep:
        head += f" · replicated over {', '.join(str(r) for r in rep)}"
    if state.get("abstract"):
        head += " [abstract]"
    lines = [head, "  " + _head_sub(state)]
    lines += [f"  mesh axis {n} ({s}) → {w}" for n, s, w in _legend_rows(state)]
    lines += ["  " + line for line in process_lines(proc_of, state, every)]
    lines += ["  " + _dim_caption(state, k) for k in range(len(shape))]
    for t in tiles:
        devs = [int(d) for d in t.get("devices") or []]
        lines.append(
            f"  block ({', '.join(str(b) for b in t['block'])}) {format_slices(t['index'])} "
            f"{format_shape(dtype, t['shard_shape'])} → {_who(devs)}{process_text(proc_of, devs)}"
        )
    if count > len(tiles):
        lines.append(f"  … {count - len(tiles)} more blocks")
    return "\n".join(lines)


class ShardingView(ViewBase):
    """An array's sharding: ``ShardingView(state={...})`` with the ShardingView state dict."""

    _esm = bundle_esm("sharding.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
