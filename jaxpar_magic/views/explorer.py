"""ExplorerView: the layout explorer (``js/explorer.js``), live over an Explorer
(stages/explore/explorer.py), with static HTML and 80-column text forms of the same state: the chosen
layout's plan and the table of tried layouts, ranked.

The live view sends the user's changes as messages (EXPLORER_CONTRACT.md: choose, reshape,
retarget, restore), handed to ``explorer.submit``; the explorer plans on its worker thread and
calls back with each new state, which is set here as the ``state`` trait (ipykernel sends a comm
message from any thread through its IOPub thread)."""

from __future__ import annotations

import uuid
from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_seconds

KINDS = ("choose", "reshape", "retarget", "restore")


def _fit(fits: Any) -> str:
    return "" if fits is None else ("fits" if fits else "DOES NOT FIT")


def _estimate(row: dict[str, Any]) -> str:
    s = row.get("estimate_s")
    return "" if s is None else format_seconds(s) + (f" ({row['bound']})" if row.get("bound") else "")


def _peak(p: dict[str, Any]) -> str:
    cap = p.get("capacity_bytes")
    return format_bytes(p.get("peak_bytes")) + (f" of {format_bytes(cap)}" if cap else "")


def _spec_words(spec: list) -> str:
    def one(axes):
        return "None" if not axes else f"'{axes[0]}'" if len(axes) == 1 else "(" + ",".join(f"'{a}'" for a in axes) + ")"
    return "P(" + ", ".join(one(a) for a in spec) + ")"


def _mesh_words(mesh: dict[str, Any]) -> str:
    return ",".join(f"{n}={s}" for n, s in mesh.get("axes") or []) + (
        f" ({'/'.join(dict.fromkeys(mesh.get('types') or []))})" if mesh.get("types") else "")


def to_text(state: dict[str, Any]) -> str:
    """The explorer in words: the chosen layout's plan, then every tried layout, best first."""
    mesh = state.get("mesh") or {}
    lines = [f"Layout explorer: {mesh.get('devices', '?')} devices, mesh {_mesh_words(mesh)}"]
    target = state.get("target")
    if target:
        lines.append(f"  target {target.get('hardware')}" + (f" {target['topology']}" if target.get("topology") else ""))
    status = state.get("status") or {}
    if status.get("busy"):
        lines.append(f"  {status.get('text')}")
    if state.get("message"):
        lines.append(f"  refused: {state['message']}")
    lines.append("Inputs:")
    for inp in state.get("inputs") or []:
        more = f" (+{inp['count'] - 1} more leaves like it)" if (inp.get("count") or 1) > 1 else ""
        shape = ", ".join(str(s) for s in inp.get("shape") or [])
        lines.append(f"  {inp.get('name')}: {inp.get('dtype')}[{shape}] {_spec_words(inp.get('spec') or [])}{more}")
    p = state.get("plan")
    if p:
        lines.append(f"Plan: {p.get('summary')}")
        if state.get("diff"):
            lines.append(f"  since the previous layout: {state['diff']}")
        for b in p.get("largest") or []:
            lines.append(f"  {format_bytes(b.get('bytes'))}: {b.get('what')}")
        for c in p.get("collectives") or []:
            lines.append(f"  {c.get('kind')} × {c.get('calls') or '?'}: {format_bytes(c.get('bytes'))} per step, "
                         f"{c.get('what')}")
    tried = state.get("tried") or []
    lines.append(f"Tried layouts ({len(tried)}), best first, each with its line (* the current one):")
    for row in tried:
        mark = "*" if row.get("current") else " "
        facts = [row.get("mesh") or "", f"peak {format_bytes(row.get('peak_bytes'))}", _fit(row.get("fits")),
                 f"moves {format_bytes(row.get('collective_bytes'))}", _estimate(row)]
        lines.append(f"{mark}{row.get('rank'):>2}. " + " · ".join(f for f in facts if f))
        lines.append(str(row.get("line")))  # whole, from the first column: copied from a terminal, it runs
    return "\n".join(lines)


def fit_keeping_lines(text: str, width: int) -> str:
    """`text` fitted to `width` columns, except the `%%shard` lines: a magic's line cannot be continued on
    another line, so each is kept whole (the terminal folds it; copied, it is one line again)."""
    from .textwidth import fit_text

    return "\n".join(line if line.startswith("%%shard ") else fit_text(line, width) for line in text.split("\n"))


