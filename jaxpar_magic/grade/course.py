"""The course's notebook is the frame of a graded run (issue 41).

With ``--course``, a submission is graded by running the course's own chapter with the student's
exercise cells put in, matched by exercise name (the names on ``%%exercise``): every other cell,
setup, helpers, constants and checks, is the course's, whatever the submission holds there (an
edited check, a cell that rebinds `check`, a hook, a scratch cell between an exercise and its
check). An exercise the course has and the submission lacks, or whose cell lost its tag or
changed its names, is "missing", with what was found instead.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Exercise:
    """An exercise of a notebook: its answer names, its cell and its check cell (None: no check)."""

    answers: tuple[str, ...]
    index: int
    check: int | None

    @property
    def name(self) -> str:
        return " ".join(self.answers)


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", []) or []


def exercise_line(cell) -> tuple[str, ...] | None:
    """The answer names of a code cell that starts with ``%%exercise``, else None."""
    if cell.get("cell_type") != "code":
        return None
    words = cell.get("source", "").lstrip().partition("\n")[0].split()
    return tuple(words[1:]) if words and words[0] == "%%exercise" else None


def exercises_of(nb) -> list[Exercise]:
    """Each code cell tagged `exercise` that starts with `%%exercise`, with its check: the first code
    cell tagged `check` after it and before the next exercise (a scratch cell between is skipped)."""
    cells, found = nb.cells, []
    for index, cell in enumerate(cells):
        answers = exercise_line(cell)
        if answers is None or "exercise" not in _tags(cell):
            continue
        check = None
        for later in range(index + 1, len(cells)):
            if "exercise" in _tags(cells[later]) and exercise_line(cells[later]) is not None:
                break
            if cells[later].cell_type == "code" and "check" in _tags(cells[later]):
                check = later
                break
        found.append(Exercise(answers, index, check))
    return found


def read_chapters(course: Path) -> dict[str, object]:
    """The course's chapters by file name (a chapter, or a folder of them), read once."""
    import nbformat

    paths = sorted(course.glob("*.ipynb")) if course.is_dir() else [course]
    return {path.name: nbformat.read(path, as_version=4) for path in paths}


def chapter_for(submitted, file_name: str, chapters: dict) -> str | None:
    """The course chapter a submission answers: the one of the same file name, else the one that
    shares most exercise names with it (tagged or not), else None."""
    if file_name in chapters:
        return file_name
    theirs = {name for cell in submitted.cells for name in (exercise_line(cell) or ())}
    scores = {name: len(theirs & {a for e in exercises_of(nb) for a in e.answers}) for name, nb in chapters.items()}
    best = max(scores, key=scores.get, default=None)
    return best if best is not None and scores[best] > 0 else None


def framed(chapter, submitted) -> tuple[object, list[Exercise], dict[tuple[str, ...], str]]:
    """(the course's chapter with the submission's exercise cells in it, its exercises, and for each
    exercise the submission lacks: what was found instead). The frame holds no outputs."""
    frame = copy.deepcopy(chapter)
    for cell in frame.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    theirs = [(index, exercise_line(cell), "exercise" in _tags(cell)) for index, cell in enumerate(submitted.cells)
              if exercise_line(cell) is not None]
    exercises = exercises_of(frame)
    ours = {e.answers for e in exercises}
    missing = {}
    for exercise in exercises:
        tagged = [index for index, answers, is_tagged in theirs if answers == exercise.answers and is_tagged]
        if tagged:
            frame.cells[exercise.index].source = submitted.cells[tagged[-1]].source
        else:
            missing[exercise.answers] = _found_instead(exercise.answers, theirs, ours)
    return frame, exercises, missing


def _found_instead(answers: tuple[str, ...], theirs: list, ours: set) -> str:
    """Why an exercise is missing, naming the cells that look like it (cells numbered from 1)."""
    line = f"`%%exercise {' '.join(answers)}`"
    untagged = [index for index, found, is_tagged in theirs if found == answers and not is_tagged]
    if untagged:
        return f"cell {untagged[-1] + 1} starts with {line} but is not tagged `exercise`"
    others = [(index, found, is_tagged) for index, found, is_tagged in theirs if found not in ours]
    if others:
        index, found, is_tagged = min(others, key=lambda other: (not set(other[1]) & set(answers), other[0]))
        tag = "" if is_tagged else ", not tagged `exercise`"
        return f"no cell {line}; found `%%exercise {' '.join(found)}` instead (cell {index + 1}{tag})"
    return f"no cell {line} (a code cell tagged `exercise`)"
