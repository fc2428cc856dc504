"""The example notebooks run top to bottom in a real kernel (nbclient), and every view they show
carries all three forms: the live widget, static HTML and plain text."""

from __future__ import annotations

import re

import nbformat
import pytest
from notebooks import WIDGET_STATE, WIDGET_VIEW, example_notebooks, executed, expected_views, rich_outputs

NOTEBOOKS = example_notebooks()
IDS = [p.name for p in NOTEBOOKS]
VIEW_ROOT = re.compile(r'<div class="jpm-view jpm-([a-z][a-z-]*)"')


def code_cells(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def views_of(cell) -> list[str]:
    """The view kinds (``devices``, ``results``, ...) a cell displayed, from their static HTML."""
    kinds = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if WIDGET_VIEW in data:
            match = VIEW_ROOT.search(data.get("text/html", ""))
            kinds.append(match.group(1) if match else "?")
    return kinds


def test_examples_exist():
    assert [p.name for p in NOTEBOOKS] and "pmap_chapter.ipynb" in IDS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in code_cells(nb) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"
    assert "widgets" not in nb.metadata, f"{path.name}: stored widget state; clear it before committing"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_and_every_view_has_three_forms(path):
    nb = executed(path)  # raises on any error a cell is not tagged `raises-exception` for

    widget_outputs = [(i, o) for i, o in rich_outputs(nb) if WIDGET_VIEW in o["data"]]
    assert widget_outputs, f"{path.name} displayed no widget views"
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    for index, output in widget_outputs:
        data = output["data"]
        where = f"{path.name}, cell {index}"
        assert data[WIDGET_VIEW]["model_id"] in state, f"{where}: the widget's state was not stored"
        html = data.get("text/html", "")
        assert VIEW_ROOT.search(html), f"{where}: text/html lacks a view root (class 'jpm-view jpm-<kind>')"
        assert "<script" not in html.lower(), f"{where}: static HTML must not carry scripts"
        assert data.get("text/plain", "").strip(), f"{where}: no text/plain form"

    # `%devices` and `%%pmap` showed exactly the views they should (other magics' views are
    # checked above for their three forms), and cells tagged to fail did fail.
    expected = expected_views(nb)
    for index, cell in code_cells(nb):
        if cell.source.lstrip().startswith("%%pmap"):
            want = [kind for i, kind in expected if i == index]
            assert views_of(cell) == want, f"{path.name}, cell {index}: views {views_of(cell)}, expected {want}"
    devices = [i for i, c in code_cells(nb) for kind in views_of(c) if kind == "devices"]
    assert devices == [i for i, kind in expected if kind == "devices"], f"{path.name}: device views in cells {devices}"
    for index, cell in code_cells(nb):
        if "raises-exception" in cell.metadata.get("tags", []):
            failed = [o for o in cell.outputs if o.output_type == "error" or
                      (o.output_type == "stream" and o.name == "stderr" and "Error" in o.text)]
            assert failed, f"{path.name}, cell {index} is tagged raises-exception but ran cleanly"


@pytest.mark.slow
def test_pmap_chapter_teaches_what_it_says():
    nb = executed(next(p for p in NOTEBOOKS if p.name == "pmap_chapter.ipynb"))
    cells = [c for _, c in code_cells(nb)]

    def cell_with(text):
        return next(c for c in cells if text in c.source)

    def plain(cell):
        return "\n".join(o["data"].get("text/plain", "") for o in cell.outputs if "data" in o)

    def stdout(cell):
        return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")

    assert cells[0].source.splitlines()[:2] == ["%load_ext jaxpar_magic", "%devices --simulate 8"]
    assert "8 cpu devices" in plain(cells[0])
    assert "(True, (8, 3))" in plain(cell_with("array_equal(spread, on_one_device)"))

    collectives = plain(cell_with("lax.pmax(readings"))
    assert "all-reduce" in collectives and "same on all 8 devices: 31." in collectives
    # The markdown explains why three collectives compile to two; keep it true.
    assert "Collectives (2)" in collectives, collectives
    assert plain(cell_with("array_equal(project(lhs, shared_weights), projected)")) == "True"
    ring = plain(cell_with("lax.ppermute("))
    assert "collective-permute" in ring and "7→0" in ring

    gotcha = cell_with("%%pmap\nscaled = examples * 10")
    assert "--split examples" in "".join(o.get("text", "") for o in gotcha.outputs)
    assert [plain(c) for c in cells if c.source == "scaled.shape"] == ["(8, 3)", "(24,)"]  # --split, then --merge

    training = stdout(cell_with("for step in range(200)"))
    first, last = (float(v) for v in re.search(r"loss ([\d.]+) -> ([\d.]+)", training).groups())
    assert last < first / 50, training
    assert "copies identical on all devices: True" in training
    assert any("image/png" in o.get("data", {}) for o in cell_with("plt.subplots").outputs), "no loss plot"

    mesh = plain(cell_with("--mesh outer=2,inner=4"))
    assert "2 groups of 4" in mesh and "1 group of 8" in mesh
    report = plain(cell_with("--report"))
    assert "compile" in report and "FLOPs" in report
