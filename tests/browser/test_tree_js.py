"""TreeView (js/tree.js) in a real Chromium with the fake widget model: the table, a row's
picture on hover, click and keyboard (drawn by js/sharding.js), a row without a picture,
re-rendering and cleanup, escaping, the text twins of views/tree.py, a state built from real
arrays, the static HTML offline, and screenshots into test-artifacts/ (look at them)."""

from __future__ import annotations

from typing import Any

import pytest
from sample_states import sharding_state

from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views import tree as tree_view

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"
MESH = [("data", 4), ("model", 2)]


def sample_tree(name: str = "opt_state") -> dict[str, Any]:
    """A tree state as tree_summary.tree_state shapes it, its pictures from the independent
    sample_states.sharding_state: a 30-layer Adam state's w and b layouts, and a count whose
    picture was not sent."""
    w_paths = [f"[0].mu['layer{i}']['w']" for i in range(6)]
    b_paths = [f"[0].mu['layer{i}']['b']" for i in range(6)]
    return {
        "name": name, "type": "tuple", "arrays": 121, "layouts": 3,
        "rows": [
            {"shape": [4000, 1000], "dtype": "float32", "kind": "array", "spec": "P('data', None)",
             "where": "split dim 0 4× over data; replicated over model", "bytes": 16_000_000, "device_bytes": 4_000_000,
             "count": 60, "paths": w_paths, "more_paths": 54, "picture": 0},
            {"shape": [1000], "dtype": "float32", "kind": "array", "spec": "P()", "where": "replicated on 8 devices",
             "bytes": 4000, "device_bytes": 4000, "count": 60, "paths": b_paths, "more_paths": 54, "picture": 1},
            {"shape": [], "dtype": "int32", "kind": "array", "spec": "", "where": "single device (0)", "bytes": 4,
             "device_bytes": 4, "count": 1, "paths": ["[0].count"], "more_paths": 0, "picture": None},
        ],
        "rows_omitted": {"layouts": 0, "leaves": 0},
        "bytes": 960_240_004, "device_bytes": 240_240_004, "abstract": False,
        "static": {"count": 2, "groups": [{"kind": "function", "count": 2, "paths": [".activation", ".final_activation"],
                                           "more_paths": 0}], "groups_omitted": 0},
        "pictures": [sharding_state([4000, 1000], MESH, ["data", None], name=f"{name}{w_paths[0]}"),
                     sharding_state([1000], MESH, [], name=f"{name}{b_paths[0]}")],
        "process_count": 1,
    }


def picture_name(host: Any) -> str:
    return host.locator(".jpm-tree-picture .jpm-sharding .jpm-title code").inner_text()


def test_native_module_and_bundle_agree(view_page: Any) -> None:
    native = view_page.mount("tree", sample_tree(), mode="native")
    bundled = view_page.mount("tree", sample_tree(), mode="bundle")
    assert native.inner_html() == bundled.inner_html()
    assert native.locator(".jpm-view.jpm-tree").count() == 1


def test_table_and_the_picture_on_hover_and_click(view_page: Any) -> None:
    host = view_page.mount("tree", sample_tree())
    rows = host.locator("tr.jpm-tree-row")
    assert rows.count() == 3
    assert rows.nth(0).locator("td").all_inner_texts() == [
        "60", "float32[4000, 1000]", "P('data', None) · split dim 0 4× over data; replicated over model", "3.8 MiB",
        "[0].mu['layer0']['w'], [0].mu['layer1']['w'], [0].mu['layer2']['w'], [0].mu['layer3']['w'], "
        "[0].mu['layer4']['w'], [0].mu['layer5']['w'], … and 54 more"]
    assert "121 array leaves in 3 layouts" in host.locator(".jpm-head").first.inner_text()
    assert "static leaves (not arrays, not shipped): 2 · function ×2 (.activation, .final_activation)" in host.inner_text()
    # The first row's picture is there from the start: the sharding view's drawing, 4 row blocks.
    assert rows.nth(0).get_attribute("aria-selected") == "true"
    assert picture_name(host) == "opt_state[0].mu['layer0']['w']"
    assert host.locator(".jpm-tree-picture .jpm-block").count() == 4
    assert host.locator(".jpm-sharding").count() == 1  # one picture at a time, whatever the rows
    view_page.shot(host, "tree-opt-state")
    # Hover previews another row's picture; leaving the table goes back to the kept one.
    rows.nth(1).hover()
    assert picture_name(host) == "opt_state[0].mu['layer0']['b']"
    assert host.locator(".jpm-tree-picture").inner_text().startswith("one of 60 leaves: [0].mu['layer0']['b']")
    view_page.page.mouse.move(2, 2)
    assert picture_name(host) == "opt_state[0].mu['layer0']['w']"
    # A click keeps it.
    rows.nth(1).click()
    view_page.page.mouse.move(2, 2)
    assert picture_name(host) == "opt_state[0].mu['layer0']['b']"
    assert [rows.nth(k).get_attribute("aria-selected") for k in range(3)] == ["false", "true", "false"]
    # A layout whose picture was not sent says so.
    rows.nth(2).hover()
    assert host.locator(".jpm-tree-picture .jpm-sharding").count() == 0
    assert "this layout's picture was not sent" in host.locator(".jpm-tree-picture").inner_text()


