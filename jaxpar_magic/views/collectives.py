"""CollectivesView: one card per collective call of a ``%%pmap --collectives`` cell
(``js/collectives.js``), with static HTML and text renderings of the same state.

The static HTML draws each card's whole movement as one still SVG picture (the live widget adds
the step control); :func:`movement_model` is the twin of ``movementModel`` in the JS module and
says what both pictures show: which device's block lands in which output block. Both lay the
cards out the same way (:func:`stage_layout`): they fit the width of the output area they are
given, and past a readable minimum the stage scrolls inside its card.
"""

from __future__ import annotations

import math
from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_ids, png_data_uri, style_block, swatch_style
from .palette import device_color

MAX_CARDS = 64
MAX_DEVICES_DRAWN = 16
MAX_LINKS = 256
#: Stage geometry in pixels; the same numbers as js/collectives.js. Columns and group gaps are
#: drawn at their design width when the card has room and shrink in proportion down to
#: ``MIN_COL_W`` a column; below that the stage scrolls inside its card.
LABEL_W = 50
GROUP_GAP = 12
BAR_H = 14
LINKS_H = 64
MIN_COL_W = 50
_HEAT_STOPS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]

Slot = list[list[int]]


def reduce_symbol(op: str) -> str:
    return {"pmax": "max", "pmin": "min", "pmean": "mean"}.get(op, "Σ")


def movement_sentence(kind: str) -> str:
    """The twin of ``movementSentence`` in js/collectives.js."""
    return {
        "all-reduce": "every device's contribution is combined into every output of its group",
        "all-gather": "each device's block lands in every output of its group",
        "reduce-scatter": "block k of every input is combined into device k of the group",
        "all-to-all": "block k of device j goes to device k as its block j: a transpose of blocks",
        "permute": "each device sends its whole value to another; a device nobody sends to gets zeros",
    }.get(kind, "no data moves between devices")


def card_columns(card: dict[str, Any]) -> tuple[list[int], list[list[int]]]:
    """Device columns, grouped by communicating group; the twin of ``cardColumns``."""
    its = card.get("iterations") or []
    drawn: list[int] = []
    if its:
        for t in list(its[0].get("before") or []) + list(its[0].get("after") or []):
            d = int(t["device"])
            if d not in drawn and len(drawn) < MAX_DEVICES_DRAWN:
                drawn.append(d)
    placed: set[int] = set()
    groups: list[list[int]] = []
    for g in card.get("groups") or []:
        mine = []
        for d in g:
            if d in drawn and d not in placed:
                placed.add(d)
                mine.append(int(d))
        if mine:
            groups.append(mine)
    rest = [d for d in drawn if d not in placed]
    if rest:
        groups.append(rest)
    return [d for g in groups for d in g], groups


def _add(slot: Slot, origin: list[int]) -> None:
    if [origin[0], origin[1]] not in slot:
        slot.append([origin[0], origin[1]])
    slot.sort()


