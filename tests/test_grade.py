"""`python -m jaxpar_magic.grade` (issue 30, "Grades a teacher collects"): a folder with a solved,
an unsolved, a cheating, a crashing and a hanging copy of a small chapter gives one row per
student and exercise, each with the verdict of a fresh run; the broken ones get a row that says so
and the others are still graded.

The chapter is the pmap chapter cut to the cells its ring exercise needs (setup, readings, the
psum, the ring, the exercise, its check and its solution), so that five kernels run in seconds.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import nbformat
import pytest
from notebooks import EXAMPLES, ROOT, exercises

from jaxpar_magic.face.checks import RECORD_KEY, said


def _small_chapter() -> nbformat.NotebookNode:
    nb = nbformat.read(EXAMPLES / "pmap_chapter.ipynb", as_version=4)
    ring = next(e for e in exercises(nb) if e.answers == ("ring_total",))
    keep = [c for c in nb.cells[:ring.index] if c.cell_type == "code" and
            any(word in c.source for word in ("%load_ext", "import jax", "readings =", "total = lax.psum",
                                              "ring = ["))]
    nb.cells = keep + nb.cells[ring.index:ring.check_index + 2]
    return nb, ring


def _copies(folder):
    nb, ring = _small_chapter()
    exercise = next(i for i, c in enumerate(nb.cells) if "exercise" in c.metadata.get("tags", []))
    check = exercise + 1

    def save(name, change):
        copy = nbformat.from_dict(nb)
        change(copy)
        nbformat.write(copy, folder / f"{name}.ipynb")

    def solved(copy):
        copy.cells[exercise].source = ring.solution
        copy.cells[check].outputs = [nbformat.v4.new_output(  # what the student's own session saved
            "display_data", data={"text/plain": "✓ right"}, metadata={RECORD_KEY: {
                "answers": ["ring_total"], "verdict": "right", "attempts": 3, "hints_used": 2}})]

    def cheating(copy):
        copy.cells[exercise].source = ("%%exercise ring_total\n%%pmap -a batch --no-show\n"
                                       "ring_total = lax.ppermute(readings, 'batch', perm=ring) * 0 + 31.0")
        copy.cells[check].source = 'print("✓ right")'  # and the check "fixed" too

    def crashing(copy):
        copy.cells[exercise].source = ring.solution
        copy.cells.insert(1, nbformat.v4.new_code_cell("import not_a_module_anyone_has"))

    def hanging(copy):
        copy.cells[exercise].source = ring.solution
        copy.cells.insert(1, nbformat.v4.new_code_cell("import threading\nthreading.Event().wait()"))

    save("ada", solved)
    save("bob", lambda copy: None)  # as shipped: unsolved
    save("cy", cheating)
    save("dee", crashing)
    save("eve", hanging)
    (folder / "fay.ipynb").write_text("{not json", encoding="utf-8")
    return nb


@pytest.mark.slow
def test_grading_a_folder_of_submissions(tmp_path):
    chapter = tmp_path / "course" / "pmap_chapter.ipynb"
    chapter.parent.mkdir()
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    nbformat.write(_copies(submissions), chapter)
    out = tmp_path / "grades.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "jaxpar_magic.grade", *sorted(map(str, submissions.glob("*.ipynb"))),
                           "--out", str(out), "--course", str(chapter.parent), "--cell-timeout", "20", "--jobs", "2"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    by = {(r["student"], r["exercise"]): r for r in rows}
    assert by["ada", "ring_total"]["verdict"] == "right"
    assert (by["ada", "ring_total"]["attempts"], by["ada", "ring_total"]["hints_used"]) == ("3", "2")
    assert by["bob", "ring_total"]["verdict"] == "not yet" and by["bob", "ring_total"]["attempts"] == ""
    cheat = by["cy", "ring_total"]
    assert cheat["verdict"] == "not yet" and "check cell was edited" in cheat["note"], cheat
    assert by["dee", "(notebook)"]["verdict"] == "error" and "ModuleNotFoundError" in by["dee", "(notebook)"]["note"]
    assert by["dee", "ring_total"]["verdict"] == "right"  # the rest of the notebook still ran
    assert by["eve", "(notebook)"]["verdict"] == "error" and "ran past" in by["eve", "(notebook)"]["note"]
    assert by["eve", "ring_total"]["verdict"] == "not graded"
    assert by["fay", "(notebook)"]["verdict"] == "unreadable"
    # Two at a time (the hanging copy waits out its 20 s beside the others), and the rows still in the
    # order the notebooks were given, each student's together.
    assert [r["student"] for r in rows] == sorted(r["student"] for r in rows)
    assert {r["student"] for r in rows} == {"ada", "bob", "cy", "dee", "eve", "fay"}
    assert ("ada", "(notebook)") not in by and ("bob", "(notebook)") not in by


@pytest.mark.slow
def test_a_check_in_a_kernel_saves_the_sessions_record(tmp_path):
    """What the grades' attempts and hints come from: each check run in a kernel saves a record with
    the notebook (in the metadata of the check's line), counting the exercise's runs and the hints
    shown. The line shows as printed text, and nbconvert exports it without a warning (a record of a
    MIME type of its own made nbconvert warn that it "is not able to be represented")."""
    import warnings

    from nbconvert import HTMLExporter

    from jaxpar_magic.grade import _execute

    nb, ring = _small_chapter()
    exercise = next(i for i, c in enumerate(nb.cells) if "exercise" in c.metadata.get("tags", []))
    wrong, check = nb.cells[exercise], nb.cells[exercise + 1]
    solved = nbformat.from_dict(wrong)
    solved.source = ring.solution
    nb.cells[exercise + 2:exercise + 2] = [solved, nbformat.from_dict(check)]  # unsolved, checked; solved, checked
    assert _execute(nb, tmp_path, cell_timeout=120, timeout=600) == []
    records = [[o.metadata[RECORD_KEY] for o in nb.cells[i].outputs if o.output_type == "display_data"
                and RECORD_KEY in o.metadata] for i in (exercise + 1, exercise + 3)]
    lines = ["".join(said(o) for o in nb.cells[i].outputs) for i in (exercise + 1, exercise + 3)]
    assert lines[0].startswith("✗ not yet: ") and lines[1] == "✓ right\n", lines
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page, _ = HTMLExporter().from_notebook_node(nb)
    unrepresented = [str(w.message) for w in caught if "not able to be represented" in str(w.message)]
    # (the views' widget outputs warn too here: this run saved no widget state; test_export exports them)
    assert not [m for m in unrepresented if "widget-view" not in m], unrepresented
    assert "✓ right" in page
    assert records == [[{"answers": ["ring_total"], "verdict": "not yet", "attempts": 1, "hints_used": 1}],
                       [{"answers": ["ring_total"], "verdict": "right", "attempts": 2, "hints_used": 1}]]


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "1.5"])
def test_jobs_must_be_a_whole_number_of_at_least_one(jobs, tmp_path, capsys):
    from jaxpar_magic.grade import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "ada.ipynb"), "--out", str(tmp_path / "grades.csv"), "--jobs", jobs])
    assert stopped.value.code == 2
    assert f"--jobs wants a whole number of at least 1, not {jobs!r}" in capsys.readouterr().err
    assert not (tmp_path / "grades.csv").exists()
