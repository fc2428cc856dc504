"""JupyterLab end to end: a real server and kernel, the example notebook run in Chromium, and our
live widgets (drawn by their ES modules, not the static HTML) visible on the page.

The server gets its own HOME and Jupyter/IPython folders (no old workspaces, nothing written to
the real home), the news toast and autosave are switched off, and it serves a temporary copy of
the notebook, so nothing is written back into examples/. It is stopped with SIGTERM.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from chromium import artifacts_dir, browser, collect_errors, require_chromium
from notebooks import example_notebooks, expected_views
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NOTEBOOK = next(p for p in example_notebooks() if p.name == "pmap_chapter.ipynb")
# JupyterLab renders a widget output as a Panel (no data-mime-type); static HTML outputs are
# `.jp-RenderedHTMLCommon[data-mime-type="text/html"]` and must not be what we see.
WIDGET_OUTPUT = ".jp-OutputArea-output.lm-Panel"
STATIC_OUTPUT = '.jp-OutputArea-output[data-mime-type="text/html"]'
SERVER_START_S = 90
RUN_ALL_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, proc: subprocess.Popen, url: str, token: str, log: Path) -> None:
        self.proc, self.url, self.token, self.log = proc, url, token, log

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def wait_until_serving(proc: subprocess.Popen, url: str, token: str, log: Path) -> None:
    """Poll /api/status; between polls, wait on the process itself (it must not exit)."""
    for _ in range(int(SERVER_START_S / 0.25)):
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            code = proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"jupyter lab exited with {code}:\n{log.read_text(errors='replace')[-4000:]}")
    pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    require_chromium()
    home, root = tmp_path / "home", tmp_path / "root"
    env = dict(os.environ)
    for name, sub in [("HOME", "home"), ("JUPYTER_CONFIG_DIR", "home/config"), ("JUPYTER_DATA_DIR", "home/data"),
                      ("JUPYTER_RUNTIME_DIR", "home/runtime"), ("IPYTHONDIR", "home/ipython")]:
        env[name] = str(tmp_path / sub)
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    overrides = {
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    }
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "default_setting_overrides.json").write_text(json.dumps(overrides))
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)

    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / "lab.log"
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
        "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0",
    ]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, token, log)
        yield Lab(proc, url, token, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return artifacts_dir()


def run_all_and_check(page, lab: Lab, expected: list[tuple[int, str]], artifacts: Path) -> None:
    page.goto(f"{lab.url}/lab/tree/{NOTEBOOK.name}?token={lab.token}")
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(timeout=SERVER_START_S * 1000)

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # Done when every code cell has an execution count and the kernel is idle again. (Run All
    # goes on past the cell tagged raises-exception, as nbclient does.)
    page.wait_for_function(
        """() => {
            const panel = window.jupyterapp.shell.currentWidget;
            if (!panel || !panel.content) return false;
            const cells = panel.content.widgets.filter(c => c.model.type === 'code');
            const done = cells.every(c => c.model.executionCount !== null);
            return done && panel.sessionContext.session?.kernel?.status === 'idle';
        }""",
        timeout=RUN_ALL_S * 1000,
    )

    page.locator(f"{WIDGET_OUTPUT} .jpm-view").nth(len(expected) - 1).wait_for(state="attached", timeout=60_000)
    kinds = page.evaluate(
        """sel => [...document.querySelectorAll(sel)].map(
               el => [...el.classList].find(c => c.startsWith('jpm-') && c !== 'jpm-view'))""",
        f"{WIDGET_OUTPUT} .jpm-view",
    )
    assert kinds == [f"jpm-{k}" for _, k in expected], f"live views {kinds}, expected {expected}"
    assert page.locator(f"{STATIC_OUTPUT} .jpm-view").count() == 0, "JupyterLab fell back to static HTML"
    widget_errors = page.locator(WIDGET_OUTPUT).filter(has_text="Error displaying widget").count()
    assert widget_errors == 0, "JupyterLab could not display some widgets"

    for kind in ("devices", "results"):
        view = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-{kind}").first
        view.scroll_into_view_if_needed()
        assert view.is_visible(), f"the {kind} view is not visible"
        box = view.bounding_box()
        assert box and box["width"] >= 300 and box["height"] >= 60, f"the {kind} view is too small: {box}"
        view.screenshot(path=str(artifacts / f"jupyterlab-{kind}.png"))

    devices_text = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-devices").first.inner_text()
    assert "8" in devices_text and "cpu" in devices_text.lower(), devices_text
    ring = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-results").filter(has_text="collective-permute")
    assert ring.count() == 1, "the ppermute cell's view does not list its collective-permute"
    # The whole window, scrolled to the ring: Lab 4 paints off-screen cells lazily
    # (content-visibility), so wait until the view is really in the viewport.
    ring.first.scroll_into_view_if_needed()
    expect(ring.first).to_be_in_viewport(ratio=0.5)
    page.screenshot(path=str(artifacts / "jupyterlab.png"))


def test_notebook_runs_in_jupyterlab_and_shows_live_views(lab: Lab, artifacts: Path):
    expected = expected_views(nbformat.read(NOTEBOOK, as_version=4))
    refused: list[str] = []
    errors: list[str] = []
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)

        def only_local(route):
            if route.request.url.startswith(lab.url + "/"):
                route.continue_()
            else:
                refused.append(route.request.url)
                route.abort()

        context.route("**/*", only_local)
        page = context.new_page()
        collect_errors(page, errors)
        try:
            run_all_and_check(page, lab, expected, artifacts)
        except BaseException as failure:
            page.screenshot(path=str(artifacts / "jupyterlab-failure.png"))
            failure.add_note(f"screenshot: test-artifacts/jupyterlab-failure.png\nserver log:\n{lab.log_tail()}")
            raise
        finally:
            context.close()

    assert not errors, errors
    assert not refused, f"JupyterLab tried to reach the network: {refused}"
    assert lab.proc.poll() is None, lab.log_tail()
