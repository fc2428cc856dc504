"""js/plan.js in Chromium for what issue 14 added: the topology-aware roofline (ICI / DCN / latency
rows, the dominant term, both overlap bounds), the GPU preallocation note, folded caveats and
outputs, and the --compare table, each against its Python twin in views/plan.py."""

from __future__ import annotations

from typing import Any

import pytest

from jaxpar_magic.views import plan, plan_collectives, plan_compare
from sample_states import plan_state

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"


def modelled() -> dict[str, Any]:
    state = plan_state()
    state["hardware"].update(kind="tpu", link_bandwidth=4.5e10, dcn_bandwidth=2.5e10, hop_latency=1e-6,
                             fabric=["ICI", "DCN"])
    state["roofline"] = {"compute_s": 1e-3, "memory_s": 2e-4, "collective_s": 3.5e-3, "estimate_s": 3.5e-3,
                         "bound": "dcn", "ici_s": 5e-4, "dcn_s": 3e-3, "latency_s": 2e-6, "serial_s": 4.5e-3,
                         "rates": [{"class": "f32", "share": 1.0, "flops_per_s": 1.97e14, "rate": "bf16 peak"}],
                         "labels": {"ici": "ICI collectives", "dcn": "DCN collectives", "latency": "collective latency"},
                         "bound_text": "DCN collectives"}
    state["topology"] = {"text": "16x16 ICI slice, wraparound on every axis; 2 slices over DCN"}
    state["memory"]["note"] = "JAX preallocates 75% of a GPU's memory by default"
    state["outputs"] = [{"name": f"p{i}", "shape": [8], "dtype": "float32", "spec": ["data"]} for i in range(12)]
    state["caveats"] = [f"caveat {i}" for i in range(5)]
    state["collectives"][0]["origin"] = {"function": "block", "line": 18, "source": 'x @ p["w1"]', "cell": "In[3]"}
    return state


def comparison() -> dict[str, Any]:
    row = {"error": None, "axes": [{"name": "data", "size": 8}], "memory": 2**30, "capacity": 16 * 2**30,
           "fits": True, "collective_bytes": 2**20, "collectives": 1, "flops": 1e9, "compute_s": 1e-3,
           "memory_s": 1e-4, "collective_s": 2e-3, "estimate_s": 2e-3, "serial_s": 3e-3, "bound": "ici",
           "bound_text": "ICI collectives"}
    return {"kind": "compare", "title": "%%shard --plan --compare layouts on tpu-v5e: 3 layouts, best first",
            "hardware": None, "caveats": ["one", "two"],
            "rows": [{**row, "label": "fsdp"}, {**row, "label": HOSTILE, "fits": False, "estimate_s": 4e-3},
                     {"label": "broken", "error": "UsageError: --in x: 'nope' is not an axis"}]}


def test_the_modelled_roofline_names_each_term_and_both_bounds(view_page: Any) -> None:
    state = modelled()
    host = view_page.mount("plan", state)
    names = host.locator(".jpm-roof-name").all_inner_texts()
    assert names == ["compute", "memory", "ICI collectives", "DCN collectives", "collective latency"]
    assert "jpm-bound" in host.locator(".jpm-roof-name").nth(3).get_attribute("class")
    assert host.locator(".jpm-estimate").inner_text() == plan.estimate_sentence(state["roofline"])
    assert "topology: 16x16 ICI slice" in host.inner_text()
    assert "JAX preallocates 75%" in host.locator(".jpm-section").first.inner_text()
    caveats = host.locator("details.jpm-caveats")
    assert caveats.get_attribute("open") is None and "(5 notes)" in caveats.locator("summary").text_content()
    source = host.locator("td.jpm-srccell").first.inner_text()
    assert source == plan_collectives.where(state["collectives"][0]) == 'line 18 of In[3], in block(): x @ p["w1"] (called from line 3)'
    outputs = host.locator("details.jpm-section")
    assert outputs.count() == 1 and "(12)" in outputs.locator("summary").text_content()
    view_page.shot(host, "plan-modelled")


def test_the_comparison_table_matches_its_python_twin(view_page: Any) -> None:
    state = comparison()
    host = view_page.mount("plan", state)
    rows = host.locator("tbody tr")
    assert rows.count() == 3
    first = rows.nth(0).locator("td").all_inner_texts()
    cells = plan_compare._row_cells(state["rows"][0])
    assert first == ["fsdp"] + [cells[c] for c in plan_compare.COMPARE_COLUMNS]
    assert HOSTILE in rows.nth(1).inner_text() and "jpm-bad" in rows.nth(1).get_attribute("class")
    assert "failed: UsageError" in rows.nth(2).inner_text()
    assert host.locator("img").count() == 0 and view_page.page.evaluate("window.__xss") is None
    assert host.locator("details.jpm-caveats").get_attribute("open") is not None  # two notes: open
    view_page.shot(host, "plan-compare")


