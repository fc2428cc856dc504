"""PlanView: what a planned (compiled, never run) cell would need per device (``js/plan.js``),
with static HTML and text renderings of the same state."""

from __future__ import annotations

import textwrap
from typing import Any

from .base import ViewBase, bundle_esm, chip, esc, format_bytes, format_ms, format_seconds, format_shape, format_si, format_spec, style_block
from .plan_collectives import collectives_html, collectives_text
from .plan_compare import caveats_html, compare_html, compare_text
from .memory import TEXT_WIDTH, section_html as memory_section_html, section_text as memory_section_text
from .textwidth import fit_line

NO_HARDWARE = (
    "no step-time estimate: give --hardware (tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, h100, a100, b200, "
    "or custom:flops=…,hbm=…,bw=…,memory=…)"
)


def memory_sentence(m: dict[str, Any]) -> str:
    """The twin of ``memorySentence`` in js/plan.js."""
    total = format_bytes(m.get("total"))
    cap = m.get("capacity")
    if cap is None:
        return f"{total} per device; device memory unknown (give --device-memory or --hardware to check the fit)"
    of = format_bytes(cap) + " of device memory" + (f" (from {m['capacity_source']})" if m.get("capacity_source") else "")
    if m.get("fits") is False:
        over = m.get("overshoot") or max(0, (m.get("total") or 0) - cap)
        return f"does not fit: {total} needs {format_bytes(over)} more than the {of}"
    pct = 100 * (m.get("total") or 0) / cap if cap > 0 else 0
    return f"fits: {total} is {pct:.{1 if pct < 10 else 0}f}% of the {of}"


SCRATCH = "temporaries and scratch"
COMPILE_WORDS = {"compiled": "compiled in", "reused": "reused an earlier plan's compile; lowered in",
                 "refused": "the compiler refused it after"}


def compile_words(state: dict[str, Any]) -> str:
    """What the time beside it measured: a compile, a kept compile's reuse, or a refusal (the twin of
    `compileWords` in js/plan.js)."""
    return COMPILE_WORDS.get(state.get("compiled") or "compiled", "compiled in")


