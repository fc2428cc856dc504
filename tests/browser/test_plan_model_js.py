"""js/plan.js in Chromium for what issue 14 added: the topology-aware roofline (ICI / DCN / latency
rows, the dominant term, both overlap bounds), the GPU preallocation note, folded caveats and
outputs, and the --compare table, each against its Python twin in views/plan.py."""

from __future__ import annotations

from typing import Any

import pytest

from jaxpar_magic.views import plan
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
    assert source == plan._where(state["collectives"][0]) == 'line 18 of In[3], in block(): x @ p["w1"] (called from line 3)'
    outputs = host.locator("details.jpm-section")
    assert outputs.count() == 1 and "(12)" in outputs.locator("summary").text_content()
    view_page.shot(host, "plan-modelled")


def test_the_comparison_table_matches_its_python_twin(view_page: Any) -> None:
    state = comparison()
    host = view_page.mount("plan", state)
    rows = host.locator("tbody tr")
    assert rows.count() == 3
    first = rows.nth(0).locator("td").all_inner_texts()
    cells = plan._row_cells(state["rows"][0])
    assert first == ["fsdp"] + [cells[c] for c in plan.COMPARE_COLUMNS]
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
