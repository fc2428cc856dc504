"""CollectivesView: one card per collective call of a ``%%pmap --collectives`` cell
(``js/collectives.js``), with static HTML and text renderings of the same state.

The static HTML draws each card's whole movement as one still SVG picture (the live widget adds
the step control). What both pictures show, and how both lay the cards out, comes from
views/collectives_model.py (the twin of js/collectives_model.js).
"""

from __future__ import annotations

import base64
from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_ids, png_data_uri, swatch_style
from .collectives_model import LABEL_W, NO_BYTES, algorithm_name, bytes_note, compiled_text, hubs, movement_kind, movement_model, movement_sentence, picture_blocked, reduce_symbol, shapes_text, slot_text, stage_geometry, steps_phrase
from .palette import device_color

MAX_CARDS = 64
#: Narrowest device column of a static stage with more than 8 devices (fewer always fit 320 px).
STATIC_MIN_COL_W = 34
#: Heights in pixels of a bar of blocks and of the curves between the bars (as js/collectives_draw.js).
BAR_H = 14
LINKS_H = 64
_HEAT_STOPS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]


def _fx(v: float) -> str:
    """A coordinate of a static picture: whole design pixels are fine at any scale it is shown at."""
    return f"{round(v)}"


def _curve(xa: float, ya: float, xb: float, yb: float) -> str:
    m = (ya + yb) / 2
    return f"M{_fx(xa)},{_fx(ya)} C{_fx(xa)},{_fx(m)} {_fx(xb)},{_fx(m)} {_fx(xb)},{_fx(yb)}"


#: Colours of the picture's own marks (an <img> reads no page styles): mid greys that read on light
#: and dark pages, and label text dark on a light halo, as on the device colours.
_INK = "#7a828c"
_PANEL = "#e6e8eb"
_MANY = "#c9ced4"
_FONT = "ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"


def _picture_svg(card: dict[str, Any], pic: dict[str, Any], width: int, left: list[int], total: int) -> str:
    """The movement as one self-contained SVG document (drawn as an <img>: a sanitizer keeps no
    <svg> in the page): the two bars of blocks, the curves (one path per source device's colour)
    and the combining nodes, in design units; the image scales with its column's width."""
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
        outs.append("".join(_curve(x, y + 7, x_of(t["dst"], t["dst_block"], pic["out_slots"]), y1) for t in dsts))
        tw = max(16, len(sym) * 7 + 8)
        nodes.append(
            f'<ellipse cx="{_fx(x)}" cy="{_fx(y)}" rx="{_fx(tw / 2)}" ry="8" fill="#ffffff" stroke="{_INK}" stroke-width="1.2"/>'
            f'<text x="{_fx(x)}" y="{_fx(y)}" font-size="11" fill="#111111" text-anchor="middle" '
            f'dominant-baseline="central">{esc(sym)}</text>'
        )
    for t in direct:
        paths.setdefault(device_color(t["src"])[0], []).append(
            _curve(x_of(t["src"], t["src_block"], pic["in_slots"]), y0, x_of(t["dst"], t["dst_block"], pic["out_slots"]), y1)
        )
    bars = _bars_svg(pic, left, width, y1, blocked, sym)
    doc = "".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {total} {height}" width="{total}" height="{height}" '
        f'font-family="{_FONT}" font-weight="600">',
        *(f'<path fill="none" stroke-width="1.6" stroke="{c}" d="{"".join(ds)}"/>' for c, ds in paths.items()),
        *(f'<path fill="none" stroke-width="1.2" stroke="{_INK}" d="{d}"/>' for d in outs),
        bars,
        *nodes,
        "</svg>",
    ])
    uri = "data:image/svg+xml;base64," + base64.b64encode(doc.encode("utf-8")).decode("ascii")
    return (f'<img class="jpm-move" src="{uri}" width="{total}" height="{height}" '
            f'alt="{esc(str(card.get("op")))}: {esc(pic["label"])}">')


