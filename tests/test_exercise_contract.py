"""Every chapter's exercises keep the contract of jaxpar_magic/face/exercises/ (issue 25):

* the exercise cell is tagged `exercise` and starts with `%%exercise NAMES`; the next code cell is
  its check, tagged `check`; the solution waits in a collapsed block after the check;
* the notebook ships the exercise cell unsolved, and a full run with the solution in it makes the
  check print exactly `✓ right`;
* after that full run, the exercise cell emptied (entirely, as the issue words it: then no request
  reaches the kernel and only the check runs again; below its `%%exercise` line; below its magic
  line), as shipped, failing, and given each known cheat or wrong answer (tests/exercise_probes.py)
  makes the check print exactly one line, `✗ not yet: ... Hint: ...`, never a traceback; the
  solution run again is right again.

The probes run in the same kernel right after each check (tests/notebooks.py), so this costs a
few cells per exercise, not another run of the chapter.
"""
from __future__ import annotations

import nbformat
import pytest
from exercise_probes import CHEATS
from notebooks import example_notebooks, executed, exercise_probes, exercises

from jaxpar_magic.face.checks import said

NOTEBOOKS = example_notebooks()
CHAPTERS = [p for p in NOTEBOOKS if p.name != "index.ipynb"]
IDS = [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_chapter_has_an_exercise_with_its_check_and_solution(path):
    nb = nbformat.read(path, as_version=4)
    found = exercises(nb)  # asserts the tags, the check after it and the solution after the check
    assert found, f"{path.name} has no exercise (a code cell tagged `exercise`)"
    tagged_checks = [i for i, c in enumerate(nb.cells) if "check" in c.metadata.get("tags", [])]
    assert tagged_checks == [e.check_index for e in found], "a cell tagged `check` follows no exercise"
    for exercise in found:
        assert exercise.skeleton.strip() != exercise.solution.strip(), (
            f"{path.name}: exercise cell {exercise.index} ships its solution; ship the cell to fill in")
        check = nb.cells[exercise.check_index].source
        assert "check(" in check, f"{path.name}: the check of exercise cell {exercise.index} does not call check()"
        assert f'attempt("{exercise.answers[0]}")' in check, (
            f"{path.name}: the check must read the exercise's latest run with attempt({exercise.answers[0]!r})")


def test_every_known_cheat_belongs_to_an_exercise():
    known = {(p.name, e.answers[0]) for p in CHAPTERS for e in exercises(nbformat.read(p, as_version=4))}
    assert set(CHEATS) <= known, sorted(set(CHEATS) - known)


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_a_solved_exercise_is_right_and_nothing_else_is(path):
    nb = executed(path)
    probes = exercise_probes(path)
    for exercise in exercises(nbformat.read(path, as_version=4)):
        where = f"{path.name}, exercise cell {exercise.index} ({', '.join(exercise.answers)})"
        check = nb.cells[exercise.check_index]
        printed = "".join(said(o) for o in check.outputs).splitlines()
        assert printed == ["✓ right"], f"{where}: the full run's check printed {printed}"
        assert not [o for o in check.outputs if o.output_type == "error"], f"{where}: the check raised"

        tried = probes[exercise.index]
        labels = [p.label for p in tried]
        assert {"emptied entirely", "emptied", "the shipped skeleton", "the solution, then an error"} <= set(labels), labels
        assert len(tried) - 1 >= 4 + len(CHEATS.get((path.name, exercise.answers[0]), [])), labels
        *wrong, again = tried
        for probe in wrong:
            assert len(probe.check_lines) == 1, f"{where}, {probe.label}: the check printed {probe.check_lines}"
            line = probe.check_lines[0]
            assert line.startswith("✗ not yet: ") and " Hint" in line, f"{where}, {probe.label}: {line}"
            assert "Traceback" not in line
        assert again.label == "solution again" and again.check_lines == ["✓ right"], (where, again.check_lines)
        entirely = next(p for p in tried if p.label == "emptied entirely")
        assert entirely.check_lines[0].startswith("✗ not yet: the check already graded"), entirely
        failing = next(p for p in tried if p.label == "the solution, then an error")
        assert failing.check_lines[0].startswith("✗ not yet: the exercise cell stopped with an error"), failing


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_hints_grow_with_each_failure(path):
    """The probes make each check fail several times in a row: its hints go one step further each
    time (`Hint 1/3`, then `Hint 2/3`, ...), and stop at the last."""
    probes = exercise_probes(path)
    for index, tried in probes.items():
        numbers = []
        for probe in tried[:-1]:
            marker = probe.check_lines[0].split(" Hint", 1)[1]
            if marker.startswith(" "):
                numbers.append(int(marker[1:].split("/", 1)[0]))
        assert numbers == sorted(numbers) and len(set(numbers)) > 1, (path.name, index, numbers)


@pytest.mark.slow
def test_the_solution_is_collapsed_until_asked_for(tmp_path):
    """In the exported page (and JupyterLab renders markdown the same way) each solution is a closed
    `<details>` block: its summary says Solution, its code shows only once it is opened."""
    from chromium import browser, require_chromium
    from nbconvert import HTMLExporter

    require_chromium()
    path = next(p for p in CHAPTERS if p.name == "pmap_chapter.ipynb")
    nb = nbformat.read(path, as_version=4)
    html, _ = HTMLExporter().from_notebook_node(nb)
    with browser() as b:
        page = b.new_context(viewport={"width": 1100, "height": 900}).new_page()
        page.route("**/*", lambda route: route.fulfill(status=200, body=html, headers={"content-type": "text/html"})
                   if route.request.url == "http://course.test/" else route.abort())
        page.goto("http://course.test/", wait_until="load")
        solutions = page.locator("details").filter(has=page.locator("summary", has_text="Solution"))
        assert solutions.count() == len(exercises(nb))
        block = solutions.first
        code = block.locator("pre").first
        assert block.get_attribute("open") is None and not code.is_visible()
        block.locator("summary").click()
        assert code.is_visible() and "%%exercise ring_total" in code.inner_text()
