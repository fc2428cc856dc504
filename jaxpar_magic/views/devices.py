"""DevicesView: the devices JAX sees (``js/devices.js``), with static HTML and text renderings
of the same state."""

from __future__ import annotations

from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_ids, swatch_style


def describe(d: dict[str, Any]) -> str:
    """One line per device; the twin of ``describe`` in ``js/devices.js``."""
    parts = [f"device {d['id']}", str(d.get("platform"))]
    if d.get("kind") != d.get("platform"):
        parts.append(str(d.get("kind")))
    parts.append(f"process {d.get('process')}")
    if d.get("coords"):
        parts.append(f"coords [{', '.join(str(c) for c in d['coords'])}]")
    if d.get("core") is not None:
        parts.append(f"core {d['core']}")
    if d.get("mem_used") is not None:
        limit = f" of {format_bytes(d['mem_limit'])}" if d.get("mem_limit") else ""
        parts.append(f"memory {format_bytes(d['mem_used'])}{limit}")
    return " · ".join(parts)


def host_text(state: dict[str, Any], process: Any) -> str:
    """Where a process runs, from the optional top-level ``hosts`` ({process: {host, pid}}):
    ``host node-a · pid 1234``, or "" when the state does not say; the twin of ``hostText``."""
    hosts = state.get("hosts") or {}
    at = hosts.get(str(process), hosts.get(process)) if isinstance(hosts, dict) else None
    if not at:
        return ""
    parts = []
    if at.get("host") is not None:
        parts.append(f"host {at['host']}")
    if at.get("pid") is not None:
        parts.append(f"pid {at['pid']}")
    return " · ".join(parts)


def _summary(state: dict[str, Any]) -> str:
    devices = state.get("devices") or []
    total = state.get("total", len(devices))
    platforms = [p for p, n in (state.get("counts") or {}).items() if n]
    kind = f"{platforms[0]} " if len(platforms) == 1 else ""
    procs = state.get("processes") or []
    extra = f" · {len(procs)} processes" if len(procs) > 1 else ""
    if len(procs) == 1 and host_text(state, procs[0]["process"]):
        extra = f" · {host_text(state, procs[0]['process'])}"
    return f"{total} {kind}device{'' if total == 1 else 's'} · backend {state.get('backend', '?')}{extra}"


def _groups(state: dict[str, Any]) -> list[tuple[dict[str, Any] | None, list[dict[str, Any]]]]:
    devices = state.get("devices") or []
    procs = state.get("processes") or []
    if len(procs) <= 1:
        return [(None, devices)]
    return [(p, [d for d in devices if d.get("process") == p["process"]]) for p in procs]


#: Past this many devices whose cards would show only their name, the cards shrink to chips even
#: when they name their process.
COMPACT_AFTER = 16


