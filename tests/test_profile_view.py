"""The profile view without a browser (js/profile.js in Chromium: tests/browser/test_profile_js.py):
static HTML that JupyterLab's sanitizer keeps and that escapes what it shows, text within 80 columns
that says the same facts, and a Profile displaying itself as its view."""
from __future__ import annotations

import re

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
    assert page.count('class="jpm-pf-bar') == drawn == sum(1 for lane in profile.lanes for e in lane.events
                                                            if e.step == step)
    assert page.count("jpm-pf-wait") >= 4 + 1  # one wait per device, and the legend's key
    for lane in profile.lanes:  # each bar where its event is, in % of the step
        for e in (e for e in lane.events if e.step == step):
            left = 100 * e.start_s / profile.step_times_s[step]
            assert f"left:{left:.2f}%" in page
    assert state["shares_text"] in page and state["headline"] in page
    assert "psum.7 (all-reduce, line 2)" in page


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