def movement_model(card: dict[str, Any], step: int = 0) -> dict[str, Any]:
    """What a card's picture shows at ``step`` (0: the whole movement; k: ring step k).

    The twin of ``movementModel`` in js/collectives.js (a browser test compares the two): bars of
    blocks per drawn device, each block listing the origins ``[device, block]`` of its contents,
    and the transfers drawn between them.
    """
    mv = card.get("movement") or {"kind": "none", "blocks": 1, "transfers": [], "steps": []}
    columns, groups = card_columns(card)
    whole = mv.get("transfers") or []
    steps = mv.get("steps") or []
    k = max(0, min(int(step), len(steps)))

    def max_of(ts: list[dict[str, Any]], f: Any) -> int:
        return max([1] + [f(t) + 1 for t in ts])

    if k == 0:
        in_slots = max_of(whole, lambda t: t["src_block"])
        out_slots = max_of(whole, lambda t: t["dst_block"])
        top = [[[[d, b]] for b in range(in_slots)] for d in columns]
        bottom: list[list[Slot]] = [[[] for _ in range(out_slots)] for _ in columns]
        for t in whole:
            if t["dst"] in columns and t["dst_block"] < out_slots:
                _add(bottom[columns.index(t["dst"])][t["dst_block"]], [t["src"], t["src_block"]])
        shown = whole
        label = "whole movement"
    else:
        every = [t for s in steps for t in s.get("transfers") or []]
        n = max(int(mv.get("blocks") or 1), max_of(every, lambda t: max(t["src_block"], t["dst_block"])))
        devices = list(dict.fromkeys(columns + [d for g in card.get("groups") or [] for d in g]
                                     + [x for t in every for x in (t["src"], t["dst"])]))
        buf: dict[int, list[Slot]] = {}
        for d in devices:
            slots: list[Slot] = [[] for _ in range(n)]
            if mv.get("kind") == "all-gather":
                own = [t for t in whole if t["src"] == d and t["dst"] == d]
                group = next((g for g in card.get("groups") or [] if d in g), None)
                if own:
                    for t in own:
                        if t["dst_block"] < n:
                            _add(slots[t["dst_block"]], [d, t["src_block"]])
                elif group is not None and group.index(d) < n:
                    slots[group.index(d)].append([d, 0])
            else:
                for b, s in enumerate(slots):
                    s.append([d, b])
            buf[d] = slots

        # A permute writes a fresh output (a device nobody sends to gets zeros); the rings and the
        # pairwise all-to-all work in one buffer.
        fresh = mv.get("kind") == "permute"

        def apply(s: dict[str, Any]) -> None:
            nxt = {d: [[] if fresh else [list(o) for o in slot] for slot in slots] for d, slots in buf.items()}
            for t in s.get("transfers") or []:
                src = buf.get(t["src"]) or []
                origins = src[t["src_block"]] if t["src_block"] < len(src) else []
                into = nxt.get(t["dst"])
                if into is None or t["dst_block"] >= n:
                    continue
                if not t.get("reduce"):
                    into[t["dst_block"]] = []
                for o in origins:
                    _add(into[t["dst_block"]], o)
            buf.update(nxt)

        for s in steps[: k - 1]:
            apply(s)
        top = [[[list(o) for o in slot] for slot in buf.get(d, [])] for d in columns]
        apply(steps[k - 1])
        bottom = [[[list(o) for o in slot] for slot in buf.get(d, [])] for d in columns]
        in_slots = out_slots = n
        shown = steps[k - 1].get("transfers") or []
        label = f"step {k} of {len(steps)}: {steps[k - 1].get('label')}"
    visible = [t for t in shown if t["src"] in columns and t["dst"] in columns]
    partial = [any(d in g and any(e not in columns for e in g) for g in card.get("groups") or []) for d in columns]
    return {
        "columns": columns,
        "groups": groups,
        "partial": partial,
        "in_slots": in_slots,
        "out_slots": out_slots,
        "top": top,
        "bottom": bottom,
        "links": [
            {"src": t["src"], "src_block": t["src_block"], "dst": t["dst"], "dst_block": t["dst_block"],
             "reduce": bool(t.get("reduce"))}
            for t in visible[:MAX_LINKS]
        ],
        "links_omitted": max(0, len(visible) - MAX_LINKS),
        "label": label,
    }


def slot_text(origins: Slot, blocked: bool, sym: str, partial: bool = False) -> str:
    """A block's contents as text; the twin of ``slotText``."""
    if not origins:
        return "…" if partial else "·"
    if len(origins) == 1:
        return f"{origins[0][0]}:{origins[0][1]}" if blocked else f"{origins[0][0]}"
    devs = sorted({o[0] for o in origins})
    blocks = {o[1] for o in origins}
    which = "" if not blocked else f":{origins[0][1]}" if len(blocks) == 1 else ":*"
    return f"{sym}({format_ids(devs, 4)}{',…' if partial else ''}){which}"


def picture_blocked(pic: dict[str, Any]) -> bool:
    return any(o[1] != 0 for bar in (pic["top"], pic["bottom"]) for slots in bar for slot in slots for o in slot)