def compact_cards(mine: list[dict[str, Any]], kinds: int, processes: int = 1) -> bool:
    """Whether a group's cards are drawn as small chips: none says more than its name (so eight
    simulated devices stand in one row, and several to a row in a 320 px output area); cards that
    also name their process only past ``COMPACT_AFTER``. The twin of ``compactCards``."""
    name_only = kinds <= 1 and all(not d.get("coords") and d.get("core") is None and d.get("mem_used") is None
                                   for d in mine)
    return name_only and (processes <= 1 or len(mine) > COMPACT_AFTER)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a devices state (no script; every string escaped)."""
    devices = state.get("devices") or []
    total = state.get("total", len(devices))
    kinds = sorted({str(d.get("kind")) for d in devices})
    out = [
        '<div class="jpm-view jpm-devices"><div class="jpm-head"><span class="jpm-title">Devices</span>'
        f'<span class="jpm-sub">{esc(_summary(state))}</span>'
        + ('<span class="jpm-badge">simulated</span>' if state.get("simulated") else "")
        + "</div>",
        '<div class="jpm-chips">'
        + "".join(chip(str(p), str(n), cls="" if n else "jpm-zero") for p, n in (state.get("counts") or {}).items())
        + (f'<span class="jpm-sub">kind </span><span class="jpm-mono">{esc(kinds[0])}</span>' if len(kinds) == 1 else "")
        + "</div>",
    ]
    multi = len(state.get("processes") or []) > 1
    for proc, mine in _groups(state):
        out.append('<div class="jpm-section">')
        where = host_text(state, proc["process"]) if proc is not None else ""
        if proc is not None:
            listed = f" ({len(mine)} listed)" if len(mine) < proc["count"] else ""
            s = "" if proc["count"] == 1 else "s"
            at = f'<span class="jpm-mono"> · {esc(where)}</span>' if where else ""
            out.append(f'<div class="jpm-h">process {esc(str(proc["process"]))} · {proc["count"]} device{s}{listed}{at}</div>')
        compact = compact_cards(mine, len(kinds), len(state.get("processes") or []))
        out.append('<div class="jpm-cards jpm-compact">' if compact else '<div class="jpm-cards">')
        for d in mine:
            rows = [str(d.get("kind"))] if len(kinds) > 1 else []
            place = []
            if d.get("coords"):
                place.append(f"({', '.join(str(c) for c in d['coords'])})")
            if d.get("core") is not None:
                place.append(f"core {d['core']}")
            if place:
                rows.append(" · ".join(place))
            bar = ""
            if d.get("mem_used") is not None:
                used, limit = d["mem_used"], d.get("mem_limit")
                rows.append(f"{format_bytes(used)} / {format_bytes(limit)}" if limit else f"{format_bytes(used)} used")
                if limit:
                    pct = max(0.0, min(100.0, 100 * used / limit))
                    bar = f'<div class="jpm-bar"><span style="width:{pct:.1f}%"></span></div>'
            body = "".join(f'<div class="jpm-line">{esc(v)}</div>' for v in rows)
            proc = f"<span>p{esc(str(d.get('process')))}</span>" if multi else ""
            title = describe(d) + (f" · {where}" if where else "")
            out.append(
                f'<div class="jpm-card" title="{esc(title)}"><div class="jpm-card-head" style="{swatch_style(d["id"])}">'
                f"<span>{esc(str(d.get('platform')))}:{int(d['id'])}</span>{proc}</div>"
                + (f'<div class="jpm-card-body">{body}{bar}</div>' if body or bar else "")
                + "</div>"
            )
        out.append("</div></div>")
    if state.get("omitted"):
        out.append(
            f'<div class="jpm-note">… {int(state["omitted"])} more devices not listed ({len(devices)} of {total} shown)</div>'
        )
    out.append("</div>")
    return "".join(out)


#: Past this many lines for one process, the text keeps the first ones and counts the rest.
TEXT_LINES_MAX = 16


def _runs(mine: list[dict[str, Any]]) -> list[str]:
    """One line per run of consecutive devices that differ only in their id ("devices 0–63 · cpu ·
    process 0"), so 64 simulated devices take one line, not 64; devices with coordinates, cores
    or memory figures stay one line each."""
    lines: list[str] = []
    run: list[int] = []
    rest = ""

    def flush() -> None:
        if run:
            lines.append(("device " if len(run) == 1 else "devices ") + format_ids(run, limit=4) + rest)

    for d in mine:
        own = describe(d)[len(f"device {d['id']}"):]
        if run and own == rest and int(d["id"]) == run[-1] + 1:
            run.append(int(d["id"]))
            continue
        flush()
        run, rest = [int(d["id"])], own
    flush()
    if len(lines) > TEXT_LINES_MAX:
        hidden = len(lines) - (TEXT_LINES_MAX - 1)
        lines = lines[: TEXT_LINES_MAX - 1] + [f"… {hidden} more lines like these"]
    return lines


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a devices state."""
    devices = state.get("devices") or []
    total = state.get("total", len(devices))
    head = "Devices: " + _summary(state) + (" [simulated]" if state.get("simulated") else "")
    counts = "  ".join(f"{p}: {n}" for p, n in (state.get("counts") or {}).items())
    lines = [head, counts]
    for proc, mine in _groups(state):
        if proc is not None:
            where = host_text(state, proc["process"])
            lines.append(f"process {proc['process']} ({proc['count']} devices)" + (f" · {where}" if where else ""))
        lines += ["  " + line for line in _runs(mine)]
    if state.get("omitted"):
        lines.append(f"  … {int(state['omitted'])} more devices not listed ({len(devices)} of {total} shown)")
    return "\n".join(lines)


class DevicesView(ViewBase):
    """The devices JAX sees: ``DevicesView(state={...})`` with the DevicesView state dict."""

    _esm = bundle_esm("devices.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
