"""js/memory.js in Chromium: the memory timeline and the peak's buffers of a real plan (planned here on
the test process's 8 simulated devices), each text against its Python twin in views/memory.py, hover
naming a step's operation and line, the device memory line, and nothing cut off at 320 px."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh, plan as abstract
from jaxpar_magic.views import memory, plan

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>"


@pytest.fixture(scope="module")
def planned() -> Any:
    mesh = make_mesh("data=8")
    ns = {"jnp": jnp, "x": abstract((8 * 512, 256), "float32", mesh, ("data", None)),
          "w1": abstract((256, 4096), "float32", mesh, ()), "w2": abstract((4096, 8), "float32", mesh, ())}
    return jaxpar_magic.plan_cell("scale = 2.0\nh = x @ w1\nout = jnp.tanh(h * scale) @ w2\n", ns, mesh=mesh,
                                  bind=False, device_memory="32MiB")


def memory_state(planned) -> dict[str, Any]:
    return {"title": "memory of %%shard --plan", **plan.memory_state(planned.state("p"))}


def test_bars_rows_and_hover_match_the_python_twin(view_page: Any, planned) -> None:
    state = memory_state(planned)
    host = view_page.mount("memory", state)
    bars = host.locator(".jpm-tl-bar")
    points = state["peak"]["timeline"]
    assert bars.count() == len(points)
    peak_at = [i for i, p in enumerate(points) if p["step"] == state["peak"]["step"]]
    assert host.locator(".jpm-tl-peak").count() == 1 and peak_at
    assert "jpm-tl-peak" in bars.nth(peak_at[0]).get_attribute("class")
    bars.nth(peak_at[0]).hover()
    detail = host.locator(".jpm-detail").inner_text()
    assert detail == f"step {points[peak_at[0]]['step']}: {memory.format_bytes(points[peak_at[0]]['bytes'])} live — " \
                     f"{memory.step_text(memory.place(state['peak'], points[peak_at[0]]))}"
    assert "line 3: out = jnp.tanh(h * scale) @ w2" in detail or "line 2: h = x @ w1" in detail
    cells = [row.locator("td").all_inner_texts() for row in host.locator("table.jpm-peak-table tbody tr").all()]
    expected = [[memory.format_bytes(n), what, shape, where or "—"] for n, what, shape, where in memory.rows(state["peak"])]
    assert cells[:-1] == expected and cells[-1][0] == memory.format_bytes(state["peak"]["reported"])
    assert host.locator(".jpm-tl-cap").count() == 1  # 32 MiB of device memory: on the chart's scale
    note, start = host.locator(".jpm-memory > .jpm-note").all_inner_texts()
    assert note == f"{memory.peak_sentence(state)}; {memory.capacity_sentence(state)}"
    assert start == memory.start_sentence(state["peak"]) and start.startswith("before step 0: ")  # issue 39
    assert memory.start_sentence(state["peak"]) in memory.to_html(state)
    view_page.shot(host, "memory-timeline")


def test_the_plan_view_embeds_it_with_its_compiler_and_the_names_left_alone(view_page: Any, planned) -> None:
    state = planned.state("%%shard --plan")
    state["left_alone"] = ["params", HOSTILE]
    host = view_page.mount("plan", state)
    assert host.locator(".jpm-compiler").inner_text() == "compiled by XLA:CPU for 8 simulated CPU devices"
    assert host.locator(".jpm-timeline .jpm-tl-bar").count() == len(state["peak"]["timeline"])
    assert host.locator(".jpm-left-alone").inner_text() == plan.left_alone_sentence(state["left_alone"])
    legend = host.locator(".jpm-mem-legend").inner_text()
    assert all(name in legend for _, name, _ in plan.bar_parts(state["memory"]))
    assert host.locator("img").count() == 0 and view_page.page.evaluate("window.__xss") is None


def test_nothing_is_cut_off_at_320_px(view_page: Any, planned) -> None:
    view_page.page.set_viewport_size({"width": 320, "height": 900})
    host = view_page.mount("memory", memory_state(planned))
    got = host.evaluate("""el => {
        const view = el.querySelector('.jpm-view');
        const chart = el.querySelector('.jpm-timeline');
        return [view.scrollWidth, view.clientWidth, chart.getBoundingClientRect().right, el.getBoundingClientRect().right];
    }""")
    assert got[0] <= got[1] + 1 and got[2] <= got[3] + 1, got
    view_page.shot(host, "memory-timeline-320")


def test_roles_and_groups_read_as_the_python_twin_writes_them(view_page: Any, planned) -> None:
    state = memory_state(planned)
    peak = state["peak"]
    peak["buffers"][0] = {**peak["buffers"][0], "kind": "temporary", "role": "all-gather of params['w']"}
    peak["buffers"].append({**peak["buffers"][-1], "kind": "temporary", "role": "activation saved for the backward "
                            "pass", "count": 3, "instruction": "", "shape": [], "dtype": "f32"})
    peak["buffers"].append({**peak["buffers"][-1], "kind": "argument", "name": None, "role": None, "count": 4})
    host = view_page.mount("memory", state)
    cells = [row.locator("td").all_inner_texts() for row in host.locator("table.jpm-peak-table tbody tr").all()]
    expected = [[memory.format_bytes(n), what, shape, where or "—"] for n, what, shape, where in memory.rows(peak)]
    assert cells[:-1] == expected
    texts = [c[1] for c in cells]
    assert texts[0].startswith("all-gather of params['w'], from ")
    assert any(t.startswith("3 buffers: activation saved for the backward pass, from ") for t in texts)
    assert "4 buffers: arguments" in texts
