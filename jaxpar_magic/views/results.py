"""ResultView: per-device values of a ``%%pmap`` cell and the collectives that ran
(``js/results.js``), with static HTML and text renderings of the same state."""

from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_coords, format_ids, format_ms, format_shape, format_si, op_words, swatch_style
from .values import PENDING_TEXT

GROUPS_MAX = 16
GROUP_CELLS_MAX = 64
PAIRS_MAX = 64
RUN_LABEL = "run (waited for its result)"  # --report waits for the result to time it; js/results.js says the same


def _swatch(device_id: int, detail: str, label: bool = True) -> str:
    if label:
        return f'<span class="jpm-swatch" style="{swatch_style(device_id)}" title="{esc(detail)}">{device_id}</span>'
    return f'<i style="{swatch_style(device_id)}" title="{esc(detail)}"></i>'


def _axes(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": str(a["name"]), "size": int(a["size"])} for a in state.get("axes") or []]


def _proc_of(state: dict[str, Any]) -> Any:
    """A device's process when the state spans several (optional ``device_process``, aligned with
    ``device_ids``), else None for every device."""
    procs = state.get("device_process")
    if not isinstance(procs, list) or len(set(procs)) <= 1:
        return lambda d: None
    pos = {int(d): k for k, d in enumerate(state.get("device_ids") or [])}
    return lambda d: int(procs[pos[d]]) if d in pos and pos[d] < len(procs) else None


def _proc_label(proc_of: Any, devices: list[int]) -> str:
    """``p1`` or ``p0,1``; the twin of ``procLabel`` in js/results.js."""
    procs = sorted({p for p in (proc_of(d) for d in devices) if p is not None})
    return f"p{format_ids(procs, 3)}" if procs else ""


def _report_items(report: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not report:
        return []
    items = []
    if report.get("compile_ms") is not None:
        items.append(("compile", format_ms(report["compile_ms"])))
    if report.get("run_ms") is not None:
        items.append((RUN_LABEL, format_ms(report["run_ms"])))
    if report.get("flops") is not None:
        items.append(("FLOPs per device", format_si(report["flops"])))
    if report.get("bytes_accessed") is not None:
        items.append(("bytes accessed per device", format_bytes(report["bytes_accessed"])))
    return items


def _waiting(output: dict[str, Any]) -> str:
    """What an output whose values are not shown says instead: they are on their way (views/values.py),
    or could not be read; "" once they are there. The twin of drawOutput's note in js/results.js."""
    if output.get("error"):
        return f"values unavailable: {output['error']}"
    return PENDING_TEXT if output.get("pending") else ""


def _pairs_summary(coll: dict[str, Any], order: list[int]) -> str:
    pairs = [p for p in coll.get("pairs") or [] if len(p) == 2]
    omitted = int(coll.get("pairs_omitted") or 0)
    n = len(pairs) + omitted
    sample = ", ".join(f"{s}→{d}" for s, d in pairs[:8]) + (", …" if len(pairs) > 8 or omitted else "")
    text = f"{n} pair{'' if n == 1 else 's'}: {sample}"
    pos = {d: k for k, d in enumerate(order)}
    shifts = {((pos[d] - pos[s]) % len(order)) if s in pos and d in pos else None for s, d in pairs}
    if len(shifts) == 1 and None not in shifts and not omitted:
        shift = shifts.pop()
        which = "next one" if shift == 1 else f"one {shift} places later"
        # "every device" and "(cyclic)" only when they hold: a pipeline's 0→4 … 3→7 is neither.
        who = "every device sends" if len(pairs) == len(order) else f"each of the {len(pairs)} senders sends"
        wraps = any(pos[d] < pos[s] for s, d in pairs)
        text += f" — {who} to the {which} in mesh order" + (" (cyclic)" if wraps else "")
    if omitted:
        text += f" ({omitted} pairs not shipped)"
    return text


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a result state (no script; every string escaped)."""
    axes = _axes(state)
    order = [int(d) for d in state.get("device_ids") or []]
    proc_of = _proc_of(state)
    chips = "".join(chip(a["name"], str(a["size"])) for a in axes)
    out = [
        '<div class="jpm-view jpm-results">',
        f'<div class="jpm-head"><span class="jpm-title jpm-mono">{esc(str(state.get("title") or "per-device results"))}</span>'
        f'<span class="jpm-chips">{chips}</span></div>',
    ]
    for o in state.get("outputs") or []:
        shape = format_shape(str(o.get("dtype")), o.get("shape") or [])
        out.append(
            '<div class="jpm-section jpm-output"><div class="jpm-out-head">'
            f'<span class="jpm-out-name">{esc(str(o.get("name")))}</span>{chip("per device", shape)}'
            + (chip("blocks of", format_shape(str(o.get("dtype")), o["global_shape"])) if o.get("global_shape") else "")
            + ('<span class="jpm-badge">same on all</span>' if o.get("same_on_all") else "")
            + "</div>"
        )
        tiles = o.get("tiles") or []
        waiting = _waiting(o)
        if waiting:
            out.append(f'<div class="jpm-note">{esc(waiting)}</div>')
        elif o.get("same_on_all") and tiles:
            t = tiles[0]
            strip = "".join(
                _swatch(d, f"device {d}" + ("" if proc_of(d) is None else f" (process {proc_of(d)})"), False)
                for d in t["devices"][:GROUP_CELLS_MAX]
            )
            label = o.get("same_text") or f"same on all {len(t['devices'])} devices"
            out.append(
                f'<div class="jpm-same"><div class="jpm-same-strip">{strip}</div><div class="jpm-same-value">'
                f'<div class="jpm-same-label">{esc(label)}</div><div class="jpm-tile-val">{esc(str(t["text"]))}</div></div></div>'
            )
        else:
            out.append('<div class="jpm-tiles">')
            for t in tiles:
                devs = [int(d) for d in t.get("devices") or [0]]
                where = format_coords(axes, t["coords"]) if t.get("coords") else ""
                who = f"dev {devs[0]}" if len(devs) == 1 else f"dev {format_ids(devs, 3)}"
                proc = _proc_label(proc_of, devs)
                out.append(
                    f'<div class="jpm-tile"><div class="jpm-tile-head" style="{swatch_style(devs[0])}">'
                    f"<span>{esc(who)}</span><span>{esc(where)}</span>"
                    + (f'<span class="jpm-proc">{esc(proc)}</span>' if proc else "")
                    + "</div>"
                    + (f'<div class="jpm-tile-slice">{esc(str(o.get("name")) + str(t["slice"]))}</div>' if t.get("slice") else "")
                    + f'<div class="jpm-tile-val">{esc(str(t["text"]))}</div></div>'
                )
            out.append("</div>")
        if o.get("omitted"):
            out.append(f'<div class="jpm-note">… {int(o["omitted"])} more devices not shown</div>')
        out.append("</div>")
    colls = state.get("collectives") or []
    out.append(f'<div class="jpm-section"><div class="jpm-h">Collectives ({len(colls)})</div>')
    if not colls:
        out.append('<div class="jpm-note">none: the compiled program moves no data between devices</div>')
    out.append('<div class="jpm-colls">')
    for c in colls:
        head = f'<span class="jpm-op">{esc(str(c.get("op")))}</span>'
        if c.get("reduction"):
            head += chip("combines by", str(c["reduction"]))
        if c.get("shape"):
            head += chip("", str(c["shape"]))
        if c.get("bytes") is not None:
            head += chip("result buffer", format_bytes(c["bytes"]))
        if c.get("groups_text"):
            head += f'<span class="jpm-sub">{esc(str(c["groups_text"]))}</span>'
        out.append(f'<div class="jpm-coll"><div class="jpm-coll-head">{head}</div>')
        if c.get("source_line"):
            out.append(f'<div class="jpm-src">↳ {esc(str(c["source_line"]))}</div>')
        if c.get("op") == "collective-permute":
            out.append(f'<div class="jpm-note">{esc(_pairs_summary(c, order))}</div><div class="jpm-groups">')
            for s, d in [p for p in c.get("pairs") or [] if len(p) == 2][:PAIRS_MAX]:
                out.append(f'<span class="jpm-group">{_swatch(s, f"device {s}")}→{_swatch(d, f"device {d}")}</span>')
            out.append("</div>")
        elif c.get("groups"):
            groups = c["groups"]
            big = len(groups) > GROUPS_MAX or any(len(g) > 16 for g in groups)
            out.append('<div class="jpm-groups">')
            for k, g in enumerate(groups[:GROUPS_MAX]):
                cells = "".join(_swatch(d, f"device {d} · group {k}", not big) for d in g[:GROUP_CELLS_MAX])
                more = f'<span class="jpm-more">+{len(g) - GROUP_CELLS_MAX}</span>' if len(g) > GROUP_CELLS_MAX else ""
                out.append(f'<div class="jpm-group" title="group {k}: {esc(format_ids(g, 12))}">{cells}{more}</div>')
            if len(groups) > GROUPS_MAX:
                out.append(f'<span class="jpm-more">… {len(groups) - GROUPS_MAX} more groups not drawn</span>')
            out.append("</div>")
        out.append("</div>")
    out.append("</div></div>")
    items = _report_items(state.get("report"))
    if items:
        out.append(
            '<div class="jpm-section"><div class="jpm-h">Cost</div><div class="jpm-report">'
            + "".join(chip(k, v) for k, v in items)
            + "</div></div>"
        )
    out.append("</div>")
    return "".join(out)


def _indent(text: str, prefix: str) -> str:
    lines = str(text).splitlines() or [""]
    return "\n".join([lines[0]] + [prefix + line for line in lines[1:]])


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a result state."""
    axes = _axes(state)
    order = [int(d) for d in state.get("device_ids") or []]
    proc_of = _proc_of(state)
    dims = ", ".join(f"{a['name']}={a['size']}" for a in axes)
    lines = [f"{state.get('title') or 'per-device results'}" + (f"  ({dims})" if dims else "")]
    for o in state.get("outputs") or []:
        whole = f" (blocks of {format_shape(str(o.get('dtype')), o['global_shape'])})" if o.get("global_shape") else ""
        lines.append(f"{o.get('name')}: {format_shape(str(o.get('dtype')), o.get('shape') or [])} per device{whole}")
        tiles = o.get("tiles") or []
        if _waiting(o):
            lines.append(f"  {_waiting(o)}")
        elif o.get("same_on_all") and tiles:
            label = o.get("same_text") or f"same on all {len(tiles[0]['devices'])} devices"
            prefix = f"  {label}: "
            lines.append(prefix + _indent(tiles[0]["text"], " " * len(prefix)))
        else:
            for t in tiles:
                devs = [int(d) for d in t.get("devices") or [0]]
                where = f" ({format_coords(axes, t['coords'])})" if t.get("coords") else ""
                proc = _proc_label(proc_of, devs)
                part = f" = {o.get('name')}{t['slice']}" if t.get("slice") else ""
                prefix = f"  dev {format_ids(devs, 3)}{where}{' ' + proc if proc else ''}{part}: "
                lines.append(prefix + _indent(t["text"], " " * len(prefix)))
        if o.get("omitted"):
            lines.append(f"  … {int(o['omitted'])} more devices not shown")
    colls = state.get("collectives") or []
    lines.append(f"Collectives ({len(colls)})" + (": none" if not colls else ":"))
    for c in colls:
        parts = [op_words(c)]
        if c.get("shape"):
            parts.append(str(c["shape"]))
        if c.get("bytes") is not None:
            parts.append(f"result buffer {format_bytes(c['bytes'])}")
        if c.get("groups_text"):
            parts.append(str(c["groups_text"]))
        lines.append("  " + " · ".join(parts))
        if c.get("source_line"):
            lines.append(f"    at {c['source_line']}")
        if c.get("op") == "collective-permute":
            lines.append("    " + _pairs_summary(c, order))
        elif c.get("groups"):
            groups = c["groups"]
            shown = " ".join("{" + format_ids(g, 4) + "}" for g in groups[:8])
            lines.append(f"    groups: {shown}" + (f" … +{len(groups) - 8}" if len(groups) > 8 else ""))
    items = _report_items(state.get("report"))
    if items:
        lines.append("Cost: " + " · ".join(f"{k} {v}" for k, v in items))
    return "\n".join(lines)


class ResultView(ViewBase):
    """Per-device results: ``ResultView(state={...})`` with the ResultView state dict."""

    _esm = bundle_esm("results.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
    _static_by_content = True  # a re-run's state before its values come is the last one's
