"""js/profile.js in Chromium: a profile the profile stage made (tests/sample_states.profile_sample),
each lane's bars where the Python twin (views/profile.py) puts them, hover naming an op with the
same words, the step selector redrawing another step's bars, hostile strings kept as text, and
nothing cut off at 320 px."""

from __future__ import annotations

from typing import Any

import pytest
from sample_states import profile_sample

from jaxpar_magic.views import profile as view

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>"


def test_bars_hover_and_the_step_selector_match_the_python_twin(view_page: Any) -> None:
    _, state = profile_sample()
    host = view_page.mount("profile", state)
    step = state["median_step"]
    lanes = host.locator(".jpm-pf-track")
    assert lanes.count() == len(state["lanes"])
    for k, lane in enumerate(state["lanes"]):
        events = view.step_events(state, lane, step)
        bars = lanes.nth(k).locator(".jpm-pf-bar")
        assert bars.count() == len(events)
        lefts = bars.evaluate_all("bs => bs.map(b => b.style.left)")
        span = view.span_of(state, step)
        expected = [max(0.0, min(100.0, 100 * e["start"] / span)) for e in events]
        assert [float(x.rstrip("%")) for x in lefts] == pytest.approx(expected, abs=0.006)
    first = view.step_events(state, state["lanes"][0], step)
    wait = next(i for i, e in enumerate(first) if e["kind"] == "wait")
    lanes.nth(0).locator(".jpm-pf-bar").nth(wait).hover(force=True)
    detail = host.locator(".jpm-detail").inner_text()
    assert detail == f"{state['lanes'][0]['label']}: {view.event_text(first[wait])}"
    assert detail.endswith(", waiting") and "psum.7 (all-reduce, line 2)" in detail
    assert "jpm-pf-wait" in lanes.nth(0).locator(".jpm-pf-bar").nth(wait).get_attribute("class")
    other = (step + 1) % len(state["steps"])
    host.locator("select.jpm-pf-step").select_option(str(other))
    assert host.locator(".jpm-pf-axis").inner_text().startswith("0")
    assert f"step {other + 1} of {len(state['steps'])}" in host.locator(".jpm-pf-axis").inner_text()
    assert host.locator(".jpm-pf-track").nth(0).locator(".jpm-pf-bar").count() == len(
        view.step_events(state, state["lanes"][0], other))
    shares = host.locator(".jpm-pf-share").evaluate_all("ss => ss.map(s => s.style.width)")
    assert [float(x.rstrip("%")) for x in shares] == pytest.approx(
        [100 * max(0.0, state["shares"].get(k, 0.0)) for k, _ in view.SHARES], abs=0.006)
    ops = [row.locator("td").all_inner_texts() for row in host.locator("table.jpm-plan-table tbody tr").all()]
    assert [r[1] for r in ops] == [o["name"] for o in state["ops"]]
    assert [r[0] for r in ops] == [view.us(o["total_us"]) for o in state["ops"]]
    view_page.shot(host, "profile-timeline")


def test_hostile_strings_stay_text(view_page: Any) -> None:
    _, state = profile_sample(title=HOSTILE)
    state["notes"] = [HOSTILE]
    state["lanes"][0]["label"] = HOSTILE
    host = view_page.mount("profile", state)
    assert host.locator(".jpm-title").inner_text() == HOSTILE
    assert host.locator("img").count() == 0 and view_page.page.evaluate("window.__xss") is None


def test_nothing_is_cut_off_at_320_px(view_page: Any) -> None:
    view_page.page.set_viewport_size({"width": 320, "height": 900})
    _, state = profile_sample(lanes=8)
    host = view_page.mount("profile", state)
    got = host.evaluate("""el => {
        const view = el.querySelector('.jpm-view');
        const track = el.querySelector('.jpm-pf-track');
        return [view.scrollWidth, view.clientWidth, track.getBoundingClientRect().right, el.getBoundingClientRect().right];
    }""")
    assert got[0] <= got[1] + 1 and got[2] <= got[3] + 1, got
    view_page.shot(host, "profile-320")
