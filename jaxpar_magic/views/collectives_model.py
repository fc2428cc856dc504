"""What a collective card shows, as data: the twins of js/collectives_model.js (a browser test
compares them). :func:`movement_model` says which device's block lands in which output block at
each step of the movement; :func:`stage_layout` lays a card's device columns out (they fit the width
of the output area they are given, and past a readable minimum the stage scrolls inside its card);
and the short texts both renderings write (a block's contents, the shapes, the algorithm, the bytes).
views/collectives.py draws them as static HTML and text; js/collectives.js as the live widget.
"""

from __future__ import annotations

import math
from typing import Any

from .base import format_bytes, format_ids

MAX_DEVICES_DRAWN = 16
MAX_LINKS = 256
#: Stage geometry in pixels; the same numbers as js/collectives_model.js. Columns and group gaps are
#: drawn at their design width when the card has room and shrink in proportion down to
#: ``MIN_COL_W`` a column (8 devices fit a 320 px output area); below that the stage scrolls inside
#: its card.
LABEL_W = 50
GROUP_GAP = 12
MIN_COL_W = 30

Slot = list[list[int]]


def reduce_symbol(op: str) -> str:
    """The sign a reduction is drawn with; the twin of ``reduceSymbol``."""
    return {"pmax": "max", "pmin": "min", "pmean": "mean"}.get(op, "Σ")


def movement_sentence(kind: str) -> str:
    """The twin of ``movementSentence`` in js/collectives_model.js."""
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

    The twin of ``movementModel`` in js/collectives_model.js (a browser test compares the two): bars of
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
        label = step_label(k, steps)
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


def step_label(k: int, steps: list[dict[str, Any]]) -> str:
    """``step 3 of 14: reduce-scatter step 3 of 7``; a step whose own label counts the same steps
    (a one-phase movement) is not counted twice: ``step 1 of 1: permute``. Twin of ``stepLabel``."""
    own = str(steps[k - 1].get("label"))
    same = f" step {k} of {len(steps)}"
    return f"step {k} of {len(steps)}: {own[: -len(same)] if own.endswith(same) else own}"


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
    """Whether any origin in a picture names a block other than 0; the twin of ``pictureBlocked``."""
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


def shapes_text(card: dict[str, Any]) -> str:
    """``f32[4] → f32[8,4]``; the twin of ``shapesText``."""
    out = card.get("out_shape") or "?"
    return f"{card['in_shape']} → {out}" if card.get("in_shape") else f"→ {out}"



NO_BYTES = "no bytes move: every device computes this on its own"


def algorithm_name(kind: str | None) -> str:
    """How a movement kind moves its data (the twin of ``algorithmName``): only the all-reduce
    family runs as a ring."""
    return {"all-reduce": "ring algorithm", "all-gather": "ring algorithm", "reduce-scatter": "ring algorithm",
            "all-to-all": "pairwise exchange", "permute": "direct sends"}.get(str(kind), "")


def movement_kind(card: dict[str, Any]) -> str:
    """The card's movement kind (``all-reduce``, ``permute``, ...; ``none`` when nothing moves)."""
    return str((card.get("movement") or {}).get("kind") or "none")


def compiled_text(b: dict[str, Any]) -> str:
    """The compiled collective's result buffer, as the bytes notes write it."""
    compiled = b.get("compiled")
    return "not known" if compiled is None else f"{format_bytes(compiled)} per device (its size, not what it sends)"


def bytes_note(card: dict[str, Any]) -> str:
    """What the bytes figures are (the twin of ``bytesNote``): the estimate of what each device
    sends and receives, and the compiled collective's result buffer, which is not what it sends."""
    b = card.get("bytes") or {}
    if not (b.get("sent") or b.get("received")):
        return ""
    if movement_kind(card) == "none":
        return NO_BYTES
    how = algorithm_name(movement_kind(card)) or "the movement drawn"
    est = ("bytes sent ↑ and received ↓ per device" if b.get("estimate") is False
           else f"bytes* sent ↑ and received ↓ per device, estimated from the array sizes and the {how}")
    return f"{est}; the compiled collective's result buffer: {compiled_text(b)}"


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
