"""A notebook someone else executed, opened in JupyterLab: every view readable and laid out.

One fixed tour (``%devices``, two ``%%pmap`` cells, one with ``--collectives``, ``%mesh``,
``%%shard``, ``%sharding`` and a ``--plan``), executed once by nbclient, then opened without
running anything, as a teacher's students open it:

* untrusted (Lab renders our ``text/html`` through its sanitizer, no widgets), in the light and the
  dark theme, and 700 px wide with the file browser open;
* trusted but saved without widget state (ipywidgets shows "Error displaying widget: model not
  found" in each widget's place: the static twin beside it must show);
* trusted with widget state (the live widgets draw and hide their static twins).

The assertions are layout facts, not pictures: no view is cut off (it fits, or it scrolls with its
scroll bar showing), the device cards stand in a row, the mesh is a grid, the collectives' device
columns line up. Screenshots land in test-artifacts/ (jupyterlab-static-*.png).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from chromium import browser, collect_errors, screenshot
from playwright.sync_api import expect
from test_jupyterlab import STATUS_BAR_PX, shut_down_kernels

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TOUR = [
    "%load_ext jaxpar_magic\n%devices --simulate 8",
    "import jax.numpy as jnp\nfrom jax import lax\nreadings = jnp.arange(8.0)",
    "%%pmap -a i\ntotal = lax.psum(readings, 'i')\nshare = readings / total",
    "%%pmap -a i --collectives --no-show\nsummed = lax.psum(readings, 'i')\npassed = lax.ppermute(readings, 'i', [(k, (k + 1) % 8) for k in range(8)])",
    "%mesh data=4 model=2",
    "x = jnp.arange(64.0).reshape(8, 8)\nw = jnp.ones((8, 4))",
    "%%shard --in x=data,None w=None,model\ny = x @ w",
    "%sharding x",
    "%%shard --plan --hardware tpu-v5e --in x=data,None w=None,model\nz = jnp.tanh(x @ w)",
]
#: The views the tour shows, in page order.
KINDS = ["devices", "results", "collectives", "mesh", "sharding", "sharding", "sharding", "sharding", "plan"]
TOP = ".jpm-view:not(.jpm-view .jpm-view)"

#: Layout facts about every top-level view on the page (for the views a person can see).
FACTS_JS = """(v) => {
    const kind = [...v.classList].find((c) => c.startsWith('jpm-') && c !== 'jpm-view');
    const box = v.getBoundingClientRect();
    const area = v.closest('.jp-OutputArea-output') || v.parentElement;
    const clipped = [];
    for (const e of v.querySelectorAll('*')) {
        const r = e.getBoundingClientRect();
        if (!r.width || !r.height) continue;
        let s = e.parentElement, inScroller = false;
        while (s && s !== v.parentElement) {
            const o = getComputedStyle(s).overflowX;
            if ((o === 'auto' || o === 'scroll') && s.scrollWidth > s.clientWidth) { inScroller = true; break; }
            s = s.parentElement;
        }
        if (!inScroller && r.right > area.getBoundingClientRect().right + 1) clipped.push(`${e.tagName}.${e.className}`);
    }
    const scrollers = [v, ...v.querySelectorAll('*')].filter((s) => {
        const o = getComputedStyle(s).overflowX;
        return (o === 'auto' || o === 'scroll') && s.scrollWidth > s.clientWidth + 1;
    }).map((s) => ({cls: s.className, bar: s.offsetHeight - s.clientHeight}));
    const tops = (q) => [...v.querySelectorAll(q)].map((e) => Math.round(e.getBoundingClientRect().top));
    const lefts = (q) => [...v.querySelectorAll(q)].map((e) => Math.round(e.getBoundingClientRect().left));
    return {kind, width: box.width, height: box.height, text: v.innerText.slice(0, 80), clipped: clipped.slice(0, 5),
            scrollers, cardTops: tops('.jpm-card'), cellTops: tops('.jpm-cell'), cellLefts: lefts('.jpm-cell'),
            colour: getComputedStyle(v).color, chipBorder: (v.querySelector('.jpm-chip') ? getComputedStyle(v.querySelector('.jpm-chip')).borderTopStyle : null)};
}"""


@functools.cache
def executed_tour() -> nbformat.NotebookNode:
    """The tour, run once per test run by nbclient with its widget state stored (JupyterLab's and
    Notebook 7's tests open copies of it)."""
    from notebooks import once_per_run

    return once_per_run("jupyterlab-tour", _run_tour)


def _run_tour() -> nbformat.NotebookNode:
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
    from notebooks import CELL_TIMEOUT_S, RUNS

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in TOUR])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jpm-tour-") as cwd:  # cleanup_kc: see notebooks._execute
        NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, startup_timeout=120, resources={"metadata": {"path": cwd}},
                       store_widget_state=True).execute(cleanup_kc=True)
    RUNS.append(("the JupyterLab tour", time.monotonic() - started))
    return nb


@pytest.fixture
def tour() -> nbformat.NotebookNode:
    return executed_tour()


def lab_root(lab) -> Path:
    """The folder the server serves (its --ServerApp.root_dir)."""
    return Path(next(a for a in lab.proc.args if a.startswith("--ServerApp.root_dir=")).split("=", 1)[1])