def _plan_html(p: dict[str, Any], diff: str | None) -> str:
    fit = _fit(p.get("fits"))
    out = ['<div class="jpm-section"><div class="jpm-h">The chosen layout\'s plan</div>',
           f'<div class="jpm-mono">{esc(str(p.get("summary") or ""))}</div>',
           '<div class="jpm-report">' + chip("peak per device", _peak(p))
           + (chip(fit, cls="jpm-bad" if p.get("fits") is False else "") if fit else "")
           + (chip("estimate", format_seconds(p["estimate_s"])) if p.get("estimate_s") is not None else "")
           + (chip("bound by", str(p["bound"])) if p.get("bound") else "") + "</div>"]
    if diff:
        out.append(f'<div class="jpm-note">since the previous layout: {esc(diff)}</div>')
    rows = [(format_bytes(b.get("bytes")), str(b.get("what"))) for b in p.get("largest") or []]
    rows += [(format_bytes(c.get("bytes")), f"{c.get('kind')} × {c.get('calls') or '?'}: {c.get('what')}")
             for c in p.get("collectives") or []]
    if rows:
        out.append('<table class="jpm-table jpm-plan-table"><tbody>' + "".join(
            f'<tr><td class="jpm-num">{esc(a)}</td><td class="jpm-mono">{esc(b)}</td></tr>' for a, b in rows)
            + "</tbody></table>")
    out.append("</div>")
    return "".join(out)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML: the chosen layout's plan and the tried layouts, ranked (no script; escaped)."""
    mesh = state.get("mesh") or {}
    out = ['<div class="jpm-view jpm-explorer jpm-plan"><div class="jpm-head">'
           '<span class="jpm-title">Layout explorer</span>'
           + chip("devices", str(mesh.get("devices", "?"))) + chip("mesh", _mesh_words(mesh))
           + '<span class="jpm-badge">planned, not run</span></div>']
    if (state.get("status") or {}).get("busy"):
        out.append(f'<div class="jpm-note">{esc(str(state["status"].get("text")))}</div>')
    if state.get("message"):
        out.append(f'<div class="jpm-note jpm-bad">refused: {esc(str(state["message"]))}</div>')
    inputs = "".join(
        f'<tr><td class="jpm-mono">{esc(str(i.get("name")))}</td>'
        f'<td class="jpm-mono">{esc(str(i.get("dtype")))}[{esc(", ".join(str(s) for s in i.get("shape") or []))}]</td>'
        f'<td class="jpm-mono">{esc(_spec_words(i.get("spec") or []))}</td>'
        f'<td class="jpm-num">{esc(str(i.get("count") or 1))}</td></tr>' for i in state.get("inputs") or [])
    out.append('<div class="jpm-section"><div class="jpm-h">Inputs</div><table class="jpm-table jpm-plan-table">'
               '<thead><tr><th>input</th><th>shape</th><th>layout</th><th>leaves</th></tr></thead>'
               f"<tbody>{inputs}</tbody></table></div>")
    if state.get("plan"):
        out.append(_plan_html(state["plan"], state.get("diff")))
    tried = state.get("tried") or []
    body = "".join(
        ('<tr class="jpm-bad">' if r.get("fits") is False else "<tr>") +
        f'<td class="jpm-num">{"▶ " if r.get("current") else ""}{esc(str(r.get("rank")))}</td>'
        f'<td class="jpm-mono">{esc(str(r.get("mesh") or ""))}</td>'
        f'<td class="jpm-num">{esc(format_bytes(r.get("peak_bytes")))}</td><td>{esc(_fit(r.get("fits")))}</td>'
        f'<td class="jpm-num">{esc(format_bytes(r.get("collective_bytes")))}</td>'
        f'<td class="jpm-num">{esc(_estimate(r))}</td><td class="jpm-mono">{esc(str(r.get("line")))}</td></tr>'
        for r in tried)
    out.append(f'<div class="jpm-section"><div class="jpm-h">Tried layouts ({len(tried)}), best first</div>'
               '<div class="jpm-scroll"><table class="jpm-table jpm-plan-table"><thead><tr><th>rank</th><th>mesh</th>'
               '<th>peak</th><th>fit</th><th>collectives move</th><th>estimate</th><th>line</th></tr></thead>'
               f"<tbody>{body}</tbody></table></div></div></div>")
    return "".join(out)


class ExplorerView(ViewBase):
    """``ExplorerView(state=explorer.state(), explorer=explorer)``: drawn live, driving `explorer`.

    In a kernel its static twin (the text/html and text/plain output beside the widget) is kept as the
    explorer's record: each new layout, refusal or tried row updates it by its display id, so a notebook
    saved, reopened without a kernel or exported shows the tried layouts, not only the first one."""

    _esm = bundle_esm("explorer.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)

    def __init__(self, state: dict[str, Any] | None = None, explorer=None, **kwargs: Any) -> None:
        super().__init__(state=state if state is not None or explorer is None else explorer.state(), **kwargs)
        self.explorer = explorer
        self._twin_id: str | None = None  # the static twin's display id, once shown in a kernel
        self._twin_sent: dict[str, str] | None = None
        if explorer is not None:
            explorer.observe(self._show)
            self.on_msg(self._message)

    def to_text(self, width: int | None = None) -> str:
        from .textwidth import text_width

        return fit_keeping_lines(type(self)._render_text(self.state), width or text_width())

    def static_bundle(self) -> dict[str, str]:
        """The record (base.py's static twin): the state without the status line of a compile under way,
        which is stale once saved."""
        from .inline import inline_styles
        from .textwidth import text_width

        state = {**self.state, "status": {"busy": False, "text": ""}}
        return {"text/html": f'<div class="jpm-static jpm-twin-{self._jpm_twin}">{inline_styles(to_html(state))}</div>',
                "text/plain": fit_keeping_lines(to_text(state), text_width())}

    def _ipython_display_(self, **kwargs: Any) -> None:
        from IPython.display import display

        parts = self.display_parts()
        if len(parts) != 2:  # not in a kernel: one output, nothing to keep current
            return super()._ipython_display_(**kwargs)
        (twin, twin_meta), (widget, widget_meta) = parts
        self._twin_id, self._twin_sent = uuid.uuid4().hex, twin
        display(twin, metadata=twin_meta, raw=True, display_id=self._twin_id)
        display(widget, metadata=widget_meta, raw=True)

    def _show(self, state: dict[str, Any]) -> None:
        self.state = state
        if self._twin_id is None:
            return
        twin = self.static_bundle()
        if twin != self._twin_sent:  # a new layout, message or row (not the status line's seconds)
            from IPython.display import update_display

            self._twin_sent = twin
            update_display(twin, display_id=self._twin_id, raw=True)

    def _message(self, _widget, content: Any, _buffers=None) -> None:
        """A change from the page: planned on the explorer's worker; anything else is ignored."""
        if isinstance(content, dict) and content.get("kind") in KINDS:
            self.explorer.submit(content)
