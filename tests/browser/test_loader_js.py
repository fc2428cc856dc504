"""js/loader.js, the `_esm` every view model ships: it takes the view's code and the stylesheet
from the kernel's ViewLibrary model through the widget manager, and draws exactly what the
self-contained bundle draws."""

from __future__ import annotations

from typing import Any

import pytest

from jaxpar_magic.views.base import read_asset


@pytest.mark.parametrize("view", ["devices", "results", "mesh", "sharding"])
def test_loader_draws_what_the_bundle_draws(view_page: Any, samples: Any, view: str) -> None:
    state = samples.basic(view)
    bundled = view_page.mount(view, state, mode="bundle")
    loaded = view_page.mount(view, state, mode="loader")
    assert loaded.inner_html() == bundled.inner_html()
    assert loaded.locator(".jpm-view").count() == 1


def test_many_views_share_one_module_and_one_stylesheet(view_page: Any, samples: Any) -> None:
    page = view_page.page
    hosts = [view_page.mount("results", samples.result(8), mode="loader") for _ in range(3)]
    hosts.append(view_page.mount("devices", samples.devices(8), mode="loader"))
    assert all(h.locator(".jpm-view").count() == 1 for h in hosts)
    styles = page.evaluate("() => [...document.querySelectorAll('style#jpm-views-css')].map(s => s.textContent.length)")
    assert styles == [len(read_asset("views.css"))]
    # One import per view kind for the whole page (the first view's promise is reused).
    assert page.evaluate("() => [...globalThis.__jpmViewModules.keys()].sort()") == ["LIB/devices", "LIB/results"]
    # State changes still redraw through the loaded module.
    view_page.set_state(hosts[0], samples.result(4))
    assert hosts[0].locator(".jpm-view").count() == 1


def test_missing_library_says_so(view_page: Any, samples: Any) -> None:
    host = view_page.mount("results", samples.result(8), mode="loader", lib="IPY_MODEL_gone")
    text = host.inner_text()
    assert "this view's code is not available here" in text and "gone" in text
    # The failure is not cached: a view whose library exists still loads.
    assert view_page.mount("results", samples.result(8), mode="loader").locator(".jpm-results").count() == 1
    assert not view_page.page.evaluate("() => globalThis.__jpmViewModules.has('gone/results')")


@pytest.mark.parametrize("attach", ["before", "after"])
def test_a_drawn_view_hides_its_static_twin(view_page: Any, samples: Any, attach: str) -> None:
    """A kernel shows each view's static picture, then the widget, which hides the picture once drawn;
    JupyterLab renders a widget before it puts the widget's element in the page ("after")."""
    page = view_page.page
    host = view_page.mount("mesh", samples.mesh([2, 4]), mode="loader", twin="0123abcd", attach=attach)
    other = page.locator(".jpm-twin-00ff")
    view_page.mount("mesh", samples.mesh([2, 2]), mode="loader", lib="IPY_MODEL_gone", twin="00ff", attach=attach)
    assert host.locator(".jpm-cell").count() == 8
    page.locator(".jpm-twin-0123abcd").wait_for(state="hidden", timeout=5_000)
    assert other.is_visible(), "a view that could not draw must leave its twin showing"
