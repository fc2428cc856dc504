"""Grade a class: ``python -m jaxpar_magic.grade submissions/ --course examples/ --out grades.csv``.

With ``--course`` (a chapter or a folder of chapters, the course as the teacher ships it) each
submission is graded by running *the course's chapter* with the student's exercise cells put in,
matched by exercise name: every other cell, setup, helpers, constants and checks, is the course's
(grade/course.py). Each run is alone: a private copy of the submission in a fresh folder, a fresh
kernel of this Python on 8 simulated CPU devices, a time limit per cell and per notebook, and
afterwards the kernel and every process it started are ended (grade/kernel.py,
grade/processes.py). Every submission is read before any kernel starts, and the CSV is written
once every kernel and every process they started is gone. Without ``--course`` a notebook runs as
submitted, its own cells and checks trusted.

One CSV row per student, notebook and exercise:

* ``student``: who the files say: the submission's folder below the folder common to all the
  submissions (``alice/training_chapter.ipynb`` -> ``alice``), or the file's name when they all lie in
  one folder (``--student-from folder`` or ``file`` chooses); ``notebook``: the path below that folder;
* ``verdict``: ``right`` or ``not yet``, what the exercise's check recorded in *this* run, read from
  the checks' own record, never from printed text or the outputs saved in the file; ``missing`` when
  the course has the exercise and the submission has no cell for it (the note says what was found
  instead: a cell that lost its tag, or changed its names); ``not graded`` when the check recorded no
  verdict (the run stopped before it);
* ``note``: the check's line, or why the notebook could not be graded;
* ``attempts``, ``hints_used``: **the student's own record**, from what each check saved with the
  notebook when the student ran it (face/checks.py); the file is the student's, so they are not
  evidence, and empty when the check never ran there; ``saved_checks``: how many runs of the check
  the submission's saved outputs show (what the grader can count in the file);
* ``part`` and ``points``: for a chapter with a rubric in its metadata (``jaxpar_magic.rubric``, a
  list of ``{"part", "exercise", "points", "graded"}``; examples/capstone.ipynb has one), the part an
  exercise grades and its points when right (0 when not); a part graded by the teacher gets a row
  with verdict ``for the teacher``. With ``--course``, the course's rubric counts, not the file's.

A notebook that stops with an error outside its exercise cells, hangs past its time limit, kills
its kernel or cannot be read gets a row that says so (exercise ``(notebook)``), and the others are
still graded.

``python -m jaxpar_magic.grade --release examples/ OUT/`` writes the students' copy of a course: the
chapters without their collapsed solutions and without outputs (grade/release.py).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..face.checks import RECORD_KEY
from .course import chapter_for, exercises_of, framed, read_chapters
from .kernel import execute, line_of
from .processes import become_subreaper, end_every_descendant

COLUMNS = ["student", "notebook", "exercise", "part", "points", "verdict", "attempts", "hints_used", "saved_checks",
           "note"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxpar_magic.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="the submitted notebooks, or folders of them (searched below, one folder per student)")
    parser.add_argument("--out", type=Path, help="the CSV file to write")
    parser.add_argument("--course", type=Path, help="the course's chapter(s): the frame each submission runs in")
    parser.add_argument("--student-from", choices=("auto", "file", "folder"), default="auto",
                        help="the student column: the submission's folder below the common one, or its file name "
                             "(default: the folder when submissions lie in folders of their own)")
    parser.add_argument("--cell-timeout", type=float, default=600, help="seconds one cell may run (default 600)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one notebook may run (default 1800)")
    parser.add_argument("--jobs", type=_positive_int, default=1,
                        help="notebooks graded at once, each in its own kernel (default 1; a kernel on 8 simulated "
                             "devices takes about 1 GB and its own CPU)")
    parser.add_argument("--release", nargs=2, type=Path, metavar=("COURSE", "OUT"),
                        help="write the students' copy of COURSE to OUT (no solutions, no outputs) and stop")
    args = parser.parse_args(argv)
    if args.release:
        from .release import release

        written = release(*args.release)
        print(f"{len(written)} chapters without solutions in {args.release[1]}", file=sys.stderr)
        return 0
    if not args.notebooks or args.out is None:
        parser.error("give the submitted notebooks and --out grades.csv (or --release COURSE OUT)")
    paths = submissions(args.notebooks)
    if not paths:
        parser.error("no notebook (*.ipynb) among the submissions given")
    chapters = read_chapters(args.course) if args.course else None
    names = students(paths, args.student_from)
    sources = {path: _read(path) for path in paths}  # all of them, before any kernel starts
    become_subreaper()

    def graded(path: Path) -> list[dict]:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        rows = grade(sources[path], names[path], chapters, cell_timeout=args.cell_timeout, timeout=args.timeout)
        print(f"graded {path}", file=sys.stderr, flush=True)
        return rows

    # Threads are enough: each notebook's work is in its kernel's process; here they only wait on it.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = [row for found in pool.map(graded, paths) for row in found]  # in the order given
    end_every_descendant()  # no process a kernel started outlives the grading, nor writes after the CSV
    with open(args.out, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows for {len(paths)} notebooks in {args.out}", file=sys.stderr)
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs wants a whole number of at least 1, not {text!r}")
    return int(text)


def submissions(given: list[Path]) -> list[Path]:
    """The notebooks given, and those below each folder given (checkpoints left out), in order."""
    found = []
    for path in given:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)
    return list(dict.fromkeys(found))


def students(paths: list[Path], source: str = "auto") -> dict[Path, tuple[str, str]]:
    """Each submission's (student, notebook): its path below the folder common to all of them; the
    student is the first folder of that path (`folder`) or the file's name (`file`); `auto` takes the
    folder when the submission lies in one."""
    common = Path(os.path.commonpath([p.resolve().parent for p in paths]))
    found = {}
    for path in paths:
        below = path.resolve().relative_to(common)
        by_folder = source == "folder" or (source == "auto" and len(below.parts) > 1)
        student = below.parts[0] if by_folder and len(below.parts) > 1 else path.stem
        found[path] = (student, below.as_posix())
    return found


def _read(path: Path) -> bytes | Exception:
    try:
        return path.read_bytes()
    except OSError as error:
        return error


def grade(source: bytes | Exception, who: tuple[str, str], chapters: dict | None = None, *,
          cell_timeout: float = 600, timeout: float = 1800) -> list[dict]:
    """The rows of one submission (`source`: its bytes), graded in the course's frame when `chapters`
    (grade/course.py) is given."""
    import nbformat

    student, notebook = who
    row = {"student": student, "notebook": notebook}
    try:
        if isinstance(source, Exception):
            raise source
        submitted = nbformat.reads(source.decode("utf-8"), as_version=4)
    except Exception as error:  # not a notebook, or a broken one
        return [{**row, "exercise": "(notebook)", "verdict": "unreadable", "note": line_of(error)}]
    missing: dict = {}
    if chapters is None:
        nb, found = nbformat.from_dict(submitted), exercises_of(submitted)
        rubric_source = submitted
    else:
        chapter = chapter_for(submitted, Path(notebook).name, chapters)
        if chapter is None:
            return [{**row, "exercise": "(notebook)", "verdict": "error",
                     "note": "no chapter of the course has this notebook's exercises (cells starting %%exercise)"}]
        nb, found, missing = framed(chapters[chapter], submitted)
        rubric_source = chapters[chapter]
    checks = {e.check for e in found if e.check is not None and e.answers not in missing}
    problems, verdicts = execute(nb, source, cell_timeout, timeout, checks, name=Path(notebook).name)
    rubric = _rubric(rubric_source)
    rows = []
    for exercise in found:
        part = rubric.get(exercise.name) or {}
        saved = _saved_records(submitted, exercise.answers)
        if exercise.answers in missing:
            verdict, note = "missing", missing[exercise.answers]
        else:
            verdict, note = _verdict(verdicts.get(exercise.check), exercise, checked=exercise.check is not None)
        points = (part.get("points", 0) if verdict == "right" else 0) if part else ""
        rows.append({**row, "exercise": exercise.name, "part": part.get("part", ""), "points": points,
                     "verdict": verdict, "attempts": saved[-1].get("attempts", "") if saved else "",
                     "hints_used": saved[-1].get("hints_used", "") if saved else "", "saved_checks": len(saved),
                     "note": note})
    for part in rubric[None]:
        rows.append({**row, "exercise": "", "part": part.get("part", ""), "points": "", "verdict": "for the teacher",
                     "note": f"{part.get('points', '')} points, graded by the teacher"})
    if not found:
        problems.insert(0, "no exercise cell (a code cell tagged `exercise` starting with %%exercise)")
    if problems:
        rows.insert(0, {**row, "exercise": "(notebook)", "verdict": "error", "note": "; ".join(problems)})
    return rows


def _verdict(given: list[dict] | None, exercise, checked: bool) -> tuple[str, str]:
    """The verdict the check cell recorded: exactly one, for this exercise's answers."""
    if not checked:
        return "not graded", "the exercise has no check cell (a code cell tagged `check` after it)"
    if not given:
        return "not graded", "the check recorded no verdict (it did not run, or raised)"
    if len(given) > 1:
        return "not yet", (f"the check cell recorded {len(given)} verdicts, where a check gives one (something "
                           "else called check()): not graded right")
    verdict = given[0]
    if list(verdict.get("answers") or []) != list(exercise.answers):
        return "not yet", "the check's verdict was about another exercise"
    return ("right" if verdict.get("verdict") == "right" else "not yet"), str(verdict.get("line", ""))


def _saved_records(submitted, answers: tuple[str, ...]) -> list[dict]:
    """The check records of this exercise saved in the submission's outputs (the student's session)."""
    found = []
    for cell in submitted.cells:
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get(RECORD_KEY) if output.get("output_type") == "display_data" else None
            if isinstance(record, dict) and list(record.get("answers") or []) == list(answers):
                found.append(record)
    return found


def _rubric(nb) -> dict:
    """exercise (its answer names, space-separated, or None for the teacher's parts) -> the rubric's entry."""
    rubric = nb.metadata.get("jaxpar_magic", {}).get("rubric") or []
    return {entry.get("exercise"): entry for entry in rubric if isinstance(entry, dict)} | {
        None: [entry for entry in rubric if isinstance(entry, dict) and not entry.get("exercise")]}
