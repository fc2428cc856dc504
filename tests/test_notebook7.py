"""The same tour in Jupyter Notebook 7: opened untrusted, trusted without widget state, and trusted
with it, every view is readable and laid out (tests/test_jupyterlab_static.py has the tour and the
layout facts)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from chromium import browser, screenshot
from test_jupyterlab import jupyter_server, shut_down_kernels
from test_jupyterlab_static import KINDS, TOP, assert_laid_out, place, tour, view_facts  # noqa: F401 (tour: a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def nb7(tmp_path_factory: pytest.TempPathFactory):
    with jupyter_server(tmp_path_factory.mktemp("nb7"), "notebook") as server:
        yield server


@pytest.fixture(scope="module")
def artifacts() -> Path:
    from chromium import artifacts_dir

    return artifacts_dir()


def open_in_notebook7(page, server, name: str) -> None:
    page.goto(f"{server.url}/notebooks/{name}?token={server.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget?.content?.widgets?.length > 0",
                           timeout=90_000)
    page.locator(f".jp-OutputArea-output {TOP}").nth(len(KINDS) - 1).wait_for(state="attached", timeout=60_000)


@pytest.mark.parametrize("case", ["untrusted", "no-state", "live"])
def test_notebook7_shows_every_view_laid_out(nb7, tour, artifacts, case):
    trusted, state = {"untrusted": (False, True), "no-state": (True, False), "live": (True, True)}[case]
    name = place(nb7, tour, f"tour-nb7-{case}.ipynb", trusted=trusted, state=state)
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(nb7.url) else route.abort())
        page = context.new_page()
        try:
            open_in_notebook7(page, nb7, name)
            if case == "live":
                page.locator(f".jp-OutputArea-output.lm-Panel {TOP}").nth(len(KINDS) - 1).wait_for(timeout=60_000)
            if case == "no-state":
                missing = page.locator(".jp-OutputArea-output").filter(has_text="model not found")
                missing.first.wait_for(timeout=60_000)
                assert missing.count() == len(KINDS)
            assert_laid_out(view_facts(page), f"Notebook 7, {case}")
            screenshot(page, artifacts / f"notebook7-{case}.png")
        finally:
            context.close()
            with contextlib.suppress(OSError):
                shut_down_kernels(nb7)
