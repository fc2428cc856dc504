"""PlanView without a browser: static HTML (escaped, bounded, no script, red when it does not
fit), text, the mime bundle, and the formatting twins. In Chromium: tests/browser/test_views_new_js.py."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from html_tags import parse

from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views.textwidth import fit_text, text_width
from jaxpar_magic.views import PlanView, base, plan
from sample_states import plan_state

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ALLOWED_TAGS = {"div", "span", "b", "i", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "details",
                "summary"}
GIB = 2**30


def body(page: str) -> str:
    """The HTML after the stylesheet (which names every class)."""
    return page.split("</style>", 1)[-1]


def hostile_state() -> dict[str, Any]:
    state = plan_state(fits=False)
    state["title"] = HOSTILE
    state["axes"][0]["name"] = HOSTILE
    state["hardware"]["name"] = HOSTILE
    state["hardware"]["source"] = HOSTILE
    state["memory"]["capacity_source"] = HOSTILE
    for c in state["collectives"]:
        c.update(op=HOSTILE, shape=HOSTILE, groups_text=HOSTILE, source=HOSTILE)
    state["outputs"][1].update(name=HOSTILE, dtype=HOSTILE, spec=[HOSTILE, [HOSTILE, "x"]])
    state["caveats"].append(HOSTILE)
    state["roofline"]["bound"] = HOSTILE
    return state


def test_to_html_escapes_hostile_strings() -> None:
    out = plan.to_html(hostile_state())
    assert "<img" not in out
    assert html.escape(HOSTILE) in out
    parsed = parse(out)
    assert set(parsed.tags) <= ALLOWED_TAGS
    assert not [a for a in parsed.attrs if a.startswith("on")]
    assert HOSTILE in plan.to_text(hostile_state())


def test_fits_and_does_not_fit() -> None:
    fits = body(plan.to_html(plan_state()))
    assert 'class="jpm-membar"' in fits and ' jpm-bad"' not in fits
    assert "fits: 768.0 MiB is 4.7% of the 16.0 GiB of device memory (from tpu-v5e profile)" in fits
    state = plan_state(fits=False)
    assert state["memory"]["overshoot"] == 256 * 2**20
    red = body(plan.to_html(state))
    assert 'class="jpm-membar jpm-bad"' in red and 'class="jpm-fit jpm-bad"' in red
    assert "does not fit: 768.0 MiB needs 256.0 MiB more than the 512.0 MiB of device memory" in red
    # The bar: three parts stacked, the capacity mark at 512/768 of the width, the overshoot after it.
    assert 'class="jpm-mem-argument" style="left:0.000%;width:16.667%"' in red
    assert 'class="jpm-mem-output" style="left:16.667%;width:16.667%"' in red
    assert 'class="jpm-mem-temp" style="left:33.333%;width:66.667%"' in red
    assert 'class="jpm-mem-cap" style="left:66.667%"' in red
    assert 'class="jpm-mem-over" style="left:66.667%;width:33.333%"' in red
    unknown = plan_state()
    unknown["memory"].update(capacity=None, capacity_source=None, fits=None)
    text = plan.to_text(unknown)
    assert "device memory unknown (give --device-memory or --hardware to check the fit)" in text
    assert "|" not in plan.memory_ascii(unknown["memory"])


def test_aliased_outputs_take_no_room_of_their_own() -> None:
    state = plan_state()
    m = state["memory"]
    m["alias"] = 64 * 2**20
    m["total"] = m["argument"] + m["output"] + m["temp"] - m["alias"]  # 704 MiB
    m["capacity"] = 704 * 2**20
    page = body(plan.to_html(state))
    # The stacked parts end exactly at the total: 128 + 64 + 512 of 704 MiB.
    assert 'class="jpm-mem-temp" style="left:27.273%;width:72.727%"' in page
    assert "(64.0 MiB of outputs reuse argument buffers)" in page
    assert "fits: 704.0 MiB is 100% of the 704.0 MiB of device memory" in page
    assert plan.memory_ascii(m).count("!") == 0


def test_roofline_and_no_hardware() -> None:
    state = plan_state()
    r = state["roofline"]
    assert r["bound"] == "compute" and r["estimate_s"] == r["compute_s"]
    out = plan.to_html(state)
    assert '<td class="jpm-roof-name jpm-bound">compute</td>' in out
    assert "6.09 ms  ← bounds the estimate" in out
    assert "estimate 6.09 ms per step, compute-bound (the largest of the three)" in out  # a state from before the split
    assert "FLOPs ÷ 197.00 TFLOP/s" in out and "bytes accessed ÷ 819.00 GB/s" in out
    bare = plan_state(hardware=False)
    out = body(plan.to_html(bare))
    assert "jpm-roof" not in out and "no step-time estimate: give --hardware" in out
    assert "<th>time</th>" not in out  # no seconds without a profile


def test_text_has_the_key_facts() -> None:
    lines = plan.to_text(plan_state(fits=False)).splitlines()
    assert lines[0] == "%%shard --plan over 512 devices (data=64, model=8)"
    assert lines[1] == "  512 devices · data=64 × model=8 · planned, not run · compiled in 312 ms"
    assert "Memory per device: arguments 128.0 MiB + outputs 128.0 MiB + temporaries 512.0 MiB = 768.0 MiB" in lines
    assert "  [########========~~~~~~~~~~~~~~~~|!!!!!!!!!!!!!!!]  # arguments, = outputs, ~ temporaries, | device memory" in lines
    assert "  DOES NOT FIT: 768.0 MiB needs 256.0 MiB more than the 512.0 MiB of device memory (from tpu-v5e profile)" in lines
    assert "Per device: FLOPs 1.20 T · bytes accessed 3.2 GiB" in lines
    assert any(line.startswith("  compute") and line.endswith("← bounds the estimate") for line in lines)
    assert "  estimate 6.09 ms per step, compute-bound (the largest of the three)" in lines
    row = lines.index("  all-reduce · bf16[8192,4096] · 64.0 MiB/device · 8 groups of 64 over 'data'")
    assert lines[row + 1] == "      · 1.32 ms"  # wrapped at 80 columns, never cut
    assert "    at line 3: loss, grads = jax.value_and_grad(loss_fn)(params, batch)" in lines
    assert "  grads: bfloat16[8192, 32768] P(None, 'model')" in lines
    assert "  - The CPU backend's memory figures ignore the accelerators' layout padding." in lines


def test_caveats_always_shown() -> None:
    for state in (plan_state(), plan_state(fits=False), plan_state(hardware=False)):
        out = plan.to_html(state)
        for c in state["caveats"]:
            assert f"<li>{html.escape(c)}</li>" in out
        assert "How far to trust these figures" in out


def test_format_seconds() -> None:
    assert plan.format_seconds(0.0012) == "1.20 ms"
    assert plan.format_seconds(5.87e-4) == "587 µs"
    assert plan.format_seconds(2.5) == "2.50 s"
    assert plan.format_seconds(3.2e-8) == "32.0 ns"
    assert plan.format_seconds(0.009996) == "10.0 ms"
    assert plan.format_seconds(None) == "?"
    assert plan.format_seconds(0) == "0 s"


def test_sizes_bounded() -> None:
    state = plan_state()
    state["collectives"] = state["collectives"] * 200  # 400 collectives sent: 256 listed
    out = plan.to_html(state)
    # Collectives, their header, the outputs' header and rows, and the roofline's three rows.
    assert out.count("<tr>") == 256 + 1 + 1 + 2 + 3
    assert "… 144 more collectives not listed" in out
    assert len(out.encode()) < 160 * 1024
    text = plan.to_text(state)
    assert "  … 376 more" in text and len(text.splitlines()) < 90


def test_mimebundle_has_widget_html_and_text() -> None:
    state = plan_state()
    widget = PlanView(state=state)
    data, _ = widget._repr_mimebundle_()
    assert set(data) == {WIDGET_MIME, "text/html", "text/plain"}
    assert data["text/html"] == f'<div class="jpm-static jpm-twin-{widget._jpm_twin}">{inline_styles(plan.to_html(state))}</div>'
    assert data["text/plain"] == fit_text(plan.to_text(state), text_width())
    assert "<script" not in data["text/html"]
    widget.close()


def test_bundle_is_self_contained() -> None:
    esm = PlanView._bundle
    assert not re.search(r"^\s*import\b", esm, re.M)
    assert "export default" in esm and "const __jpm_format = " in esm
    src = re.sub(r"/\*.*?\*/|//[^\n]*", "", base.read_asset("plan.js"), flags=re.S)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in src, sink


@pytest.mark.parametrize("state", [{}, {"memory": None, "cost": None}])
def test_sparse_states_render(state: dict[str, Any]) -> None:
    assert "plan" in plan.to_text(state)
    assert 'class="jpm-view jpm-plan"' in plan.to_html(state)


def modelled_state() -> dict[str, Any]:
    """A plan state with the topology-aware split: ICI, DCN and latency, both overlap bounds."""
    state = plan_state()
    state["hardware"].update(kind="tpu", link_bandwidth=4.5e10, dcn_bandwidth=2.5e10, hop_latency=1e-6,
                             fabric=["ICI", "DCN"])
    state["roofline"] = {"compute_s": 1e-3, "memory_s": 2e-4, "collective_s": 3.5e-3, "estimate_s": 3.5e-3,
                         "bound": "dcn", "ici_s": 5e-4, "dcn_s": 3e-3, "latency_s": 0.0, "serial_s": 4.5e-3,
                         "rates": [{"class": "bf16", "share": 1.0, "flops_per_s": 1.97e14, "rate": "bf16 peak"}],
                         "labels": {"ici": "ICI collectives", "dcn": "DCN collectives"}, "bound_text": "DCN collectives"}
    state["topology"] = {"text": "16x16 ICI slice, wraparound on every axis; 2 slices over DCN"}
    return state


def test_the_dominant_term_and_both_overlap_bounds_are_named() -> None:
    state = modelled_state()
    text = plan.to_text(state)
    assert "  estimate 3.50 ms per step, bound by DCN collectives, if communication fully overlaps compute " \
           "(optimistic); 4.50 ms if none of it does" in text.splitlines()
    dcn = next(line for line in text.splitlines() if line.startswith("  DCN collectives"))
    assert "3.00 ms" in dcn and dcn.endswith("← bounds the estimate")
    assert "2 slices over DCN" in text and "FLOPs ÷ 197.00 TFLOP/s (bf16 peak)" in text
    out = body(plan.to_html(state))
    assert '<td class="jpm-roof-name jpm-bound">DCN collectives</td>' in out
    assert "topology: 16x16 ICI slice" in out


def test_the_gpu_preallocation_note_is_shown() -> None:
    state = plan_state()
    state["memory"]["note"] = "JAX preallocates 75% of a GPU's memory by default: set XLA_PYTHON_CLIENT_MEM_FRACTION"
    assert state["memory"]["note"] in " ".join(plan.to_text(state).split())  # wrapped at 80 columns
    assert html.escape(state["memory"]["note"]) in plan.to_html(state)


def test_long_output_lists_and_caveats_are_folded() -> None:
    state = plan_state()
    state["outputs"] = [{"name": f"new_params['w{i}']", "shape": [8, 8], "dtype": "float32", "spec": ["data", None]}
                        for i in range(19)]
    state["caveats"] = [f"caveat {i}" for i in range(6)]
    text = plan.to_text(state).splitlines()
    assert "Outputs, bound as jax.ShapeDtypeStruct (19):" in text
    assert "  … and 14 more (`%sharding NAME` shows one)" in text
    assert sum(line.startswith("  new_params") for line in text) == 5
    assert all(f"  - caveat {i}" in text for i in range(6))  # the text form keeps every caveat
    page = body(plan.to_html(state))
    assert '<details class="jpm-caveats" role="note"><summary class="jpm-h">How far to trust these figures (6 notes)' in page
    assert '<details class="jpm-section"><summary class="jpm-h">Outputs' in page and "(19)</summary>" in page
    short = body(plan.to_html(plan_state()))
    assert '<details class="jpm-caveats" role="note" open>' in short  # two caveats: open


def test_a_collectives_row_at_zero_says_its_collectives_went_to_latency() -> None:
    """Latency-bound collectives are booked under latency only: the ICI row at 0 s says so, in the
    HTML and the text (js/plan.js's roofValue is the twin)."""
    state = plan_state()
    state["roofline"] = {**state["roofline"], "ici_s": 0.0, "latency_s": 5e-6, "serial_s": 1e-3,
                         "labels": {"ici": "ICI collectives", "latency": "collective latency"}}
    out, text = plan.to_html(state), plan.to_text(state)
    assert "0 s (latency-bound: see collective latency)" in out
    assert "(latency-bound: see collective latency)" in text
    assert plan.roof_value("compute", 0.0, state["roofline"]) == "0 s"


def test_memory_notes_wrap_at_80_columns_and_keep_every_word() -> None:
    """Issue 29 item 11: the 80-column text wraps lines, never cuts them. A plan's memory notes
    (--donate, XLA:TPU's VMEM) ran to 470 columns on a v5e 4x4 transformer."""
    state = plan_state(fits=True)
    note = ("donated: params, opt_state (as jax.jit's donate_argnums): 24.0 MiB of outputs are written into their "
            "buffers, counted once. XLA:TPU also keeps up to 114.0 MiB at once in on-chip VMEM (not HBM: outside "
            "these figures and the fit).")
    state["memory"]["notes"] = [note]
    text = plan.to_text(state)
    noted = text.split("fits: ", 1)[1].split("\n", 1)[1].split("Per device: FLOPs")[0]  # the lines after the verdict
    assert max(len(line) for line in noted.splitlines()) <= 80
    assert " ".join(note.split()) in " ".join(noted.split())


def test_collective_rows_and_caveats_wrap_at_80_columns_and_keep_every_word() -> None:
    """Issue 29 item 11: a collective's row with its groups and a long source line, and a caveat, ran to
    470 columns in the 80-column text; they wrap like the buffer rows."""
    state = plan_state(fits=True)
    source = "q, k, v = ((h @ p[w]).reshape(B, S, H, D // H) for w in ('wq', 'wk', 'wv'))  # the three projections"
    state["collectives"][0].update(source=source, groups_text="8 groups of 64 over 'data', in the backward pass, "
                                   "8 times (in a loop), one instruction of 2 operands")
    caveat = "XLA:TPU and XLA:GPU may fuse, schedule and combine collectives differently, " * 3
    state["caveats"] = [caveat.strip()]
    text = plan.to_text(state)
    listed = text.split("Collectives the compiler inserted", 1)[1]
    assert max(len(line) for line in listed.splitlines()) <= 80
    flat = " ".join(listed.split())
    assert " ".join(source.split()) in flat and "one instruction of 2 operands" in flat and " ".join(caveat.split()) in flat
