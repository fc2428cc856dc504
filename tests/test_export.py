"""An executed notebook exported with nbconvert and opened offline in Chromium shows every view's
static HTML: visible boxes with the views' own text and styles, not just markup in the source.

Why the export needs care: nbconvert's HTML exporter prefers
``application/vnd.jupyter.widget-view+json`` over ``text/html`` whenever the notebook's metadata
holds that widget's state (nbclient and ``nbconvert --execute`` store it by default). The page
then carries only a placeholder that require.js and the widget manager, both loaded from CDNs,
would fill; offline nothing appears. So in a kernel each view is two outputs (views/base.py): its
static picture, then the widget alone, and the picture shows whatever becomes of the widget. The
README's plain command, a notebook saved without widget state, and ``nbconvert --execute`` on a
notebook never run are tested here.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from chromium import artifacts_dir, browser, collect_errors, require_chromium, screenshot
from notebooks import ROOT, WIDGET_VIEW, example_notebooks, executed, expected_views, rich_outputs

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ORIGIN = "http://export.test"
# A view's root, not a picture another view draws inside itself (a tree view's layouts).
TOP_VIEW = ".jpm-view:not(.jpm-view .jpm-view)"
NOTEBOOKS = example_notebooks()
# What each notebook's views must say on the exported page (besides one view per expected view).
SAYS = {
    "index.ipynb": ["8 cpu devices", "cpu:7"],  # the setup check's device view
    "pmap_chapter.ipynb": [
        "8 cpu devices", "cpu:7",  # the device view
        "%%pmap over 8 devices", "collective-permute",  # result views
    ],
    "sharding_chapter.ipynb": [
        "8 cpu devices",  # the device view
        "data=4 × model=2", "4096 positions",  # mesh views (grid, the abstract pod)
        "P('data', 'model')", "4096 distinct blocks on 4096 devices",  # sharding views
        "%%shard program", "all-reduce",  # the --report views
    ],
    "shard_map_chapter.ipynb": [
        "8 cpu devices",  # the device view
        "each device's block", "c[2:4, 0:4]", "float32[1, 4]",  # result views: blocks and their slices
        "P('x', 'y')", "P(None, None)",  # sharding views of the assembled outputs (replicated, Explicit axes)
        "all_gather", "psum_scatter", "f32[2,4] → f32[16,4]",  # the collective cards
        "compile",  # the --report figures
    ],
    "collectives_chapter.ipynb": [
        "psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute",
        "pshuffle", "axis_index",  # a card for every supported collective
        "f32[8] → f32[8,8]", "f32[8] → f32[64]",  # all_gather, plain and tiled
        "2 groups of 4", "RAN 3×", "collectives of share_of_total()",  # badges are drawn in capitals
        "%%pmap --profile over 8 devices", "WHERE THE STEP WENT",  # the profile's static picture
    ],
    "ecosystem_chapter.ipynb": [
        "64 cpu devices",  # the device view
        "4 array leaves in 4 layouts", "P(None, 'model')",  # tree views: the gradients, the split model
        "%%shard program", "all-reduce",  # the --report view
        "%%shard --plan over 64 devices",  # the plan of the larger model
    ],
    "training_chapter.ipynb": [
        "8 cpu devices",  # the device view
        "%%shard program", "%%shard_map program", "reduce-scatter", "collective-permute",  # the --report views
    ],
    "memory_chapter.ipynb": [
        "8 cpu devices",  # the device view
        "%%shard --plan over 8 devices", "%%shard_map --plan over 8 devices",  # the step's plan, ZeRO-3's
        "stage=4 × data=2",  # the pipeline's mesh
        "%%shard_map program", "reduce-scatter", "collective-permute",  # ZeRO-2's and the pipeline's reports
    ],
    "model_parallel_chapter.ipynb": [
        "8 cpu devices",  # the device view
        "%%shard_map --plan over 8 devices", "%%shard --plan over 8 devices",  # overlap, the crossover
        "model=8",  # the tensor-parallel mesh
        "%%shard_map program", "all-gather", "reduce-scatter", "collective-permute",  # the reports
    ],
    "cluster_chapter.ipynb": [
        "2 processes", "process 1", "cpu:2048",  # the device view, grouped by process
        "process 1: devices 2048–2051",  # sharding views say which process holds each block
        "same on all 8 devices", "52.",  # the psum across processes
        "ppermute", "p1",  # the ring's card, and tiles labelled with their process
    ],
    "capstone.ipynb": [
        "8 cpu devices",  # the device view
        "2 layouts, best first", "DOES NOT FIT",  # --compare of the two starting candidates
        "%%shard --plan over 8 devices",  # the chosen layout's plan
    ],
    "planning_chapter.ipynb": [
        "256 cpu devices", "data=32 × model=8",  # the device and mesh views
        "PLANNED, NOT RUN", "does not fit", "fits:", "tpu-v5e", "all-gather",  # plan views (a badge, in capitals)
        "8 distinct blocks on 256 devices",  # %sharding of a planned array
    ],
}


def readme_export_command() -> list[str]:
    """The README's `jupyter nbconvert --to html ...` line, split into words."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    found = [ln for ln in lines if ln.startswith("jupyter nbconvert --to html")]
    assert len(found) == 1, "README.md must show exactly one `jupyter nbconvert --to html ...` command"
    return shlex.split(found[0])


