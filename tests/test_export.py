"""An executed notebook exported with nbconvert and opened offline in Chromium shows every view's
static HTML: visible boxes with the views' own text and styles, not just markup in the source.

Why the export needs care: nbconvert's HTML exporter prefers
``application/vnd.jupyter.widget-view+json`` over ``text/html`` whenever the notebook's metadata
holds that widget's state (nbclient and ``nbconvert --execute`` store it by default). The page
then carries only a placeholder that require.js and the widget manager, both loaded from CDNs,
would fill; offline nothing appears. Without stored state, nbconvert falls back to the next
mime type, our static HTML. So the README's export command clears the notebook metadata
(``--ClearMetadataPreprocessor.enabled=True``); both routes are tested here.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from chromium import artifacts_dir, browser, collect_errors, require_chromium
from notebooks import ROOT, WIDGET_VIEW, example_notebooks, executed, rich_outputs

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ORIGIN = "http://export.test"
NOTEBOOK = next(p for p in example_notebooks() if p.name == "pmap_chapter.ipynb")


def readme_export_command() -> list[str]:
    """The README's `jupyter nbconvert --to html ...` line, split into words."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    found = [ln for ln in lines if ln.startswith("jupyter nbconvert --to html")]
    assert len(found) == 1, "README.md must show exactly one `jupyter nbconvert --to html ...` command"
    return shlex.split(found[0])


def count_views(nb) -> int:
    return sum(1 for _, o in rich_outputs(nb) if WIDGET_VIEW in o["data"])


def open_offline(html: str, shot: Path) -> dict:
    """Load `html` with every network request refused; report what a person would see."""
    with browser() as b:
        context = b.new_context(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        blocked: list[str] = []

        def serve(route):
            if route.request.url == f"{ORIGIN}/notebook.html":
                route.fulfill(status=200, body=html, headers={"content-type": "text/html; charset=utf-8"})
            else:
                blocked.append(route.request.url)
                route.abort()

        context.route("**/*", serve)
        page = context.new_page()
        errors: list[str] = []
        # The page's own CDN scripts fail to load by design; only errors from our markup matter.
        collect_errors(page, errors, ignore=lambda text: "net::ERR_FAILED" in text)
        page.goto(f"{ORIGIN}/notebook.html", wait_until="load")
        views = page.locator(".jpm-view")
        facts = {
            "count": views.count(),
            "placeholders": page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count(),
            "boxes": [views.nth(i).bounding_box() for i in range(views.count())],
            "visible": [views.nth(i).is_visible() for i in range(views.count())],
            "texts": [views.nth(i).inner_text() for i in range(views.count())],
            "chip_radius": page.evaluate(
                "() => { const c = document.querySelector('.jpm-chip');"
                " return c ? getComputedStyle(c).borderTopLeftRadius : null; }"
            ),
            "blocked": blocked,
            "errors": errors,
        }
        page.screenshot(path=str(shot), full_page=True)
        context.close()
    return facts


def assert_views_shown(facts: dict, expected: int) -> None:
    assert facts["placeholders"] == 0, "widget placeholders were rendered instead of static HTML"
    assert facts["count"] == expected, f"{facts['count']} views on the page, {expected} in the notebook"
    for i, (box, visible, text) in enumerate(zip(facts["boxes"], facts["visible"], facts["texts"], strict=True)):
        assert visible and box and box["width"] >= 300 and box["height"] >= 40, f"view {i} not visible: {box}"
        assert text.strip(), f"view {i} shows no text"
    texts = "\n".join(facts["texts"])
    assert "8 cpu devices" in texts and "cpu:7" in texts  # the device view
    assert "%%pmap over 8 devices" in texts and "collective-permute" in texts  # result views
    assert facts["chip_radius"] not in (None, "0px"), "the views' stylesheet did not apply"
    assert not facts["errors"], facts["errors"]
    # Our static HTML loads nothing: the only requests refused are the nbconvert template's own
    # CDN scripts (require.js, MathJax).
    strays = [u for u in facts["blocked"] if not u.startswith(("https://cdnjs.cloudflare.com/", "https://unpkg.com/"))]
    assert not strays, strays


@pytest.fixture
def executed_notebook():
    require_chromium()  # fail fast (CI) or skip before spending a kernel run
    return executed(NOTEBOOK)  # a fresh copy of the session's one run


def test_readme_export_command_shows_every_view(executed_notebook, tmp_path, artifacts):
    """The notebook as nbclient leaves it (widget state stored), exported with the README's command."""
    assert "widgets" in executed_notebook.metadata
    source = tmp_path / "executed.ipynb"
    nbformat.write(executed_notebook, source)
    words = readme_export_command()
    assert words[-1].endswith(".ipynb")
    command = [sys.executable, "-m", "jupyter", *words[1:-1], "--output-dir", str(tmp_path), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    html = (tmp_path / "executed.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-state+json" not in html  # no embedded state blob either
    facts = open_offline(html, artifacts / "export-readme-command.png")
    assert_views_shown(facts, count_views(executed_notebook))


def test_default_export_without_widget_state_shows_every_view(executed_notebook, artifacts):
    """A notebook saved without widget state (JupyterLab's default) needs no option at all."""
    from nbconvert import HTMLExporter

    nb = executed_notebook
    nb.metadata.pop("widgets")
    html, _ = HTMLExporter().from_notebook_node(nb)
    facts = open_offline(html, artifacts / "export-default.png")
    assert_views_shown(facts, count_views(nb))


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return artifacts_dir()
