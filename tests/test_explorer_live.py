"""The layout explorer live in JupyterLab (and Notebook 7): a real server, kernel and Chromium. `%%shard --plan
--explore` on a small matmul; choosing an axis in the page plans that layout in the kernel and the
page's figures become that layout's (peak per device, collectives); a choice made while a compile
runs is coalesced: of the changes made during it, only the latest is planned.

The compile is held deterministically, not timed: the kernel holds the explorer
(`_explorer.holding()`: the view's changes wait before they are planned) while the page makes its
choices, then lets go. The oracle for the figures is arithmetic on the shapes (float32: 4 bytes an element)."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from typing import Any

import pytest
from chromium import artifacts_dir, browser, collect_errors, screenshot
from playwright.sync_api import expect
from test_jupyterlab import SERVER_START_S, WIDGET_OUTPUT, jupyter_server, shut_down_kernels

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MIB = 2**20
NAME = "explorer_live.ipynb"
CELLS = [
    "%load_ext jaxpar_magic\n%devices --simulate 8",
    "import jax\nimport jax.numpy as jnp\n\n"
    "xb = jax.ShapeDtypeStruct((512, 1024), jnp.float32)   # 2 MiB\n"
    "wb = jax.ShapeDtypeStruct((1024, 4096), jnp.float32)  # 16 MiB",
    "%mesh data=4 model=2 --name loose --axis-types auto --no-show",
    "%%shard --plan --explore --mesh loose --in xb=None,None wb=None,None\nyb = xb @ wb",
]


def put_notebook(lab: Any) -> None:
    """The notebook, written into the server's root through its contents API."""
    cells = [{"cell_type": "code", "source": src, "metadata": {}, "outputs": [], "execution_count": None} for src in CELLS]
    model = {"type": "notebook", "format": "json", "content": {
        "cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}}
    request = urllib.request.Request(f"{lab.url}/api/contents/{NAME}?token={lab.token}", data=json.dumps(model).encode(),
                                     method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30).close()


def in_kernel(page: Any, code: str) -> None:
    """Run `code` in the notebook's kernel (as a cell would, without one) and wait for its reply."""
    status = page.evaluate(
        """async code => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const reply = await kernel.requestExecute({ code, store_history: false }).done;
            return reply.content.status;
        }""",
        code,
    )
    assert status == "ok", f"{code!r} in the kernel: {status}"


def axis(view: Any, name: str, dim: int, axis_name: str) -> Any:
    rows = view.locator(".jpm-ex-input")
    row = rows.nth(rows.locator(".jpm-out-name").all_inner_texts().index(name))
    return row.locator(f'.jpm-ex-dim[data-dim="{dim}"] .jpm-ex-axis[data-axis="{axis_name}"]')


def generation(view: Any) -> int:
    return int(view.get_attribute("data-generation"))


def compiles(view: Any) -> int:
    return int(view.get_attribute("data-compiles"))


def choose(view: Any, name: str, dim: int, axis_name: str) -> None:
    """Click a toggle and wait for the kernel's next plan to be drawn."""
    before = generation(view)
    axis(view, name, dim, axis_name).click()
    expect(view).not_to_have_attribute("data-generation", str(before), timeout=120_000)


def specs(view: Any) -> list[str]:
    return view.locator(".jpm-ex-spec").all_inner_texts()


def rows(view: Any, table: str) -> list[list[str]]:
    """A table's rows, the last column (a source line) left out."""
    return [r.split("\t")[:-1] for r in view.locator(f"{table} tbody tr").all_inner_texts()]


def test_choosing_axes_in_the_page_replans_the_layout(lab: Any) -> None:
    explore_live(lab, f"/lab/workspaces/explorer-live/tree/{NAME}", "jupyterlab")


def test_the_explorer_is_live_in_notebook7(tmp_path: Any) -> None:
    with jupyter_server(tmp_path, "notebook") as server:
        explore_live(server, f"/notebooks/{NAME}", "notebook7")


def explore_live(server: Any, path: str, label: str) -> None:
    """Open the notebook at `path`, run it, and drive its explorer from the page (both tests)."""
    put_notebook(server)
    lab = server
    errors: list[str] = []
    shots = artifacts_dir()
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(lab.url + "/") else route.abort())
        page = context.new_page()
        collect_errors(page, errors)
        try:
            page.goto(f"{lab.url}{path}?token={lab.token}")
            # Both front ends expose the app (jupyter_server starts them so): wait for an idle kernel.
            page.wait_for_function(
                """() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status === 'idle'""",
                timeout=SERVER_START_S * 1000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            view = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-explorer")
            view.wait_for(timeout=300_000)
            view.scroll_into_view_if_needed()
            # Everything whole: x 2 MiB + w 16 MiB + y (512 × 4096) 8 MiB on every device, nothing moved.
            expect(view.locator(".jpm-ex-peak b")).to_have_text("26.0 MiB")
            assert specs(view) == ["P(None, None)", "P(None, None)"]
            assert view.locator(".jpm-ex-collectives tbody tr").count() == 0
            first = compiles(view)

            # w's columns over model: w 8 MiB, y's columns too (4 MiB), x whole: 14 MiB, nothing moved.
            choose(view, "wb", 1, "model")
            assert specs(view) == ["P(None, None)", "P(None, 'model')"]
            expect(view.locator(".jpm-ex-peak b")).to_have_text("14.0 MiB")
            assert view.locator(".jpm-ex-collectives tbody tr").count() == 0
            # Then x's rows over data: x 0.5 MiB + w 8 MiB + y 1 MiB.
            choose(view, "xb", 0, "data")
            expect(view.locator(".jpm-ex-peak b")).to_have_text("9.5 MiB")
            assert view.locator(".jpm-ex-diff").inner_text().startswith("since the previous layout: peak −4.5 MiB")
            # x's columns over model as well: each device gathers its 128 rows of x whole (an all-gather
            # of 128 × 1024 floats, 512 KiB) before its matmul; peak 9.5 + 0.25 (that gathered block
            # less the quarter x it holds).
            choose(view, "xb", 1, "model")
            assert specs(view) == ["P('data', 'model')", "P(None, 'model')"]
            assert rows(view, ".jpm-ex-collectives") == [["all-gather", "512.0 KiB", "1"]]
            expect(view.locator(".jpm-ex-peak b")).to_have_text("9.8 MiB")
            assert "+1 all-gather" in view.locator(".jpm-ex-diff").inner_text()
            assert compiles(view) == first + 3
            assert view.locator(".jpm-ex-tried tbody tr").count() == 4
            screenshot(view, shots / f"{label}-explorer-live.png")

            # Coalescing: the kernel holds the explorer, so the next layout's compile waits
            # (the view says "planning"); two more choices made meanwhile leave only the last planned.
            in_kernel(page, "_held = _explorer.holding()")
            axis(view, "wb", 0, "data").click()  # A: w's rows over data too
            expect(view.locator(".jpm-ex-busy")).to_have_count(1, timeout=60_000)
            axis(view, "xb", 1, "model").click()  # B: x's columns whole again (on top of A)
            axis(view, "xb", 0, "data").click()  # C: x's rows whole, columns over model (on top of A)
            in_kernel(page, "_held.release()")
            expect(view).to_have_attribute("data-compiles", str(first + 5), timeout=120_000)
            expect(view.locator(".jpm-ex-busy")).to_have_count(0, timeout=60_000)
            assert specs(view) == ["P(None, 'model')", "P('data', 'model')"]  # C, the latest
            lines = view.locator(".jpm-ex-tried .jpm-ex-line").all_inner_texts()
            assert len(lines) == 6
            assert any("xb=P('data','model') wb=P('data','model')" in line for line in lines), lines  # A ran
            assert not any("xb=P('data',None) wb=P('data','model')" in line for line in lines), lines  # B never did
            current = view.locator(".jpm-ex-tried tr.jpm-ex-current .jpm-ex-line").inner_text()
            assert "xb=P(None,'model') wb=P('data','model')" in current
            assert compiles(view) == first + 5
            screenshot(view, shots / f"{label}-explorer-coalesced.png")

            # The static twin is the record the notebook keeps: the kernel updates it as layouts are tried
            # (while the widget, drawn, keeps it hidden), so a saved, reopened or exported notebook shows every
            # tried layout, not only the first.
            record = page.evaluate(
                """() => window.jupyterapp.shell.currentWidget.content.widgets[3].model.outputs.toJSON()
                         .map((o) => (o.data || {})['text/plain'] || '').join('\\n')""")
            assert record.count("%%shard --plan --mesh data=4,model=2 --axis-types auto ") == 6, record
            assert all(line in record.splitlines() for line in lines), record
            twin = page.locator(".jp-OutputArea", has=view).locator(".jpm-static")
            expect(twin).to_have_count(1)
            expect(twin).to_be_hidden()
        except BaseException as failure:
            page.screenshot(path=str(shots / f"{label}-explorer-live-failure.png"))
            failure.add_note(f"screenshot: test-artifacts/{label}-explorer-live-failure.png\nserver log:\n{lab.log_tail()}")
            raise
        finally:
            context.close()
            with contextlib.suppress(OSError):
                shut_down_kernels(lab)
    if label == "notebook7":
        # Notebook 7's own page throws this while it loads the notebook (no code of ours reads a
        # `schema`; tests/test_notebook7.py does not collect page errors at all): everything else counts.
        errors = [e for e in errors if e != "pageerror: Cannot read properties of undefined (reading 'schema')"]
    assert not errors, errors