def stage_geometry(groups: list[list[int]]) -> tuple[int, list[int], int]:
    """Column width, left edges and total width; the twin of ``stageGeometry``."""
    n = sum(len(g) for g in groups) or 1
    width = max(52, min(120, (880 - LABEL_W - GROUP_GAP * (len(groups) - 1)) // n))
    left: list[int] = []
    x = 0
    for gi, g in enumerate(groups):
        if gi:
            x += GROUP_GAP
        for _ in g:
            left.append(x)
            x += width
    return width, left, x


def stage_layout(groups: list[list[int]]) -> dict[str, Any]:
    """The stage's grid and width bounds; the twin of ``stageLayout``. Every column and gap is a
    flexible track in proportion to its design width, so the picture (drawn in design units and
    stretched over its columns) stays aligned with the tiles at any width in the bounds."""
    width, _, total = stage_geometry(groups)
    tracks = [f"{LABEL_W}px"]
    for gi, g in enumerate(groups):
        if gi:
            tracks.append(f"minmax(0, {GROUP_GAP}fr)")
        tracks += [f"minmax(0, {width}fr)"] * len(g)
    return {"template": " ".join(tracks), "min_width": LABEL_W + math.ceil(total * MIN_COL_W / width),
            "max_width": LABEL_W + total}


def label_need(text: str, w: float, total: int) -> int:
    """The picture width (px) a block's label needs to fit its block of ``w`` design units, about
    6 px a character; CSS hides the label below it. The twin of ``labelNeed``."""
    return math.ceil(total * (len(text) * 6 + 2) / w)


def _pct(x: float, total: int) -> str:
    return f"{round(x / total * 1e4) / 100:g}%"


def hubs(links: list[dict[str, Any]]) -> tuple[list[tuple[list[dict], list[dict]]], list[dict[str, Any]]]:
    """Combining nodes (the twin of ``hubs``): returns the hubs as (sources, destinations) and
    the links drawn directly."""
    into: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for t in links:
        if t.get("reduce"):
            into.setdefault((t["dst"], t["dst_block"]), []).append(t)
    by_sources: dict[str, tuple[list[dict], list[dict], list[dict]]] = {}
    for ts in into.values():
        if len(ts) < 2:
            continue
        key = " ".join(sorted(f"{t['src']}:{t['src_block']}" for t in ts))
        srcs, dsts, every = by_sources.setdefault(key, (ts, [], []))
        dsts.append(ts[0])
        every.extend(ts)
    out, taken = [], set()
    for srcs, dsts, every in by_sources.values():
        if len(dsts) < 2:
            continue
        taken.update(id(t) for t in every)
        out.append((srcs, dsts))
    return out, [t for t in links if id(t) not in taken]


def _fx(v: float) -> str:
    return f"{round(v * 10) / 10:g}"


def _curve(xa: float, ya: float, xb: float, yb: float) -> str:
    m = (ya + yb) / 2
    return f"M{_fx(xa)},{_fx(ya)} C{_fx(xa)},{_fx(m)} {_fx(xb)},{_fx(m)} {_fx(xb)},{_fx(yb)}"


def _picture_svg(card: dict[str, Any], pic: dict[str, Any], width: int, left: list[int], total: int) -> str:
    """The whole movement as one SVG: curves grouped into one path per source device (compact).

    As in the live view, curves and blocks are drawn in design units in an inner SVG stretched
    to the columns' width; labels and combining nodes sit above it at percentages of the width.
    """
    sym = reduce_symbol(str(card.get("op")))
    blocked = picture_blocked(pic)
    height = 2 * BAR_H + LINKS_H
    col = {d: i for i, d in enumerate(pic["columns"])}

    def x_of(d: int, b: int, slots: int) -> float:
        w = (width - 6) / slots
        return left[col[d]] + 3 + (min(b, slots - 1) + 0.5) * w

    y0, y1 = BAR_H, BAR_H + LINKS_H
    paths: dict[str, list[str]] = {}
    hub_list, direct = hubs(pic["links"])
    outs, nodes = [], []
    for srcs, dsts in hub_list:
        x = sum(x_of(t["dst"], t["dst_block"], pic["out_slots"]) for t in dsts) / len(dsts)
        y = (y0 + y1) / 2
        for t in srcs:
            paths.setdefault(device_color(t["src"])[0], []).append(
                _curve(x_of(t["src"], t["src_block"], pic["in_slots"]), y0, x, y - 7)
            )
        d = "".join(_curve(x, y + 7, x_of(t["dst"], t["dst_block"], pic["out_slots"]), y1) for t in dsts)
        outs.append(f'<path class="jpm-link jpm-link-out" d="{d}"></path>')
        tw = max(16, len(sym) * 7 + 8)
        who = f"{sym}({format_ids(sorted({t['src'] for t in srcs}), 3)})"
        nodes.append(
            f'<g class="jpm-hub"><title>{esc(who)}: combined, then sent to devices '
            f'{esc(format_ids([t["dst"] for t in dsts], 4))}</title>'
            f'<ellipse cx="{_pct(x, total)}" cy="{_fx(y)}" rx="{_fx(tw / 2)}" ry="8"></ellipse>'
            f'<text x="{_pct(x, total)}" y="{_fx(y)}">{esc(sym)}</text></g>'
        )
    for t in direct:
        paths.setdefault(device_color(t["src"])[0], []).append(
            _curve(x_of(t["src"], t["src_block"], pic["in_slots"]), y0, x_of(t["dst"], t["dst_block"], pic["out_slots"]), y1)
        )
    bars, labels = _bars_svg(pic, left, width, total, y1, blocked, sym)
    return "".join([
        f'<svg class="jpm-move" width="100%" height="{height}" role="img" aria-label="{esc(str(card.get("op")))}: the whole movement">',
        f'<svg class="jpm-move-shapes" width="100%" height="100%" viewBox="0 0 {total} {height}" preserveAspectRatio="none">',
        '<g class="jpm-links">',
        *(f'<path class="jpm-link" stroke="{c}" d="{"".join(ds)}"></path>' for c, ds in paths.items()),
        *outs,
        "</g>",
        bars,
        "</svg>",
        f'<g class="jpm-labels">{labels}</g>',
        f'<g class="jpm-hubs">{"".join(nodes)}</g>',
        "</svg>",
    ])


def _bars_svg(pic: dict[str, Any], left: list[int], width: int, total: int, y1: float, blocked: bool, sym: str) -> tuple[str, str]:
    """Both bars of blocks for every device, compact: one path per fill colour for the whole
    picture, one path of block edges, and per bar one transparent rect carrying its title (the
    live view has a title per block). Returns the blocks (design units) and their labels (at
    percentages of the width)."""
    fills: dict[str, list[str]] = {}
    edges: list[str] = []
    hits: list[str] = []
    labels: list[str] = []
    for bar, y, where in ((pic["top"], 0.0, "holds"), (pic["bottom"], y1, "receives")):
        for i, slots in enumerate(bar):
            part = bool(y) and pic["partial"][i]
            w = (width - 6) / max(1, len(slots))
            x0 = left[i] + 3
            for b, origins in enumerate(slots):
                x = x0 + b * w
                devs = list(dict.fromkeys(o[0] for o in origins))
                many = len(devs) * 1.5 > w
                if not devs or many:
                    pieces = [(x, w, "jpm-slot-empty" if not devs else "jpm-slot-many")]
                else:
                    pieces = [(x + k * w / len(devs), w / len(devs), device_color(o)[0]) for k, o in enumerate(devs)]
                for px, pw, fill in pieces:
                    fills.setdefault(fill, []).append(f"M{_fx(px)},{_fx(y)}h{_fx(pw)}v{BAR_H}h-{_fx(pw)}z")
                if b:
                    edges.append(f"M{_fx(x)},{_fx(y)}v{BAR_H}")
                text = slot_text(origins, blocked, sym, part)
                if len(text) * 6 + 2 <= w:
                    panel = ' class="jpm-on-panel"' if not devs or many else ""
                    labels.append(
                        f'<text{panel} x="{_pct(x + w / 2, total)}" y="{_fx(y + BAR_H / 2)}" '
                        f'style="--need:{label_need(text, w, total)}px">{esc(text)}</text>'
                    )
            title = f"device {pic['columns'][i]} {where}: [" + " | ".join(slot_text(o, blocked, sym, part) for o in slots) + "]"
            hits.append(
                f'<rect class="jpm-hit" x="{_fx(x0)}" y="{_fx(y)}" width="{_fx(width - 6)}" height="{BAR_H}"><title>{esc(title)}</title></rect>'
            )
    out = [
        (f'<path class="{fill}"' if fill.startswith("jpm-") else f'<path fill="{fill}"') + f' d="{"".join(ds)}"></path>'
        for fill, ds in fills.items()
    ]
    if edges:
        out.append(f'<path class="jpm-slot-sep" d="{"".join(edges)}"></path>')
    return "".join(out + hits), "".join(labels)


def _heat_rgb(t: float) -> tuple[int, int, int]:
    x = max(0.0, min(1.0, t)) * (len(_HEAT_STOPS) - 1)
    i = min(len(_HEAT_STOPS) - 2, int(x))
    f = x - i
    a, b = _HEAT_STOPS[i], _HEAT_STOPS[i + 1]
    return tuple(int(round(a[c] + (b[c] - a[c]) * f)) for c in range(3))  # type: ignore[return-value]


def _heat_pixels(values: list, rows: int, cols: int, lo: float, hi: float) -> list[list[tuple[int, int, int]]]:
    """`_heat_rgb` of every cell at once (grey where a value is missing or NaN): the same colours,
    computed with NumPy because a card's heat maps have thousands of cells."""
    import numpy as np

    count = rows * cols
    cells = np.full(count, np.nan)
    known = [np.nan if v is None else float(v) for v in values[:count]]
    cells[: len(known)] = known
    missing = np.isnan(cells)
    t = (np.where(missing, lo, cells) - lo) / (hi - lo) if hi > lo else np.full(count, 0.5)
    stops = np.array(_HEAT_STOPS, dtype=float)
    x = np.clip(t, 0.0, 1.0) * (len(stops) - 1)
    i = np.minimum(len(stops) - 2, x.astype(int))
    f = (x - i)[:, None]
    rgb = np.round(stops[i] + (stops[i + 1] - stops[i]) * f).astype(int)
    rgb[missing] = 128
    return [[tuple(px) for px in row] for row in rgb.reshape(rows, cols, 3).tolist()]


def _fmt_num(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3):
        return f"{v:.1e}"
    return f"{round(v * 100) / 100:g}"


def _heat_img(heat: dict[str, Any], max_w: int) -> str:
    rows, cols = max(1, int(heat["rows"])), max(1, int(heat["cols"]))
    lo, hi = float(heat["min"]), float(heat["max"])
    pixels = _heat_pixels(list(heat.get("values") or []), rows, cols, lo, hi)
    sx, sy = max(1, min(12, int(max_w // cols))), max(1, min(12, 48 // rows))
    return (
        f'<div class="jpm-heat-wrap"><img class="jpm-heat jpm-pixels" src="{png_data_uri(pixels)}" width="{cols * sx}" '
        f'height="{rows * sy}" alt="heat map {rows}×{cols}, {esc(_fmt_num(lo))} to {esc(_fmt_num(hi))}">'
        f'<div class="jpm-heat-range">{esc(_fmt_num(lo))}…{esc(_fmt_num(hi))}</div></div>'
    )


def _groups_text(groups: list[list[int]]) -> str:
    if not groups:
        return ""
    if len(groups) == 1:
        return f"1 group of {len(groups[0])}"
    if len({len(g) for g in groups}) == 1:
        return f"{len(groups)} groups of {len(groups[0])}"
    return f"{len(groups)} groups"


def _proc_of(state: dict[str, Any]) -> Any:
    order = [int(d) for d in state.get("device_ids") or []]
    procs = state.get("device_process")
    multi = isinstance(procs, list) and len(set(procs)) > 1

    def proc_of(d: int) -> int | None:
        return int(procs[order.index(d)]) if multi and d in order and order.index(d) < len(procs) else None

    return proc_of


def _bytes_of(card: dict[str, Any], order: list[int], d: int) -> tuple[Any, Any]:
    b = card.get("bytes") or {}
    i = order.index(d) if d in order else -1

    def pick(xs: Any) -> Any:
        return xs[i] if isinstance(xs, list) and 0 <= i < len(xs) else None

    return pick(b.get("sent")), pick(b.get("received"))


def _stage_html(card: dict[str, Any], it: dict[str, Any], state: dict[str, Any]) -> str:
    pic = movement_model(card, 0)
    groups = pic["groups"]
    if not groups:
        return '<div class="jpm-note">no values recorded</div>'
    width, left, total = stage_geometry(groups)
    layout = stage_layout(groups)
    grid_col: list[int] = []
    for gi, g in enumerate(groups):
        first = len(grid_col) + gi + 2  # after the label column and one gap column per group before
        grid_col += range(first, first + len(g))
    # The stage keeps a readable minimum width; below it, it scrolls inside the card.
    out = [
        '<div class="jpm-stage-scroll"><div class="jpm-stage" style="'
        f'grid-template-columns:{layout["template"]};min-width:{layout["min_width"]}px;max-width:{layout["max_width"]}px">'
    ]
    row = 1
    if len(groups) > 1:
        i = 0
        for gi, g in enumerate(groups):
            out.append(
                f'<div class="jpm-group-label" style="grid-row:{row};grid-column:{grid_col[i]} / span {len(g)}">'
                f"group {gi}: {esc(format_ids(g, 4))}</div>"
            )
            i += len(g)
        row += 1
    proc_of = _proc_of(state)
    for r, when, key, shape in ((row, "before", "before", card.get("in_shape")), (row + 2, "after", "after", card.get("out_shape"))):
        tiles = {int(t["device"]): t for t in it.get(key) or []}
        if not tiles:
            continue
        out.append(f'<div class="jpm-row-label" style="grid-row:{r};grid-column:1">{when}</div>')
        for i, d in enumerate(pic["columns"]):
            t = tiles.get(d)
            if t is None:
                continue
            p = proc_of(d)
            detail = f"{when} on device {d}{'' if p is None else f' (process {p})'}: {shape or ''} = {t.get('text')}"
            body = _heat_img(t["heat"], width - 10) if t.get("heat") else f'<pre class="jpm-tile-val">{esc(str(t.get("text")))}</pre>'
            out.append(
                f'<div class="jpm-ctile" style="grid-row:{r};grid-column:{grid_col[i]}" title="{esc(detail)}">'
                f'<div class="jpm-tile-head" style="{swatch_style(d)}"><span>dev {d}</span>'
                + ("" if p is None else f"<span>p{p}</span>")
                + f"</div>{body}</div>"
            )
    if _moves(card):
        out.append(
            f'<div class="jpm-row-label" style="grid-row:{row + 1};grid-column:1">sends</div>'
            f'<div class="jpm-move-box" style="grid-row:{row + 1};grid-column:2 / -1">{_picture_svg(card, pic, width, left, total)}</div>'
        )
    b = card.get("bytes") or {}
    if isinstance(b.get("sent"), list) or isinstance(b.get("received"), list):
        order = [int(d) for d in state.get("device_ids") or []]
        star = "" if b.get("estimate") is False else "*"
        out.append(f'<div class="jpm-row-label" style="grid-row:{row + 3};grid-column:1">bytes{star}</div>')
        for i, d in enumerate(pic["columns"]):
            sent, received = _bytes_of(card, order, d)
            out.append(
                f'<div class="jpm-bytes" style="grid-row:{row + 3};grid-column:{grid_col[i]}">'
                f"<div>↑{esc(format_bytes(sent))}</div><div>↓{esc(format_bytes(received))}</div></div>"
            )
    out.append("</div></div>")
    return "".join(out)


def _moves(card: dict[str, Any]) -> bool:
    mv = card.get("movement") or {}
    return mv.get("kind") != "none" and bool(mv.get("transfers") or mv.get("steps"))


def shapes_text(card: dict[str, Any]) -> str:
    """``f32[4] → f32[8,4]``; the twin of ``shapesText``."""
    out = card.get("out_shape") or "?"
    return f"{card['in_shape']} → {out}" if card.get("in_shape") else f"→ {out}"


def _source_line(card: dict[str, Any]) -> str:
    line = card.get("line")
    where = f"line {line}: " if line is not None else ""
    return f"{where}{card.get('source') or ''}"


NO_BYTES = "no bytes move: every device computes this on its own"


def algorithm_name(kind: str | None) -> str:
    """How a movement kind moves its data (the twin of ``algorithmName``): only the all-reduce
    family runs as a ring."""
    return {"all-reduce": "ring algorithm", "all-gather": "ring algorithm", "reduce-scatter": "ring algorithm",
            "all-to-all": "pairwise exchange", "permute": "direct sends"}.get(str(kind), "")


def _kind(card: dict[str, Any]) -> str:
    return str((card.get("movement") or {}).get("kind") or "none")


def _compiled_text(b: dict[str, Any]) -> str:
    compiled = b.get("compiled")
    return "not known" if compiled is None else f"{format_bytes(compiled)} per device (its size, not what it sends)"


def _bytes_note(card: dict[str, Any]) -> str:
    """What the bytes figures are (the twin of ``bytesNote``): the estimate of what each device
    sends and receives, and the compiled collective's result buffer, which is not what it sends."""
    b = card.get("bytes") or {}
    if not (b.get("sent") or b.get("received")):
        return ""
    if _kind(card) == "none":
        return NO_BYTES
    how = algorithm_name(_kind(card)) or "the movement drawn"
    est = ("bytes sent ↑ and received ↓ per device" if b.get("estimate") is False
           else f"bytes* sent ↑ and received ↓ per device, estimated from the array sizes and the {how}")
    return f"{est}; the compiled collective's result buffer: {_compiled_text(b)}"


def steps_phrase(steps: list[dict[str, Any]]) -> str:
    """``reduce-scatter (7 steps) → all-gather (7 steps)``; the twin of ``stepsPhrase``."""
    runs: list[list[Any]] = []
    for s in steps:
        phase = str(s.get("label")).split(" step ")[0]
        if runs and runs[-1][0] == phase:
            runs[-1][1] += 1
        else:
            runs.append([phase, 1])
    return " → ".join(f"{p} ({n} step{'' if n == 1 else 's'})" for p, n in runs)


def _steps_summary(card: dict[str, Any]) -> str:
    steps = (card.get("movement") or {}).get("steps") or []
    return f"{algorithm_name(_kind(card)) or 'steps'}: {steps_phrase(steps)}" if steps else ""


def _card_html(card: dict[str, Any], state: dict[str, Any]) -> str:
    op = str(card.get("op"))
    head = f'<span class="jpm-op">{esc(op)}</span>'
    if card.get("value"):
        head += f'<span class="jpm-value">{esc(str(card["value"]))}</span>'
    if card.get("primitive") and card.get("primitive") != op:
        head += f'<span class="jpm-sub">({esc(str(card["primitive"]))})</span>'
    if card.get("in_shape") or card.get("out_shape"):
        head += chip("", shapes_text(card))
    if card.get("axes"):
        head += chip("over", ", ".join(str(a) for a in card["axes"]))
    groups = card.get("groups") or []
    if groups:
        head += f'<span class="jpm-sub">{esc(_groups_text(groups))}</span>'
    if (card.get("count") or 1) > 1:
        head += f'<span class="jpm-badge">ran {int(card["count"])}×</span>'
    if card.get("recorded") is False:
        head += '<span class="jpm-badge jpm-warn">not recorded</span>'
    out = [f'<div class="jpm-ccard"><div class="jpm-coll-head">{head}</div>']
    if card.get("source") or card.get("line") is not None:
        out.append(f'<div class="jpm-src">↳ {esc(_source_line(card))}</div>')
    if card.get("recorded") is False:
        why = card.get("why_not") or "the recorder does not support this collective"
        out.append(f'<div class="jpm-note">not recorded: {esc(str(why))}. It ran correctly; only its picture is missing.</div></div>')
        return "".join(out)
    kind = _kind(card)
    out.append(f'<div class="jpm-note jpm-move-note">{esc(kind)}: {esc(movement_sentence(kind))}</div>')
    its = card.get("iterations") or []
    for it in its:
        if len(its) > 1:
            out.append(f'<div class="jpm-h">{esc(str(it.get("label")))} iteration</div>')
        out.append(_stage_html(card, it, state))
    notes = []
    if card.get("devices_omitted"):
        notes.append(f"{int(card['devices_omitted'])} more devices not drawn")
    omitted_links = movement_model(card, 0)["links_omitted"] if its else 0
    if omitted_links:
        notes.append(f"{omitted_links} more transfers not drawn")
    if _bytes_note(card):
        notes.append(_bytes_note(card))
    if _steps_summary(card):
        notes.append(_steps_summary(card) + " (the live view steps through them)")
    out += [f'<div class="jpm-note">{esc(n)}</div>' for n in notes]
    out.append("</div>")
    return "".join(out)


def _cards(state: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    cards = list(state.get("cards") or [])
    shown = cards[:MAX_CARDS]
    return shown, int(state.get("omitted_cards") or 0) + len(cards) - len(shown)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a collectives state: each card's values and its whole movement as a still
    picture (no script; every string escaped)."""
    cards, omitted = _cards(state)
    chips = "".join(chip(str(a.get("name")), str(a.get("size"))) for a in state.get("axes") or [])
    out = [
        style_block(),
        '<div class="jpm-view jpm-collectives"><div class="jpm-head">'
        f'<span class="jpm-title jpm-mono">{esc(str(state.get("title") or "collectives"))}</span>'
        f'<span class="jpm-chips">{chips}</span>'
        f'<span class="jpm-sub">{len(cards)} collective call{"" if len(cards) == 1 else "s"}, in program order</span></div>',
    ]
    if not cards:
        out.append('<div class="jpm-note">none: the cell called no collective</div>')
    out.append('<div class="jpm-colls">')
    out += [_card_html(c, state) for c in cards]
    out.append("</div>")
    if omitted:
        out.append(f'<div class="jpm-note">… {omitted} more collective calls not shown</div>')
    out.append("</div>")
    return "".join(out)


def _indent(text: str, prefix: str) -> str:
    lines = str(text).splitlines() or [""]
    return "\n".join([lines[0]] + [prefix + line for line in lines[1:]])


def _one_line(text: Any, limit: int = 28) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _card_text(card: dict[str, Any], state: dict[str, Any]) -> list[str]:
    op = str(card.get("op"))
    head = f"[{card.get('index', '?')}] {op}" + (f" {card['value']}" if card.get("value") else "")
    if card.get("in_shape") or card.get("out_shape"):
        head += f"  {shapes_text(card)}"
    if card.get("axes"):
        head += f"  over {', '.join(str(a) for a in card['axes'])}"
    if card.get("groups"):
        head += f" · {_groups_text(card['groups'])}"
    if (card.get("count") or 1) > 1:
        head += f" · ran {int(card['count'])}×"
    lines = [head]
    if card.get("source") or card.get("line") is not None:
        lines.append(f"    at {_source_line(card)}")
    if card.get("recorded") is False:
        lines.append(f"    not recorded: {card.get('why_not') or 'the recorder does not support this collective'}")
        return lines
    kind = _kind(card)
    lines.append(f"    {kind}: {movement_sentence(kind)}")
    proc_of = _proc_of(state)
    its = card.get("iterations") or []
    pic = movement_model(card, 0) if its else None
    sym = reduce_symbol(op)
    blocked = picture_blocked(pic) if pic else False
    receives = {d: slots for d, slots in zip(pic["columns"], pic["bottom"])} if pic and pic["links"] else {}
    partial = dict(zip(pic["columns"], pic["partial"])) if pic else {}
    for it in its:
        if len(its) > 1:
            lines.append(f"    {it.get('label')} iteration:")
        before = {int(t["device"]): _one_line(t.get("text")) for t in it.get("before") or []}
        after = {int(t["device"]): _one_line(t.get("text")) for t in it.get("after") or []}
        order = pic["columns"] if pic else sorted(after)
        w_before = max([len("before")] + [len(v) for v in before.values()])
        w_after = max([len("after")] + [len(v) for v in after.values()])
        head = f"      {'dev':<5} " + (f"{'before':<{w_before}}  " if before else "") + f"{'after':<{w_after}}"
        legend = f"{sym}(…) combined; · nothing" + ("; … from devices not shown" if any(partial.values()) else "")
        lines.append(head + (f"  receives (device[:block]; {legend})" if receives else ""))
        for d in order:
            p = proc_of(d)
            who = f"{d}" + ("" if p is None else f" p{p}")
            row = f"      {who:<5} " + (f"{before.get(d, ''):<{w_before}}  " if before else "") + f"{after.get(d, ''):<{w_after}}"
            if d in receives:
                row += "  ← [" + " | ".join(slot_text(sl, blocked, sym, partial[d]) for sl in receives[d]) + "]"
            lines.append(row.rstrip())
    steps = _steps_summary(card)
    if steps:
        lines.append(f"    {steps}")
    b = card.get("bytes") or {}
    order = [int(d) for d in state.get("device_ids") or []]
    if pic is not None and kind == "none" and (b.get("sent") or b.get("received")):
        lines.append(f"    {NO_BYTES}")
    elif pic is not None and (b.get("sent") or b.get("received")):
        per = {(_bytes_of(card, order, d)) for d in pic["columns"]}
        star = "" if b.get("estimate") is False else f" (estimate, {algorithm_name(_kind(card)) or 'movement drawn'})"
        if len(per) == 1:
            sent, received = per.pop()
            lines.append(f"    bytes per device{star}: sent {format_bytes(sent)}, received {format_bytes(received)}")
        else:
            parts = []
            for d in pic["columns"]:
                sent, received = _bytes_of(card, order, d)
                parts.append(f"{d}: ↑{format_bytes(sent)} ↓{format_bytes(received)}")
            lines.append(f"    bytes{star}: " + ", ".join(parts))
        lines.append(f"    compiled collective's result buffer: {_compiled_text(b)}")
    if card.get("devices_omitted"):
        lines.append(f"    … {int(card['devices_omitted'])} more devices not shown")
    return lines


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a collectives state: values before and after, and who got what."""
    cards, omitted = _cards(state)
    dims = ", ".join(f"{a.get('name')}={a.get('size')}" for a in state.get("axes") or [])
    lines = [f"{state.get('title') or 'collectives'}" + (f"  ({dims})" if dims else "")]
    if not cards:
        lines.append("  none: the cell called no collective")
    for c in cards:
        lines += _card_text(c, state)
    if omitted:
        lines.append(f"… {omitted} more collective calls not shown")
    return "\n".join(lines)


class CollectivesView(ViewBase):
    """Collective cards: ``CollectivesView(state={...})`` with the CollectivesView state dict."""

    _esm = bundle_esm("collectives.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