def test_a_collective_row_names_its_reduction_as_the_python_twin_does(view_page: Any) -> None:
    state = plan_state()
    state["collectives"][0].update(op="all-reduce", reduction="max", sliced_from=None)
    host = view_page.mount("plan", state)
    assert host.locator("td.jpm-op").first.inner_text() == "all-reduce (max)"
    assert ">all-reduce (max)</td>" in plan.to_html(state) and "all-reduce (max) · " in plan.to_text(state)


def decided() -> dict[str, Any]:
    """A plan state with what issue 42 adds: why, overlap, calls per trip, a summary, the partitioner's
    warning, a pipeline's bubble, a layout that changes, and a refused compile's sentence."""
    state = modelled()
    first, second = state["collectives"][0], state["collectives"][1]
    first.update(overlapped=False, bound="ici", why={"op": "dot_general", "asked": False, "operand": "w",
                 "before": "dimension 0 split over 'data'", "needed": "dimension 0 whole",
                 "text": f"dot_general at line 3 needs w's dimension 0 whole; it is split over 'data' {HOSTILE}"})
    second.update(overlapped=True, count=None, per_trip=5, at_most=5000)
    state["roofline"]["exposed_s"] = first["seconds"]
    state["collective_summary"] = [
        {"op": "collective-permute", "axes": ["data"], "instructions": 493, "calls": 3944, "bytes": 2 * 10**9,
         "seconds": 4.1e-3, "exposed_s": 1.2e-3},
        {"op": "all-gather", "axes": ["data", "model"], "instructions": 1, "calls": 1, "bytes": 2**20,
         "seconds": None, "exposed_s": 0.0}]
    state["partitioner"] = [{"what": "rematerialization", "name": "xb", "from": "P(('data', 'model'))",
                             "to": "P(None, 'model') with 2 copies of each part", "line": 2, "source": "yb = xb @ wb",
                             "text": f"XLA's partitioner cannot go from P(('data', 'model')) to P(None, 'model') {HOSTILE}",
                             "said": "Involuntary full rematerialization"}]
    state["pipeline"] = {"ticks": 11, "microbatches": 8, "stages": 4, "axis": "stage", "bubble": 3,
                         "fraction": 3 / 11, "line": 11}
    state["layout_changes"] = [{"name": "params['w2']", "before": "P('model', 'data')", "after": f"P(None, 'data') {HOSTILE}"}]
    return state


def test_why_overlap_summary_partitioner_pipeline_and_layouts_match_the_python_twins(view_page: Any) -> None:
    state = decided()
    host = view_page.mount("plan", state)
    text = host.inner_text()
    static = plan.to_text(state)
    why = host.locator("tr.jpm-why").first.locator("td").nth(1).inner_text()
    assert why == f"why: {plan_collectives.why_text(state['collectives'][0])}" and HOSTILE in why
    times = host.locator("td.jpm-num").all_inner_texts()
    assert plan_collectives.time_words(state["collectives"][0]) in times and "exposed)" in times[1]
    assert plan_collectives.time_words(state["collectives"][1]).endswith("overlapped)")
    summary = host.locator("ul.jpm-summary li").all_inner_texts()
    assert summary == [plan_collectives.summary_line(s) for s in state["collective_summary"]]
    assert summary[0] == ("collective-permute over 'data': 493 instructions, 3,944 calls, 1.9 GiB moved per device, "
                          "4.10 ms (1.20 ms exposed)")
    assert plan_collectives.summary_line(state["collective_summary"][0]) in " ".join(static.split())
    assert host.locator(".jpm-partitioner").inner_text() == plan_collectives.partitioner_text(state["partitioner"][0])
    assert host.locator(".jpm-pipeline").inner_text() == plan_collectives.pipeline_text(state["pipeline"])
    assert "pipeline bubble: 3 of 11 ticks (27%)" in text
    assert plan_collectives.layout_change_text(state["layout_changes"][0]) in text
    assert host.locator(".jpm-estimate").inner_text() == plan.estimate_sentence(state["roofline"])
    assert "of synchronous ones (exposed) add to it" in host.locator(".jpm-estimate").inner_text()
    assert host.locator("img").count() == 0 and view_page.page.evaluate("window.__xss") is None
    view_page.shot(host, "plan-decided")
    refused = plan_state(hardware=True)
    refused.update(roofline=None, compiled="refused", compiler={"name": "XLA:TPU", "text": "compiled by XLA:TPU"})
    host = view_page.mount("plan", refused)
    assert plan.no_estimate_sentence(refused) in host.inner_text() and "give --hardware" not in host.inner_text()