def count_views(nb) -> int:
    return sum(1 for _, o in rich_outputs(nb) if WIDGET_VIEW in o["data"])


def open_offline(html: str, shot: Path) -> dict:
    """Load `html` with every network request refused; report what a person would see.

    Screenshots: the whole page at `shot`, and next to it the first view of each kind and every
    view drawn as pictures (`<img>`), as `<shot>-<n>-<kind>.png`."""
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
        views = page.locator(TOP_VIEW)
        # Every view's kind, box, visibility and text in one round trip to the page, as Playwright's
        # bounding_box, is_visible and inner_text would read them one view at a time.
        each = page.evaluate(
            """sel => [...document.querySelectorAll(sel)].map(el => {
                   const r = el.getBoundingClientRect(), style = getComputedStyle(el);
                   const box = r.width || r.height ? {x: r.x, y: r.y, width: r.width, height: r.height} : null;
                   return {kind: [...el.classList].find(c => c.startsWith('jpm-') && c !== 'jpm-view'), box,
                           visible: r.width > 0 && r.height > 0 && style.visibility !== 'hidden', text: el.innerText};
               })""", TOP_VIEW)
        facts = {
            "count": len(each),
            "kinds": [v["kind"] for v in each],
            "placeholders": page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count(),
            "boxes": [v["box"] for v in each],
            "visible": [v["visible"] for v in each],
            "texts": [v["text"] for v in each],
            # Pictures inside views (large layouts are drawn as images): loaded and on screen.
            "images": page.evaluate(
                """() => [...document.querySelectorAll('.jpm-view img')].map(img => {
                       const r = img.getBoundingClientRect();
                       return {loaded: img.complete && img.naturalWidth > 0, width: r.width, height: r.height,
                               src: img.src.slice(0, 30)};
                   })"""
            ),
            "chip_radius": page.evaluate(
                "() => { const c = document.querySelector('.jpm-chip');"
                " return c ? getComputedStyle(c).borderTopLeftRadius : null; }"
            ),
            "blocked": blocked,
            "errors": errors,
        }
        screenshot(page, shot, full_page=True)
        first_of_kind = {kind: i for i, kind in reversed(list(enumerate(facts["kinds"])))}
        pictured = page.evaluate(
            """sel => [...document.querySelectorAll(sel)].flatMap((el, i) => el.querySelector('img') ? [i] : [])""",
            TOP_VIEW,
        )
        for i in sorted(set(first_of_kind.values()) | set(pictured)):
            screenshot(views.nth(i), shot.with_name(f"{shot.stem}-{i}-{facts['kinds'][i].removeprefix('jpm-')}.png"))
        context.close()
    return facts


def assert_views_shown(facts: dict, nb, name: str, placeholders: int = 0) -> None:
    expected = [f"jpm-{kind}" for _, kind in expected_views(nb)]
    # With widget state stored, each widget also leaves its (empty, offline) placeholder.
    assert facts["placeholders"] == placeholders, facts["placeholders"]
    assert facts["count"] == count_views(nb), f"{facts['count']} views on the page, {count_views(nb)} in the notebook"
    kinds = ["jpm-sharding" if k == "jpm-tree" else k for k in facts["kinds"]]  # a pytree's one view per name
    assert kinds == expected, f"views on the page {facts['kinds']}, expected {expected}"
    for i, (box, visible, text) in enumerate(zip(facts["boxes"], facts["visible"], facts["texts"], strict=True)):
        assert visible and box and box["width"] >= 300 and box["height"] >= 40, f"view {i} not visible: {box}"
        assert text.strip(), f"view {i} shows no text"
    for image in facts["images"]:
        assert image["loaded"] and image["width"] >= 20 and image["height"] >= 20, f"a view's picture is not shown: {image}"
    texts = "\n".join(facts["texts"])
    missing = [said for said in SAYS[name] if said not in texts]
    assert not missing, f"{name}: the exported views do not say {missing}"
    assert facts["chip_radius"] not in (None, "0px"), "the views' stylesheet did not apply"
    assert not facts["errors"], facts["errors"]
    # Our static HTML loads nothing: the only requests refused are the nbconvert template's own
    # CDN scripts (require.js, MathJax).
    strays = [u for u in facts["blocked"] if not u.startswith(("https://cdnjs.cloudflare.com/", "https://unpkg.com/"))]
    assert not strays, strays