def _bars_svg(pic: dict[str, Any], left: list[int], width: int, y1: float, blocked: bool, sym: str) -> str:
    """Both bars of blocks for every device: one path per fill colour, the block edges, and the
    labels that fit their block (dark text on a light halo)."""
    fills: dict[str, list[str]] = {}
    edges: list[str] = []
    labels: list[str] = []
    for bar, y in ((pic["top"], 0.0), (pic["bottom"], y1)):
        for i, slots in enumerate(bar):
            part = bool(y) and pic["partial"][i]
            w = (width - 6) / max(1, len(slots))
            x0 = left[i] + 3
            for b, origins in enumerate(slots):
                x = x0 + b * w
                devs = list(dict.fromkeys(o[0] for o in origins))
                many = len(devs) * 1.5 > w
                if not devs or many:
                    pieces = [(x, w, _PANEL if not devs else _MANY)]
                else:
                    pieces = [(x + k * w / len(devs), w / len(devs), device_color(o)[0]) for k, o in enumerate(devs)]
                for px, pw, fill in pieces:
                    fills.setdefault(fill, []).append(f"M{_fx(px)},{_fx(y)}h{_fx(pw)}v{BAR_H}h-{_fx(pw)}z")
                if b:
                    edges.append(f"M{_fx(x)},{_fx(y)}v{BAR_H}")
                text = slot_text(origins, blocked, sym, part)
                if len(text) * 6 + 2 <= w:
                    labels.append(f'<text x="{_fx(x + w / 2)}" y="{_fx(y + BAR_H / 2)}">{esc(text)}</text>')
    out = [f'<path fill="{fill}" d="{"".join(ds)}"/>' for fill, ds in fills.items()]
    if edges:
        out.append(f'<path fill="none" stroke="#ffffff" stroke-width="1" d="{"".join(edges)}"/>')
    if labels:
        out.append('<g font-size="9" fill="#111111" text-anchor="middle" dominant-baseline="central" '
                   'stroke="#ffffff" stroke-opacity="0.75" stroke-width="2.5" paint-order="stroke" '
                   f'stroke-linejoin="round">{"".join(labels)}</g>')
    return "".join(out)


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
    """The before / sends / after / bytes rows of one card as a table of equal device columns (a
    sanitizer keeps no grid template), the picture an image across them: at most its design width,
    narrower with the output area; past a readable minimum it scrolls inside the card."""
    pic = movement_model(card, 0)
    groups = pic["groups"]
    if not groups:
        return '<div class="jpm-note">no values recorded</div>'
    columns = pic["columns"]
    n = len(columns)
    width, _, _ = stage_geometry(groups)
    left = [i * width for i in range(n)]  # equal columns: group edges are marked, not spaced
    total = n * width
    first_of_group = {g[0] for g in groups[1:]}
    # Up to 8 devices the columns shrink with the output area (tiles wrap their text); more keep a
    # readable minimum and scroll inside the card, the last resort.
    least = f"min-width:{LABEL_W + n * STATIC_MIN_COL_W}px;" if n > 8 else ""
    out = [f'<div class="jpm-stage-scroll"><table class="jpm-stage" style="{least}'
           f'max-width:{LABEL_W + total}px"><colgroup><col style="width:{LABEL_W}px">'
           + "".join("<col>" for _ in columns) + "</colgroup>"]

    def cell(i: int, body: str, title: str = "", cls: str = "") -> str:
        """A device column's cell (a tile is the cell itself: one element less per tile)."""
        edge = ' style="border-left:2px solid #8888"' if columns[i] in first_of_group else ""
        tip = f' title="{esc(title)}"' if title else ""
        return f'<td{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}{edge}{tip}>{body}</td>'

    if len(groups) > 1:
        out.append('<tr><td class="jpm-row-label"></td>' + "".join(
            f'<td class="jpm-group-label" colspan="{len(g)}">group {gi}: {esc(format_ids(g, 4))}</td>'
            for gi, g in enumerate(groups)) + "</tr>")
    proc_of = _proc_of(state)

    def tiles_row(when: str, key: str, shape: Any) -> str:
        tiles = {int(t["device"]): t for t in it.get(key) or []}
        if not tiles:
            return ""
        row = [f'<tr><td class="jpm-row-label">{when}</td>']
        for i, d in enumerate(columns):
            t = tiles.get(d)
            if t is None:
                row.append(cell(i, ""))
                continue
            p = proc_of(d)
            body = _heat_img(t["heat"], width - 10) if t.get("heat") else f'<div class="jpm-tile-val">{esc(str(t.get("text")))}</div>'
            # The value is in the tile itself; only a heat map (or a long value) needs its text on hover.
            detail = f"{when} on device {d}: {shape or ''} = {t.get('text')}" if t.get("heat") else ""
            head = f"dev {d}" if p is None else f"<span>dev {d}</span><span>p{p}</span>"
            row.append(cell(i, f'<div class="jpm-tile-head" style="{swatch_style(d)}">{head}</div>{body}', detail,
                            "jpm-ctile"))
        return "".join(row) + "</tr>"

    out.append(tiles_row("before", "before", card.get("in_shape")))
    if _moves(card):
        out.append(f'<tr><td class="jpm-row-label">sends</td><td colspan="{n}" style="padding:0">'
                   f"{_picture_svg(card, pic, width, left, total)}</td></tr>")
    out.append(tiles_row("after", "after", card.get("out_shape")))
    b = card.get("bytes") or {}
    if isinstance(b.get("sent"), list) or isinstance(b.get("received"), list):
        order = [int(d) for d in state.get("device_ids") or []]
        star = "" if b.get("estimate") is False else "*"
        row = [f'<tr><td class="jpm-row-label" title="bytes each device sends (↑) and receives (↓)">bytes{star}</td>']
        for i, d in enumerate(columns):
            sent, received = _bytes_of(card, order, d)
            row.append(cell(i, f'<div class="jpm-bytes">↑{esc(format_bytes(sent))}<br>↓{esc(format_bytes(received))}</div>',
                            f"device {d} sends {format_bytes(sent)} and receives {format_bytes(received)}"))
        out.append("".join(row) + "</tr>")
    out.append("</table></div>")
    return "".join(out)


