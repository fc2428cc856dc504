"""The profile view without a browser (js/profile.js in Chromium: tests/browser/test_profile_js.py):
static HTML that JupyterLab's sanitizer keeps and that escapes what it shows, text within 80 columns
that says the same facts, and a Profile displaying itself as its view."""
from __future__ import annotations

import re

import pytest
from html_tags import parse
from sample_states import profile_sample
from sanitizer_rules import ALLOWED_TAGS, rejected_declarations

from jaxpar_magic.views import ProfileView
from jaxpar_magic.views import profile as view

HOSTILE = "<img src=x onerror=window.__xss=1>"


def test_static_html_draws_the_median_step_and_survives_the_sanitizer():
    profile, state = profile_sample()
    page = ProfileView(state=state).to_html()
    assert set(parse(page).tags) <= ALLOWED_TAGS and "<script" not in page and "<style" not in page
    styles = re.findall(r'style="([^"]*)"', page)
    assert styles and not sorted({d for s in styles for d in rejected_declarations(s)})
    step = state["median_step"]
    drawn = sum(len(view.step_events(state, lane, step)) for lane in state["lanes"])
    assert drawn == sum(1 for lane in profile.lanes for e in lane.events if e.step == step)
    assert page.count('class="jpm-pf-bar') == drawn  # the sample's events are apart: one bar each
    assert page.count("jpm-pf-wait") >= 4 + 1  # one wait per device, and the legend's key
    for lane in profile.lanes:  # each bar where its event is, in % of the step
        for e in (e for e in lane.events if e.step == step):
            left = 100 * e.start_s / profile.step_times_s[step]
            assert f"left:{left:.1f}%" in page
    assert state["shares_text"] in page and state["headline"] in page
    assert "psum.7 (all-reduce, line 2)" in page


def test_the_static_picture_draws_a_loops_touching_ops_as_one_bar():
    """A loop's many small ops cost one bar in the static HTML, its title saying how many; the live
    view and the state keep every event."""
    profile, state = profile_sample()
    lane = dict(state["lanes"][0])
    kinds, step = state["kinds"], state["median_step"]
    compute = kinds.index("compute")
    loop = [[step, 100.0 + 1.0 * k, 0.9, compute, 1, 0] for k in range(50)]  # fusion.3, 50 times, 0.1 µs apart
    lane["events"] = loop
    bars = view.static_bars(state, lane, step)
    assert len(bars) == 1 and bars[0][3].startswith("50 ops (fusion.3…): ")
    span = view.span_of(state, step)
    assert bars[0][1:3] == pytest.approx((100 * 100.0 / span, 100 * 49.9 / span))
    lane["events"] = [[step, 100.0 + 20.0 * k, 0.9, compute, 1, 0] for k in range(3)]  # apart: one bar each
    assert len(view.static_bars(state, lane, step)) == 3


def test_static_html_and_text_escape_and_keep_hostile_strings():
    _, state = profile_sample(title=HOSTILE)
    state["notes"] = [HOSTILE]
    page = ProfileView(state=state).to_html()
    assert HOSTILE not in page and "&lt;img src=x onerror=window.__xss=1&gt;" in page
    assert HOSTILE in view.to_text(state)


def test_text_fits_80_columns_and_draws_waits_as_waits():
    profile, state = profile_sample(lanes=8)
    text = ProfileView(state=state).to_text(width=80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    rows = [line for line in lines if line.startswith("device ")]
    assert len(rows) == 8 and all(line.endswith("|") for line in rows)
    tracks = [row.split("|")[1] for row in rows]
    assert all(len(t) == view.TRACK for t in tracks)
    assert all("#" in t and "." in t for t in tracks)  # compute and a wait on every device
    assert tracks[0].count(".") > tracks[-1].count(".")  # the first device waits longest for the last
    assert "psum.7 (all-reduce, line 2)" in text and "waiting" in text
    assert profile.source.split(":")[0] in text


def test_a_profile_shows_itself_as_its_view():
    profile, _ = profile_sample()
    shown = profile.view("t")
    assert isinstance(shown, ProfileView) and shown.state["title"] == "t"
    assert repr(profile).startswith("Profile(") and profile.summary().startswith("measured step")
