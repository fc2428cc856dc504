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


def test_the_exercise_is_a_bug_to_find_checked_in_the_kernel():
    """The exercise cell runs on the cluster (`%%exercise mean_all` around `%%cluster`); its check,
    in the kernel, prints one line through check(), never a bare assert."""
    from notebooks import exercises

    nb = chapter()
    (exercise,) = exercises(nb)
    assert exercise.skeleton.splitlines()[:2] == ["%%exercise mean_all", "%%cluster"]
    assert "(local)" in exercise.skeleton and "(x)" in exercise.solution  # the bug, and its fix
    check = nb.cells[exercise.check_index].source
    assert "check(" in check and not re.search(r"^assert ", check, re.M)


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
    assert "[process 0] mean of all 8 values: 6.5" in said  # the exercise's solution, run on the cluster
    # Fresh engines connect Gloo at their first collective; its chatter is filtered at their descriptors.
    assert "Gloo" not in said and "peer ranks" not in said
    assert re.search(r"final loss over the global batch: \d", said)