def _ring_steps_html(card: dict[str, Any]) -> str:
    """The ring's steps as small multiples, since a page has no step control: a row per step, a
    column per device, each cell what that device receives in the step (``Σ(0,7)``: the sum of
    devices 0 and 7's blocks so far) on the sender's colour, its block and sender in the title."""
    steps = (card.get("movement") or {}).get("steps") or []
    # The all-reduce's ring is what a reader cannot guess from the whole movement (its picture
    # draws every contribution into one node); the other collectives' pictures say it all.
    if not steps or not card.get("iterations") or movement_kind(card) != "all-reduce":
        return ""
    columns = movement_model(card, 0)["columns"]
    sym = reduce_symbol(str(card.get("op")))
    shown = _steps_shown(steps)
    rows = []
    phase = None
    previous: list | None = None
    folded = 0
    for k in range(1, len(steps) + 1):
        name, _, number = str(steps[k - 1].get("label")).partition(" step ")
        if name != phase:  # a row naming the phase, then its steps by number
            if folded:
                rows.append(f'<tr><th>…</th><td colspan="{len(columns)}">{folded} more step{"s" if folded > 1 else ""} '
                            "like the one above</td></tr>")
                folded = 0
            phase, previous = name, None
            rows.append(f'<tr><th colspan="{len(columns) + 1}">{esc(name)}</th></tr>')
        if k not in shown:
            if k - 1 in shown:
                rows.append(f'<tr><th>…</th><td colspan="{len(columns)}">steps {k}–{min(s for s in shown if s > k) - 1}'
                            " go on the same way</td></tr>")
            continue
        pic = movement_model(card, k)
        into = {t["dst"]: t for t in pic["links"]}
        texts = [(slot_text(pic["bottom"][i][into[d]["dst_block"]], False, sym, pic["partial"][i]), into[d]["src"])
                 if d in into else None for i, d in enumerate(columns)]
        if texts == previous:  # a step that changes nothing a reader sees here (the all-gather of sums)
            folded += 1
            continue
        if folded:
            rows.append(f'<tr><th>…</th><td colspan="{len(columns)}">{folded} more step{"s" if folded > 1 else ""} '
                        "like the one above</td></tr>")
            folded = 0
        previous = texts
        cells = "".join(f'<td style="{swatch_style(t[1])}">{esc(t[0])}</td>' if t else "<td></td>" for t in texts)
        rows.append(f"<tr><th>{esc(number or str(k))}</th>{cells}</tr>")
    if folded:
        rows.append(f'<tr><th>…</th><td colspan="{len(columns)}">{folded} more step{"s" if folded > 1 else ""} '
                    "like the one above</td></tr>")
    head = "<tr><th>step</th>" + "".join(f"<th>dev {d}</th>" for d in columns) + "</tr>"
    return (f'<div class="jpm-h">the {esc(algorithm_name(movement_kind(card)) or "steps")}, step by step: what each '
            "device receives, on the sender's colour</div>"
            f'<div class="jpm-stage-scroll"><table class="jpm-steps-table">{head}{"".join(rows)}</table></div>')