def test_dark_theme(view_page: Any) -> None:
    host = view_page.mount("tree", sample_tree(), theme="dark")
    host.locator("tr.jpm-tree-row").nth(1).hover()
    cell = host.locator("tr.jpm-tree-row").nth(1).locator("td").nth(2)
    colour = cell.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
    assert colour == ["rgb(255, 255, 255)", "rgb(42, 42, 42)"]  # the theme's text on its panel colour
    view_page.shot(host, "tree-opt-state-dark")


def test_keyboard_moves_and_keeps(view_page: Any) -> None:
    host = view_page.mount("tree", sample_tree())
    rows = host.locator("tr.jpm-tree-row")
    rows.nth(0).focus()
    view_page.page.keyboard.press("ArrowDown")
    assert rows.nth(1).evaluate("e => document.activeElement === e")
    assert picture_name(host) == "opt_state[0].mu['layer0']['b']"
    view_page.page.keyboard.press("Enter")
    assert rows.nth(1).get_attribute("aria-selected") == "true"
    view_page.page.keyboard.press("ArrowUp")
    assert picture_name(host) == "opt_state[0].mu['layer0']['w']"
    rows.nth(0).evaluate("e => e.blur()")
    assert picture_name(host) == "opt_state[0].mu['layer0']['b']"  # focus gone: the kept row


def test_rerender_and_cleanup(view_page: Any) -> None:
    host = view_page.mount("tree", sample_tree())
    view_page.set_state(host, sample_tree("params"))
    assert host.locator(".jpm-tree").count() == 1
    assert picture_name(host) == "params[0].mu['layer0']['w']"
    left = view_page.page.evaluate(
        "() => { const m = window.jpm.mounted.at(-1); m.cleanup(); return [m.model.listenerCount(), m.el.childElementCount]; }"
    )
    assert left == [0, 0]


def test_hostile_strings_are_text(view_page: Any) -> None:
    state = sample_tree(HOSTILE)
    state["type"] = HOSTILE
    state["rows"][0].update(paths=[HOSTILE], more_paths=0, spec=HOSTILE, where=HOSTILE, dtype=HOSTILE)
    state["static"]["groups"][0].update(kind=HOSTILE, paths=[HOSTILE])
    host = view_page.mount("tree", state)
    assert view_page.page.evaluate("window.__xss") is None
    assert host.locator("img").count() == 0
    assert host.locator("tr.jpm-tree-row").nth(0).locator("td").nth(4).inner_text() == HOSTILE
    assert picture_name(host) == HOSTILE + "[0].mu['layer0']['w']"


def test_text_twins_match_python(view_page: Any) -> None:
    state = sample_tree()
    state["rows_omitted"] = {"layouts": 5, "leaves": 1}
    state["static"]["groups_omitted"] = 3
    js = view_page.page.evaluate(
        """async (s) => {
            const m = await import('/js/tree.js');
            return [m.summary(s), s.rows.map(m.layoutText), s.rows.map((r) => m.pathsText(r.paths, r.more_paths)),
                    m.staticText(s), m.omittedText(s)];
        }""",
        state,
    )
    py = [tree_view.summary(state), [tree_view.layout_text(r) for r in state["rows"]],
          [tree_view.paths_text(r["paths"], r["more_paths"]) for r in state["rows"]],
          tree_view.static_text(state), tree_view.omitted_text(state)]
    assert js == py


def test_a_state_from_real_arrays_draws(view_page: Any) -> None:
    import jax
    import numpy as np
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxpar_magic.views.tree_summary import tree_state

    mesh = jax.make_mesh((4, 2), ("data", "model"))
    params = {f"layer{i}": {"w": jax.device_put(np.ones((64, 32), np.float32), NamedSharding(mesh, P("data", "model"))),
                            "b": jax.device_put(np.zeros(32, np.float32), NamedSharding(mesh, P()))} for i in range(30)}
    host = view_page.mount("tree", tree_state("opt_state", optax.adam(1e-3).init(params)))
    assert "cannot draw" not in host.inner_text()
    rows = host.locator("tr.jpm-tree-row")
    assert rows.count() == 3
    for k in range(3):
        rows.nth(k).hover()
        assert host.locator(".jpm-tree-picture .jpm-sharding").count() == 1
    rows.nth(2).hover()  # the (64, 32) w: 4 × 2 blocks, one device each
    assert host.locator(".jpm-tree-picture .jpm-block").count() == 8


def test_static_html_renders_offline(view_page: Any) -> None:
    page = view_page.page
    page.set_content('<!doctype html><meta charset="utf-8"><body style="margin:0;padding:12px">'
                     f'<div id="out" style="width:940px">{inline_styles(tree_view.to_html(sample_tree()))}</div></body>')
    assert page.evaluate("document.scripts.length") == 0
    out = page.locator("#out")
    assert out.locator("table.jpm-tree-table tbody tr").count() == 3
    opened = out.locator("details.jpm-tree-pic").first
    assert opened.locator(".jpm-sharding").bounding_box()["height"] > 40
    closed = out.locator("details.jpm-tree-pic").nth(1)
    assert closed.locator(".jpm-sharding").is_visible() is False
    closed.locator("summary").click()  # a static page still shows a picture on demand
    assert closed.locator(".jpm-sharding").is_visible()
    view_page.shot(out, "static-tree-opt-state")
