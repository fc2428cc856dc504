"""The cluster chapter as a lesson: every view is followed by what to notice, the exercise has its
check, the two-host rehearsal shows the commands `scripts/two-hosts` really takes, and the executed
notebook keeps no empty outputs (a status line is replaced by the result, never left blank).
(That it runs and shows the right values: tests/test_notebooks.py, on the same execution.)"""
from __future__ import annotations

import re

import nbformat
import pytest
from notebooks import EXAMPLES, WIDGET_VIEW, executed, expected_views

CHAPTER = EXAMPLES / "cluster_chapter.ipynb"
ROOT = EXAMPLES.parent


def chapter():
    return nbformat.read(CHAPTER, as_version=4)


def test_every_view_is_followed_by_what_to_notice():
    nb = chapter()
    for index in sorted({i for i, _ in expected_views(nb)}):
        following = nb.cells[index + 1]
        assert following.cell_type == "markdown" and following.source.startswith("*What to notice:*"), (
            f"cell {index} shows a view; the cell after it should say what to notice")
        assert len(following.source.splitlines()) == 1


def test_the_exercise_has_a_solution_and_a_friendly_check():
    nb = chapter()
    heading = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                   and re.match(r"#+ Exercise\b", c.source))
    solution, check = nb.cells[heading + 1], nb.cells[heading + 2]
    assert solution.cell_type == check.cell_type == "code"
    assert "# your code here" in solution.source
    asserts = re.findall(r"^assert .+, \(?\"", check.source, re.M)
    assert asserts, "the check asserts with a hint: assert cond, \"hint\""


def test_the_rehearsal_uses_the_helper_as_it_is():
    text = "\n".join(c.source for c in chapter().cells if c.cell_type == "markdown")
    helper = (ROOT / "scripts" / "two-hosts").read_text()
    for command in re.findall(r"scripts/two-hosts (\w+)", text):
        assert re.search(rf"^\s+{command}\)", helper, re.M), f"scripts/two-hosts has no `{command}`"
    assert "%cluster connect --profile pod -n 2" in text


@pytest.mark.slow
def test_the_executed_chapter_keeps_no_empty_output():
    nb = executed(CHAPTER)
    empty = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if output.output_type == "display_data" and WIDGET_VIEW not in data and not any(
                    str(value).strip() for value in data.values()):
                empty.append(index)
    assert not empty, f"cells {empty} keep an empty output (a status line blanked instead of replaced)"
    said = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "right: the mean crossed the process boundary" in said
    # Fresh engines connect Gloo at their first collective; its chatter is filtered at their descriptors.
    assert "Gloo" not in said and "peer ranks" not in said
    assert re.search(r"final loss, averaged over the 8 devices: \d", said)