def run_nbconvert(argv: list[str]) -> None:
    """`jupyter nbconvert ARGV`, in this process: the application `jupyter nbconvert` starts, from its
    command-line words, without a new interpreter importing nbconvert for each chapter (2-3 s each).
    `test_nbconvert_execute_offline_shows_the_views` runs the command itself in a subprocess."""
    from nbconvert.nbconvertapp import NbConvertApp

    path = list(sys.path)
    try:
        app = NbConvertApp()
        app.initialize(argv)
        app.start()
    finally:
        sys.path[:] = path  # NbConvertApp puts its working folder first


def test_every_example_has_expectations():
    assert sorted(SAYS) == sorted(p.name for p in NOTEBOOKS), "say what each example's exported page must show"


@pytest.fixture(params=NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def notebook(request) -> Path:
    return request.param


@pytest.fixture
def executed_notebook(notebook):
    require_chromium()  # fail fast (CI) or skip before spending a kernel run
    return executed(notebook)  # a fresh copy of the session's one run


def test_readme_export_command_shows_every_view(notebook, executed_notebook, tmp_path, artifacts):
    """The notebook as nbclient leaves it (widget state stored), exported with the README's command."""
    assert "widgets" in executed_notebook.metadata
    source = tmp_path / "executed.ipynb"
    nbformat.write(executed_notebook, source)
    words = readme_export_command()
    assert words[:2] == ["jupyter", "nbconvert"] and words[-1].endswith(".ipynb")
    run_nbconvert([*words[2:-1], "--output-dir", str(tmp_path), str(source)])
    html = (tmp_path / "executed.html").read_text(encoding="utf-8")
    facts = open_offline(html, artifacts / f"export-{notebook.stem}-readme-command.png")
    assert_views_shown(facts, executed_notebook, notebook.name, placeholders=count_views(executed_notebook))


def test_default_export_without_widget_state_shows_every_view(notebook, executed_notebook, artifacts):
    """A notebook saved without widget state (JupyterLab's default) needs no option at all."""
    from nbconvert import HTMLExporter

    nb = executed_notebook
    nb.metadata.pop("widgets")
    html, _ = HTMLExporter().from_notebook_node(nb)
    facts = open_offline(html, artifacts / f"export-{notebook.stem}-default.png")
    assert_views_shown(facts, nb, notebook.name)


def test_nbconvert_execute_offline_shows_the_views(tmp_path, artifacts):
    """`jupyter nbconvert --to html --execute`, the obvious command, on a notebook never run: the
    page stores the widget state and its placeholders stay empty offline, and every view shows."""
    require_chromium()
    cells = ["%load_ext jaxpar_magic\n%devices --simulate 8",
             "import jax.numpy as jnp\nfrom jax import lax\nx = jnp.arange(8.0)",
             "%%pmap -a i\ntotal = lax.psum(x, 'i')", "%mesh data=4 model=2", "%sharding x"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "fresh.ipynb"
    nbformat.write(nb, source)
    command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute", "--output-dir", str(tmp_path),
               str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=300, cwd=tmp_path)
    html = (tmp_path / "fresh.html").read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-state+json" in html  # the state is stored: the old blank page
    facts = open_offline(html, artifacts / "export-nbconvert-execute.png")
    assert facts["kinds"] == ["jpm-devices", "jpm-results", "jpm-mesh", "jpm-sharding"], facts["kinds"]
    assert facts["placeholders"] == 4 and all(facts["visible"]) and not facts["errors"]
    assert all(box["height"] >= 40 for box in facts["boxes"])
    assert "8 cpu devices" in facts["texts"][0] and "data=4 × model=2" in facts["texts"][2]


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return artifacts_dir()
