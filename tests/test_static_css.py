"""Static views survive JupyterLab's sanitizer (an untrusted notebook): every style inline, with
only properties and values the sanitizer keeps, and only tags and attributes it keeps; and the
inliner applies js/static.css the way CSS would (descendants, specificity, the renderer's own style
last)."""

from __future__ import annotations

import re

import pytest
from html_tags import parse
from sample_states import collective_card, collectives_state, plan_state, profile_sample, sharding_state
from sanitizer_rules import ALLOWED_TAGS, GLOBAL_ATTRS, TAG_ATTRS, rejected_declarations
from test_views_static import devices_state, mesh_state, result_state

from jaxpar_magic.views import CollectivesView, DevicesView, MeshView, PlanView, ProfileView, ResultView, ShardingView
from jaxpar_magic.views.base import read_asset
from jaxpar_magic.views.inline import inline_styles, parse_rules

SAMPLES = {
    "devices": lambda: DevicesView(state=devices_state(8)),
    "devices-64": lambda: DevicesView(state=devices_state(64)),
    "results": lambda: ResultView(state=result_state(8)),
    "mesh": lambda: MeshView(state=mesh_state([2, 4])),
    "mesh-3d": lambda: MeshView(state=mesh_state([2, 2, 4])),
    "mesh-big": lambda: MeshView(state=mesh_state([16, 16, 16])),
    "sharding": lambda: ShardingView(state=sharding_state([8, 8], [("data", 4), ("model", 2)], ["data", None])),
    "sharding-4096": lambda: ShardingView(state=sharding_state([64, 64], [("x", 64), ("y", 64)], ["x", "y"])),
    "collectives": lambda: CollectivesView(state=collectives_state(
        [collective_card(op, 8, index=k, shape=(8,)) for k, op in enumerate(["psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"])], 8)),
    "plan": lambda: PlanView(state=plan_state()),
    "profile": lambda: ProfileView(state=profile_sample()[1]),
}


def test_static_css_uses_only_what_the_sanitizer_keeps() -> None:
    bad = {}
    for rule in parse_rules(read_asset("static.css")):
        for name, value in rule.declarations:
            if rejected_declarations(f"{name}:{value}"):
                bad[f"{name}: {value}"] = rule.parts
    assert not bad, f"js/static.css declarations JupyterLab's sanitizer drops: {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_static_html_survives_the_sanitizer(name: str) -> None:
    view = SAMPLES[name]()
    page = view.to_html()
    view.close()
    tags = parse(page)
    assert set(tags.tags) <= ALLOWED_TAGS, f"{name}: tags the sanitizer removes: {set(tags.tags) - ALLOWED_TAGS}"
    assert "<style" not in page and "<svg" not in page and "<script" not in page
    for tag, attrs in re.findall(r"<([a-z]+)((?:\s+[-a-z]+(?:=\"[^\"]*\")?)*)\s*/?>", page):
        names = set(re.findall(r'\s([-a-z]+)(?:="[^"]*")?', attrs))
        # role and aria-* are dropped too, which changes nothing a reader sees.
        extra = {n for n in names - GLOBAL_ATTRS - TAG_ATTRS.get(tag, set()) if n != "role" and not n.startswith("aria-")}
        assert not extra, f"{name}: <{tag}> attributes the sanitizer drops: {extra}"
    styles = re.findall(r'style="([^"]*)"', page)
    assert styles, f"{name}: no inline styles at all"
    dropped = sorted({d for s in styles for d in rejected_declarations(s)})
    assert not dropped, f"{name}: inline declarations the sanitizer drops: {dropped}"


def test_inliner_applies_rules_like_css(monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxpar_magic.views import inline

    css = """
    .a { color: red; margin: 1px }
    .a .b { color: blue }
    div.b { padding: 2px }
    .b { padding: 9px; color: green }
    td { text-align: left }
    .x td.y { text-align: right }
    """
    rules = inline.parse_rules(css)
    by_class: dict = {}
    by_tag: dict = {}
    for r in rules:
        last = r.parts[-1]
        (by_class.setdefault(min(last.classes), []) if last.classes else by_tag.setdefault(str(last.tag), [])).append(r)
    monkeypatch.setattr(inline, "static_rules", lambda: (by_class, by_tag))
    out = inline_styles('<div class="a"><span class="b" style="color:#123">t</span><div class="b">u</div></div>'
                        '<div class="b">v</div><table class="x"><tr><td class="y">1</td><td>2</td></tr></table>')
    # The descendant rule beats the single class, the renderer's own style comes last, a tag
    # and a class combine, an inherited colour a parent already gives is left out.
    assert '<span class="b" style="padding:9px;color:blue;color:#123">' in out
    assert '<div class="b" style="padding:2px;color:blue">u</div>' in out
    assert '<div class="b" style="color:green;padding:2px">v</div>' in out
    assert '<td class="y" style="text-align:right">1</td><td style="text-align:left">2</td>' in out


def test_a_view_shows_its_static_twin_then_the_widget_in_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxpar_magic.views import base

    view = DevicesView(state=devices_state(8))
    monkeypatch.setattr(base, "_in_kernel", lambda: True)
    (static, _), (widget, _) = view.display_parts()
    assert set(static) == {"text/html", "text/plain"} and set(widget) == {base.WIDGET_MIME}
    assert widget[base.WIDGET_MIME]["model_id"] == view.model_id
    assert static["text/html"].startswith(f'<div class="jpm-static jpm-twin-{view._jpm_twin}">')
    assert view._jpm_twin and view.trait_metadata("_jpm_twin", "sync")
    monkeypatch.setattr(base, "_in_kernel", lambda: False)
    (only, _), = view.display_parts()  # a terminal: one output, printed once
    assert set(only) == {"text/html", "text/plain", base.WIDGET_MIME}
    view.close()