def bar_parts(m: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(key, name, bytes) of the memory bar: arguments, outputs (less those reusing argument buffers),
    temporaries; where the compiler reports its own peak (XLA:TPU), the rest of that peak is one part,
    "temporaries and scratch" (the twin of `barParts` in js/plan.js)."""
    alias = m.get("alias") or 0
    arg, out = m.get("argument") or 0, max(0, (m.get("output") or 0) - alias)
    if m.get("reported_peak"):
        return [("argument", "arguments", arg), ("output", "outputs", out),
                ("temp", SCRATCH, max(0, (m.get("total") or 0) - arg - out))]
    return [("argument", "arguments", arg), ("output", "outputs", out), ("temp", "temporaries", m.get("temp") or 0)]


def _memory_html(m: dict[str, Any]) -> str:
    cap = m.get("capacity")
    total = m.get("total") or 0
    scale = max(1, total, cap or 0)
    bad = m.get("fits") is False
    spans, left = [], 0
    for key, name, v in bar_parts(m):
        spans.append(
            f'<span class="jpm-mem-{key}" style="left:{100 * left / scale:.3f}%;width:{100 * v / scale:.3f}%" '
            f'title="{esc(name)}: {esc(format_bytes(v))} per device"></span>'
        )
        left += v
    if cap is not None:
        if bad:
            over = max(0, total - cap)
            spans.append(
                f'<span class="jpm-mem-over" style="left:{100 * cap / scale:.3f}%;width:{100 * over / scale:.3f}%" '
                f'title="over the device memory by {esc(format_bytes(m.get("overshoot") or over))}"></span>'
            )
        src = f" ({m['capacity_source']})" if m.get("capacity_source") else ""
        spans.append(
            f'<span class="jpm-mem-cap" style="left:{100 * cap / scale:.3f}%" '
            f'title="device memory: {esc(format_bytes(cap) + src)}"></span>'
        )
    legend = "".join(
        f'<span><i class="jpm-mem-{key}"></i>{esc(name)} <b>{esc(format_bytes(v))}</b></span>' for key, name, v in bar_parts(m)
    )
    legend += f'<span>total <b>{esc(format_bytes(total))}</b></span>'
    if m.get("alias"):
        legend += f'<span class="jpm-sub">({esc(format_bytes(m["alias"]))} of outputs reuse argument buffers)</span>'
    fit_cls = "jpm-fit jpm-bad" if bad else "jpm-fit jpm-ok" if m.get("fits") is True else "jpm-fit"
    return (
        '<div class="jpm-section"><div class="jpm-h">Memory per device</div>'
        f'<div class="{"jpm-membar jpm-bad" if bad else "jpm-membar"}" role="img" aria-label="{esc(memory_sentence(m))}">'
        + "".join(spans)
        + f'</div><div class="jpm-mem-legend">{legend}</div><div class="{fit_cls}">{esc(memory_sentence(m))}</div>'
        + (f'<div class="jpm-note">{esc(str(m["note"]))}</div>' if m.get("note") else "")
        + "".join(f'<div class="jpm-note">{esc(str(n))}</div>' for n in m.get("notes") or [])
        + "</div>"
    )


def _rates_text(r: dict[str, Any], hw: dict[str, Any] | None) -> str:
    """`FLOPs ÷ 197 TFLOP/s (bf16 peak)`, or per class when matmuls run at several rates."""
    rates = r.get("rates") or []
    if not rates:
        return f"FLOPs ÷ {format_si(hw['peak_flops'])}FLOP/s" if hw else ""
    if len(rates) == 1:
        return f"FLOPs ÷ {format_si(rates[0]['flops_per_s'])}FLOP/s ({rates[0]['rate']})"
    return "FLOPs at " + ", ".join(f"{format_si(x['flops_per_s'])}FLOP/s for {100 * x['share']:.0f}% ({x['rate']})"
                                   for x in rates)


def _roof_rows(r: dict[str, Any], hw: dict[str, Any] | None) -> list[tuple[str, str, Any, str]]:
    """(key, name, seconds, how) per term. States without the collective split (older plans) keep
    one `collectives` row."""
    rows = [
        ("compute", "compute", r.get("compute_s"), _rates_text(r, hw)),
        ("memory", "memory", r.get("memory_s"), f"bytes accessed ÷ {format_si(hw['hbm_bandwidth'])}B/s" if hw else ""),
    ]
    if "ici_s" not in r:
        rows.append(("collectives", "collectives", r.get("collective_s"),
                     f"collective bytes × ring factor ÷ {format_si(hw['interconnect_bandwidth'])}B/s" if hw else ""))
        return rows
    labels = r.get("labels") or {}
    near, far = (hw or {}).get("fabric") or ["ICI", "DCN"]
    link = (hw or {}).get("link_bandwidth")
    rows.append(("ici", labels.get("ici", f"{near} collectives"), r.get("ici_s"),
                 f"rings per mesh axis, {format_si(link)}B/s per link each way" if link else "ring per mesh axis"))
    if r.get("dcn_s") or (hw or {}).get("dcn_bandwidth") and r.get("bound") == "dcn":
        rows.append(("dcn", labels.get("dcn", f"{far} collectives"), r.get("dcn_s"),
                     f"past the {'node' if near == 'NVLink' else 'pod'}: {format_si(hw.get('dcn_bandwidth'))}B/s per "
                     f"{'node' if near == 'NVLink' else 'host'}" if hw and hw.get("dcn_bandwidth") else ""))
    if r.get("latency_s"):
        rows.append(("latency", labels.get("latency", "collective latency"), r.get("latency_s"),
                     f"hops × {format_seconds(hw.get('hop_latency'))}" if hw and hw.get("hop_latency") else "per hop"))
    return rows


def roof_value(key: str, s: Any, r: dict[str, Any]) -> str:
    """A roofline row's time; a collectives row at 0 s beside a latency row says where its
    collectives' time went (each too small to be bandwidth-bound, so it is booked under latency).
    The twin of ``roofValue`` in js/plan.js."""
    latency_bound = key in ("ici", "dcn") and not s and r.get("latency_s")
    return format_seconds(s) + (" (latency-bound: see collective latency)" if latency_bound else "")


def estimate_sentence(r: dict[str, Any]) -> str:
    """`estimate 560 µs per step, bound by ICI collectives, if communication fully overlaps compute; 611 µs if
    none of it does`; with collectives the compiled schedule runs synchronously, the estimate adds them (the
    twin of `estimateSentence` in js/plan.js)."""
    bound = r.get("bound_text") or r.get("bound")
    if "serial_s" not in r:
        return f"estimate {format_seconds(r.get('estimate_s'))} per step, {bound}-bound (the largest of the three)"
    if r.get("exposed_s"):
        return (f"estimate {format_seconds(r.get('estimate_s'))} per step, bound by {bound}: the collectives the "
                f"compiled schedule overlaps hide behind compute, and {format_seconds(r['exposed_s'])} of synchronous "
                f"ones (exposed) add to it; {format_seconds(r.get('serial_s'))} if none overlaps")
    return (f"estimate {format_seconds(r.get('estimate_s'))} per step, bound by {bound}, if communication fully "
            f"overlaps compute (optimistic); {format_seconds(r.get('serial_s'))} if none of it does")


def no_estimate_sentence(state: dict[str, Any]) -> str:
    """Why a plan has no step time: a refused compile has no FLOPs; otherwise no profile was given (the twin
    of `noEstimateSentence` in js/plan.js)."""
    if state.get("compiled") == "refused":
        compiler = (state.get("compiler") or {}).get("name") or "the compiler"
        return (f"no step-time estimate: {compiler} refused to compile this step, so there are no FLOPs or bytes "
                f"accessed to time")
    return NO_HARDWARE


def _roofline_html(r: dict[str, Any], hw: dict[str, Any] | None, topology: dict[str, Any] | None = None) -> str:
    rows = _roof_rows(r, hw)
    top = max([float(s or 0) for _, _, s, _ in rows] + [1e-30])
    cells = []
    for key, name, s, how in rows:
        bound = r.get("bound") == key
        b = " jpm-bound" if bound else ""
        detail = f"{name}: {format_seconds(s)}" + (f" ({how})" if how else "") + (" — bounds the estimate" if bound else "")
        cells.append(  # a table row: a sanitizer keeps no grid template (views/inline.py)
            f'<tr><td class="jpm-roof-name{b}">{esc(name)}</td>'
            f'<td style="width:60%"><span class="jpm-roof-track" title="{esc(detail)}"><span class="jpm-roof-bar{b}" style="width:{100 * float(s or 0) / top:.3f}%"></span></span></td>'
            f'<td class="jpm-roof-val{b}">{esc(roof_value(key, s, r))}{"  ← bounds the estimate" if bound else ""}</td></tr>'
        )
    hw_name = f'<span class="jpm-mono"> · {esc(str(hw["name"]))}</span>' if hw else ""
    where = (f'<div class="jpm-note">topology: {esc(str(topology["text"]))}</div>'
             if topology and topology.get("text") else "")
    source = (
        f'<div class="jpm-note">profile: {esc(str(hw["name"]))} — {esc(str(hw["source"]))}</div>' if hw and hw.get("source") else ""
    )
    return (
        f'<div class="jpm-section"><div class="jpm-h">Step time, roofline{hw_name}</div>'
        f'<table class="jpm-roof">{"".join(cells)}</table>'
        f'<div class="jpm-estimate">{esc(estimate_sentence(r))}</div>{where}{source}</div>'
    )


#: Lists longer than these are folded (HTML: a closed <details>; text: the first few, then a count).
FOLD_OUTPUTS = 8
TEXT_OUTPUTS = 5


def _outputs_html(state: dict[str, Any]) -> str:
    outs = state.get("outputs") or []
    head = 'Outputs, bound as <span class="jpm-mono">jax.ShapeDtypeStruct</span>'
    if len(outs) > FOLD_OUTPUTS:  # a training step's new state: many arrays, folded
        out = [f'<details class="jpm-section"><summary class="jpm-h">{head} ({len(outs)})</summary>']
        close = "</details>"
    else:
        out = [f'<div class="jpm-section"><div class="jpm-h">{head}</div>']
        close = "</div>"
    if not outs:
        return out[0] + '<div class="jpm-note">none</div></div>'
    out.append('<table class="jpm-table jpm-plan-table"><thead><tr><th>name</th><th>shape</th><th>sharding</th></tr></thead><tbody>')
    for o in outs:
        spec = "—" if o.get("spec") is None else format_spec(o["spec"])
        out.append(
            f'<tr><td class="jpm-mono">{esc(str(o.get("name")))}</td>'
            f'<td class="jpm-mono">{esc(format_shape(str(o.get("dtype")), o.get("shape") or []))}</td>'
            f'<td class="jpm-mono">{esc(spec)}</td></tr>'
        )
    out.append("</tbody></table>" + close)
    return "".join(out)


def to_html(state: dict[str, Any]) -> str:
    """Static HTML of a plan state (no script; every string escaped)."""
    if state.get("kind") == "compare":
        return compare_html(state)
    chips = "".join(chip(str(a.get("name")), str(a.get("size"))) for a in state.get("axes") or [])
    n = state.get("total_devices")
    head = (
        f'<span class="jpm-title jpm-mono">{esc(str(state.get("title") or "plan"))}</span><span class="jpm-chips">{chips}</span>'
        + (f'<span class="jpm-sub">{int(n)} device{"" if n == 1 else "s"}</span>' if n else "")
        + '<span class="jpm-badge">planned, not run</span>'
        + (chip(compile_words(state), format_ms(state["compile_ms"])) if state.get("compile_ms") is not None else "")
    )
    out = [style_block(), f'<div class="jpm-view jpm-plan"><div class="jpm-head">{head}</div>']
    if state.get("compiler"):
        c = state["compiler"]
        out.append(f'<div class="jpm-compiler"><b>{esc(str(c.get("text")))}</b></div>')
    if state.get("memory"):
        out.append(_memory_html(state["memory"]))
    if state.get("peak"):
        out.append(memory_section_html(memory_state(state)))
    cost = state.get("cost") or {}
    out.append(
        '<div class="jpm-section jpm-report">'
        + chip("FLOPs per device", format_si(cost.get("flops")))
        + chip("bytes accessed per device", format_bytes(cost.get("bytes_accessed")))
        + "</div>"
    )
    if state.get("roofline"):
        out.append(_roofline_html(state["roofline"], state.get("hardware"), state.get("topology")))
    else:
        out.append(f'<div class="jpm-note">{esc(no_estimate_sentence(state))}</div>')
    out.append(collectives_html(state))
    out.append(_outputs_html(state))
    if state.get("left_alone"):
        out.append(f'<div class="jpm-note jpm-left-alone">{esc(left_alone_sentence(state["left_alone"]))}</div>')
    out.append(caveats_html(state.get("caveats") or []))
    out.append("</div>")
    return "".join(out)


def memory_state(state: dict[str, Any]) -> dict[str, Any]:
    """The memory view's state inside a plan's (views/memory.py)."""
    return {"compiler": (state.get("compiler") or {}).get("name") or "XLA:CPU",
            "capacity": (state.get("memory") or {}).get("capacity"), "peak": state.get("peak")}


def left_alone_sentence(names: list) -> str:
    """The twin of `leftAloneSentence` in js/plan.js."""
    listed = ", ".join(str(n) for n in names)
    first = str(names[0])
    return (f"Not bound, because they hold concrete values a plan must not replace: {listed}. Their planned "
            f"versions are on the plan: `_plan.abstract[{first!r}]`.")


def memory_ascii(m: dict[str, Any], width: int = 48) -> str:
    """The memory bar for a terminal: ``#`` arguments, ``=`` outputs, ``~`` temporaries,
    ``|`` the device memory, ``!`` what does not fit."""
    cap = m.get("capacity")
    total = m.get("total") or 0
    scale = max(1, total, cap or 0)
    cells = []
    for sym, (_, _, own) in zip("#=~", bar_parts(m)):
        cells += [sym] * round(width * own / scale)
    cells = (cells + [" "] * width)[:width]
    if cap is not None:
        at = min(width - 1, round(width * cap / scale))
        if m.get("fits") is False:
            cells[at:] = ["!"] * (width - at)
        cells[at] = "|"
    return "[" + "".join(cells) + "]"


def to_text(state: dict[str, Any]) -> str:
    """A terminal rendering of a plan state."""
    if state.get("kind") == "compare":
        return compare_text(state)
    lines = [str(state.get("title") or "plan")]
    if state.get("compiler"):
        lines.append("  " + str(state["compiler"].get("text")))
    facts = []
    if state.get("total_devices"):
        facts.append(f"{state['total_devices']} devices")
    dims = " × ".join(f"{a.get('name')}={a.get('size')}" for a in state.get("axes") or [])
    if dims:
        facts.append(dims)
    facts.append("planned, not run")
    if state.get("compile_ms") is not None:
        facts.append(f"{compile_words(state)} {format_ms(state['compile_ms'])}")
    lines.append("  " + " · ".join(facts))
    m = state.get("memory")
    if m:
        parts = " + ".join(f"{name} {format_bytes(v)}" for _, name, v in bar_parts(m))
        lines.append(f"Memory per device: {parts} = {format_bytes(m.get('total'))}")
        lines.append(f"  {memory_ascii(m)}  # arguments, = outputs, ~ temporaries, | device memory")
        verdict = memory_sentence(m)
        if m.get("fits") is False:  # shouted: the one line a reader must not miss
            verdict = "DOES NOT FIT" + verdict[len("does not fit") :]
        lines.append("  " + verdict)
        for note in ([m["note"]] if m.get("note") else []) + list(m.get("notes") or []):
            # wrapped, never cut: the text is read at 80 columns
            lines += textwrap.wrap(str(note), TEXT_WIDTH, initial_indent="  ", subsequent_indent="    ")
    if state.get("peak"):
        lines += memory_section_text(memory_state(state))
    cost = state.get("cost") or {}
    lines.append(f"Per device: FLOPs {format_si(cost.get('flops'))} · bytes accessed {format_bytes(cost.get('bytes_accessed'))}")
    r = state.get("roofline")
    if r:
        hw = state.get("hardware")
        profile = f" ({hw['name']})" if hw else ""
        topo = state.get("topology") or {}
        lines.append(f"Step time, roofline{profile}:" + (f" {topo['text']}" if topo.get("text") else ""))
        for key, name, s, how in _roof_rows(r, hw):
            mark = "  ← bounds the estimate" if r.get("bound") == key else ""
            said = roof_value(key, s, r)
            lines.append(f"  {name:<19}{format_seconds(s):>9}  {how}{said[len(format_seconds(s)):]}{mark}")
        lines.append("  " + estimate_sentence(r))
        if hw and hw.get("source"):
            lines.append(f"  profile source: {hw['source']}")
    else:
        lines.append(no_estimate_sentence(state))
    lines += collectives_text(state)
    outs = state.get("outputs") or []
    if outs:
        lines.append(f"Outputs, bound as jax.ShapeDtypeStruct ({len(outs)}):")
        shown = outs if len(outs) <= FOLD_OUTPUTS else outs[:TEXT_OUTPUTS]
        for o in shown:
            spec = "" if o.get("spec") is None else f" {format_spec(o['spec'])}"
            lines.append(f"  {o.get('name')}: {format_shape(str(o.get('dtype')), o.get('shape') or [])}{spec}")
        if len(shown) < len(outs):
            lines.append(f"  … and {len(outs) - len(shown)} more (`%sharding NAME` shows one)")
    if state.get("left_alone"):
        lines.append(left_alone_sentence(state["left_alone"]))
    caveats = state.get("caveats") or []
    if caveats:
        lines.append("How far to trust these figures:")
        lines += [piece for c in caveats for piece in fit_line(f"  - {c}", TEXT_WIDTH)]  # wrapped, never cut
    return "\n".join(lines)


class PlanView(ViewBase):
    """A plan: ``PlanView(state={...})`` with the PlanView state dict."""

    _esm = bundle_esm("plan.js")
    _render_html = staticmethod(to_html)
    _render_text = staticmethod(to_text)