def place(lab, tour, name: str, *, trusted: bool, state: bool) -> str:
    nb = nbformat.from_dict(tour)
    if not state:
        nb.metadata.pop("widgets", None)
    path = lab_root(lab) / name
    nbformat.write(nb, path)
    if trusted:  # signed with the server's own secret (its JUPYTER_DATA_DIR), as `jupyter trust` does
        env = {**os.environ, "JUPYTER_DATA_DIR": str(lab_root(lab).parent / "home" / "data"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        subprocess.run([sys.executable, "-m", "jupyter", "trust", str(path)], check=True, capture_output=True, env=env)
    return name


def open_notebook(page, lab, name: str, *, theme: str | None = None, sidebar: bool = False) -> None:
    page.goto(f"{lab.url}/lab/workspaces/{Path(name).stem}/tree/{name}?token={lab.token}")
    page.locator("#jp-main-statusbar").wait_for(timeout=90_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget?.content?.widgets?.length > 0",
                           timeout=90_000)
    if theme:
        page.evaluate("t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", theme)
        page.wait_for_function("t => document.body.dataset.jpThemeName === t", arg=theme, timeout=30_000)
    if sidebar:
        page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    page.locator(f".jp-OutputArea-output {TOP}").nth(len(KINDS) - 1).wait_for(state="attached", timeout=60_000)


def view_facts(page) -> list[dict]:
    """Facts of every view a person can see, each read while it is in the viewport (Lab paints
    off-screen cells lazily: their text is empty and their size a placeholder until then)."""
    views = page.locator(f".jp-OutputArea-output {TOP}")
    facts = []
    for i in range(views.count()):
        view = views.nth(i)
        if not view.evaluate("v => v.offsetParent !== null"):
            continue  # a static twin its live view hid
        view.scroll_into_view_if_needed()
        expect(view).to_be_in_viewport()
        expect(view).to_have_text(re.compile(r"\S"))
        facts.append(view.evaluate(FACTS_JS))
    return facts


def assert_laid_out(facts: list[dict], where: str) -> None:
    assert [f["kind"] for f in facts] == [f"jpm-{k}" for k in KINDS], (where, [f["kind"] for f in facts])
    for f in facts:
        assert f["width"] >= 150 and f["height"] >= 40 and f["text"].strip(), (where, f)
        assert not f["clipped"], (where, f["kind"], f["clipped"])
        assert f["chipBorder"] in (None, "solid"), (where, f["kind"], "the view's styles were lost")
    devices = facts[0]
    assert len(devices["cardTops"]) == 8 and len(set(devices["cardTops"][:2])) == 1, (where, "device cards not in a row", devices)
    mesh = facts[3]  # data=4 down, model=2 across
    assert len(mesh["cellTops"]) == 8 and len(set(mesh["cellTops"])) == 4 and len(set(mesh["cellLefts"])) == 2, \
        (where, "the mesh is not a 4 × 2 grid", mesh)


def test_untrusted_notebook_shows_every_view_laid_out(lab, tour, artifacts):
    name = place(lab, tour, "tour-untrusted.ipynb", trusted=False, state=True)
    shots = []
    for label, viewport, theme, sidebar in [("light", 1280, None, False), ("dark", 1280, "JupyterLab Dark", False),
                                            ("700-sidebar", 700, None, True)]:
        errors: list[str] = []
        with browser() as b:
            context = b.new_context(viewport={"width": viewport, "height": 1000}, device_scale_factor=1)
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(lab.url) else route.abort())
            page = context.new_page()
            collect_errors(page, errors)
            try:
                open_notebook(page, lab, name, theme=theme, sidebar=sidebar)
                assert page.locator(".jp-OutputArea-output.lm-Panel .jpm-view").count() == 0, "widgets drew in an untrusted notebook"
                facts = view_facts(page)
                assert_laid_out(facts, f"untrusted, {label}")
                if label == "700-sidebar":
                    area = page.locator(".jp-OutputArea-output").first.bounding_box()
                    assert area["width"] < 420, f"the output area is {area['width']} px: the sidebar is not open"
                screenshot(page, artifacts / f"jupyterlab-static-untrusted-{label}.png")
                shots.append(label)
            finally:
                if theme:  # the theme is a user setting: put it back for the next test
                    with contextlib.suppress(Exception):
                        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
                context.close()
                with contextlib.suppress(OSError):
                    shut_down_kernels(lab)
    assert shots == ["light", "dark", "700-sidebar"]


def test_trusted_notebook_without_widget_state_keeps_the_static_views(lab, tour, artifacts):
    name = place(lab, tour, "tour-no-state.ipynb", trusted=True, state=False)
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        page = context.new_page()
        try:
            open_notebook(page, lab, name)
            missing = page.locator(".jp-OutputArea-output").filter(has_text="model not found")
            missing.first.wait_for(timeout=60_000)
            assert missing.count() == len(KINDS)
            facts = view_facts(page)
            assert_laid_out(facts, "trusted, no widget state")
            screenshot(page, artifacts / "jupyterlab-static-no-state.png")
        finally:
            context.close()
            with contextlib.suppress(OSError):
                shut_down_kernels(lab)


def test_trusted_notebook_with_widget_state_shows_live_views_only(lab, tour, artifacts):
    name = place(lab, tour, "tour-state.ipynb", trusted=True, state=True)
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
        page = context.new_page()
        try:
            open_notebook(page, lab, name)
            live = page.locator(f".jp-OutputArea-output.lm-Panel {TOP}")
            live.nth(len(KINDS) - 1).wait_for(timeout=60_000)
            facts = view_facts(page)  # visible views only: the static twins are hidden
            assert_laid_out(facts, "trusted, with widget state")
            hidden = page.evaluate("() => [...document.querySelectorAll('.jpm-static')].filter(s => s.offsetParent !== null).length")
            assert hidden == 0, f"{hidden} static twins still show beside their live views"
            screenshot(page, artifacts / "jupyterlab-static-live.png")
        finally:
            context.close()
            with contextlib.suppress(OSError):
                shut_down_kernels(lab)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    from chromium import artifacts_dir

    return artifacts_dir()