#: Steps of a phase listed in full up to this many; past it the first few and the last one.
STEPS_LISTED = 8


def _steps_shown(steps: list[dict[str, Any]]) -> set[int]:
    """Which steps (1-based) the static table lists: every step of a short phase; of a longer one
    (16 devices and more) its first three and its last."""
    shown: set[int] = set()
    k = 1
    while k <= len(steps):
        phase = str(steps[k - 1].get("label")).split(" step ")[0]
        end = k
        while end < len(steps) and str(steps[end].get("label")).split(" step ")[0] == phase:
            end += 1
        count = end - k + 1
        shown |= set(range(k, end + 1)) if count <= STEPS_LISTED else {k, k + 1, k + 2, end}
        k = end + 1
    return shown


def _moves(card: dict[str, Any]) -> bool:
    mv = card.get("movement") or {}
    return mv.get("kind") != "none" and bool(mv.get("transfers") or mv.get("steps"))


def _source_line(card: dict[str, Any]) -> str:
    line = card.get("line")
    where = f"line {line}: " if line is not None else ""
    return f"{where}{card.get('source') or ''}"


def _steps_summary(card: dict[str, Any]) -> str:
    steps = (card.get("movement") or {}).get("steps") or []
    return f"{algorithm_name(movement_kind(card)) or 'steps'}: {steps_phrase(steps)}" if steps else ""


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
    kind = movement_kind(card)
    out.append(f'<div class="jpm-note jpm-move-note">{esc(kind)}: {esc(movement_sentence(kind))}</div>')
    its = card.get("iterations") or []
    for it in its:
        if len(its) > 1:
            out.append(f'<div class="jpm-h">{esc(str(it.get("label")))} iteration</div>')
        out.append(_stage_html(card, it, state))
    out.append(_ring_steps_html(card))
    notes = []
    if card.get("devices_omitted"):
        notes.append(f"{int(card['devices_omitted'])} more devices not drawn")
    omitted_links = movement_model(card, 0)["links_omitted"] if its else 0
    if omitted_links:
        notes.append(f"{omitted_links} more transfers not drawn")
    if bytes_note(card):
        notes.append(bytes_note(card))
    if _steps_summary(card):
        notes.append(_steps_summary(card))
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
    kind = movement_kind(card)
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
        star = "" if b.get("estimate") is False else f" (estimate, {algorithm_name(movement_kind(card)) or 'movement drawn'})"
        if len(per) == 1:
            sent, received = per.pop()
            lines.append(f"    bytes per device{star}: sent {format_bytes(sent)}, received {format_bytes(received)}")
        else:
            parts = []
            for d in pic["columns"]:
                sent, received = _bytes_of(card, order, d)
                parts.append(f"{d}: ↑{format_bytes(sent)} ↓{format_bytes(received)}")
            lines.append(f"    bytes{star}: " + ", ".join(parts))
        lines.append(f"    compiled collective's result buffer: {compiled_text(b)}")
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


def _packed(transfers: list[dict[str, Any]]) -> list[list[int]]:
    return [[t["src"], t["src_block"], t["dst"], t["dst_block"], 1 if t.get("reduce") else 0] for t in transfers]


def wire_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as the widget receives it and a saved notebook stores it: each transfer packed as
    ``[src, src_block, dst, dst_block, reduce]`` (js/collectives.js's ``unpackCard`` undoes it), and
    no tile's first 64 values, which only the Python side reads (``fn.collectives()``, tests): the
    collectives chapter stored 160 KB of movement as objects."""

    def tiles(ts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in t.items() if k != "values"} for t in ts]

    def card(c: dict[str, Any]) -> dict[str, Any]:
        out = {**c, "iterations": [{**it, "before": tiles(it.get("before") or []), "after": tiles(it.get("after") or [])}
                                   for it in c.get("iterations") or []]}
        mv = c.get("movement")
        if mv:
            out["movement"] = {**mv, "packed": True, "transfers": _packed(mv.get("transfers") or []),
                               "steps": [{**st, "transfers": _packed(st.get("transfers") or [])} for st in mv.get("steps") or []]}
        return out

    return {**state, "cards": [card(c) for c in state["cards"]]} if state.get("cards") else state


class CollectivesView(ViewBase):
    """Collective cards: ``CollectivesView(state={...})`` with the CollectivesView state dict."""

    _esm = bundle_esm("collectives.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)

    def wire_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return wire_state(state)
