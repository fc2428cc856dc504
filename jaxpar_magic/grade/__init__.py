"""Grade a class: ``python -m jaxpar_magic.grade submissions/*.ipynb --out grades.csv``.

Each submitted notebook runs top to bottom in a fresh kernel of this Python, on 8 simulated CPU
devices, with a time limit per cell and per notebook; the kernel is always shut down afterwards.
Then one CSV row per student and exercise:

* ``verdict``: what the exercise's check printed in *this* run (``right``, ``not yet``, or ``not
  graded`` when the check did not run to its line): a grade never trusts the outputs saved in the
  file;
* ``attempts`` and ``hints_used``: the student's own session, from the record each check saved with
  the notebook (face/checks.py); empty when the check never ran there;
* ``note``: the check's line, or why the notebook could not be graded;
* ``part`` and ``points``: for a notebook with a rubric in its metadata (``jaxpar_magic.rubric``, a
  list of ``{"part", "exercise", "points", "graded"}``; examples/capstone.ipynb has one), the part an
  exercise grades and its points when right (0 when not); a part graded by the teacher gets a row
  with verdict ``for the teacher``. With ``--course``, the course's rubric counts, not the file's.

A notebook that stops with an error outside its exercise cells, hangs past its time limit, or
cannot be read gets a row that says so (exercise ``(notebook)``), and the others are still graded.
With ``--course`` (a chapter or a folder of chapters), each check cell runs as the course ships
it, not as the student may have edited it.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COLUMNS = ["student", "notebook", "exercise", "part", "points", "verdict", "attempts", "hints_used", "note"]
from ..face.checks import RECORD_KEY, said  # each check's record of the student's session, its line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxpar_magic.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="the submitted notebooks (one per student)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV file to write")
    parser.add_argument("--course", type=Path, help="the course's chapter(s): run their check cells, not the student's")
    parser.add_argument("--cell-timeout", type=float, default=600, help="seconds one cell may run (default 600)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one notebook may run (default 1800)")
    parser.add_argument("--jobs", type=_positive_int, default=1,
                        help="notebooks graded at once, each in its own kernel (default 1; a kernel on 8 simulated "
                             "devices takes about 1 GB and its own CPU)")
    args = parser.parse_args(argv)
    checks = course_checks(args.course) if args.course else {}
    rubrics = course_rubrics(args.course) if args.course else None

    def graded(path: Path) -> list[dict]:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        rows = grade(path, cell_timeout=args.cell_timeout, timeout=args.timeout, checks=checks, rubrics=rubrics)
        print(f"graded {path}", file=sys.stderr, flush=True)
        return rows

    # Threads are enough: each notebook's work is in its kernel's process; here they only wait on it.
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = [row for found in pool.map(graded, args.notebooks) for row in found]  # in the order given
    with open(args.out, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows for {len(args.notebooks)} notebooks in {args.out}", file=sys.stderr)
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs wants a whole number of at least 1, not {text!r}")
    return int(text)


def exercises_of(nb) -> list[tuple[tuple[str, ...], int]]:
    """(answer names, index of the check cell) for each cell tagged `exercise` that starts with `%%exercise`."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "exercise" not in cell.metadata.get("tags", []):
            continue
        first = cell.source.lstrip().partition("\n")[0].split()
        if not first or first[0] != "%%exercise":
            continue
        check = next((i for i in range(index + 1, len(nb.cells)) if nb.cells[i].cell_type == "code"), None)
        if check is not None and "check" in nb.cells[check].metadata.get("tags", []):
            found.append((tuple(first[1:]), check))
    return found


def course_checks(course: Path) -> dict[tuple[str, ...], str]:
    """The course's check cell for each exercise (by its answer names), from a chapter or a folder."""
    import nbformat

    chapters = sorted(course.glob("*.ipynb")) if course.is_dir() else [course]
    found = {}
    for chapter in chapters:
        nb = nbformat.read(chapter, as_version=4)
        for answers, check in exercises_of(nb):
            found[answers] = nb.cells[check].source
    return found


def course_rubrics(course: Path) -> list[list[dict]]:
    """The rubric of each of the course's chapters that has one."""
    import nbformat

    chapters = sorted(course.glob("*.ipynb")) if course.is_dir() else [course]
    found = [nbformat.read(chapter, as_version=4).metadata.get("jaxpar_magic", {}).get("rubric") for chapter in chapters]
    return [rubric for rubric in found if rubric]


def _rubric(submitted, found: list, rubrics: list | None) -> dict:
    """exercise (its answer names, space-separated, or None for a teacher's part) -> the rubric's entry:
    the course's rubric that grades this notebook's exercises when `rubrics` is given, else the file's."""
    names = {" ".join(answers) for answers, _ in found}
    if rubrics is None:
        rubric = submitted.metadata.get("jaxpar_magic", {}).get("rubric") or []
    else:
        rubric = next((r for r in rubrics if {e["exercise"] for e in r if e.get("exercise")} & names), [])
    return {entry.get("exercise"): entry for entry in rubric if isinstance(entry, dict)} | {
        None: [entry for entry in rubric if isinstance(entry, dict) and not entry.get("exercise")]}


def grade(path: Path, *, cell_timeout: float = 600, timeout: float = 1800, checks: dict | None = None,
          rubrics: list | None = None) -> list[dict]:
    """The rows of one submitted notebook."""
    import nbformat

    student = path.stem
    row = {"student": student, "notebook": path.name}
    try:
        submitted = nbformat.read(path, as_version=4)
    except Exception as error:  # not a notebook, or a broken one
        return [{**row, "exercise": "(notebook)", "verdict": "unreadable", "note": _line(error)}]
    found = exercises_of(submitted)
    rubric = _rubric(submitted, found, rubrics)
    saved = {answers: _saved_record(submitted.cells[check]) for answers, check in found}
    nb = nbformat.from_dict(submitted)  # runs on a copy: the outputs it saved stay what the student saw
    edited = []
    for answers, check in found:
        course = (checks or {}).get(answers)
        if course is not None and course != nb.cells[check].source:
            nb.cells[check].source = course
            edited.append(" ".join(answers))
    problems = _execute(nb, path.parent, cell_timeout, timeout)
    rows = []
    for answers, check in found:
        verdict, line = _verdict(nb.cells[check])
        record = saved[answers] or {}
        note = line + (" (the submission's check cell was edited; the course's ran)"
                       if " ".join(answers) in edited else "")
        part = rubric.get(" ".join(answers)) or {}
        points = (part.get("points", 0) if verdict == "right" else 0) if part else ""
        rows.append({**row, "exercise": " ".join(answers), "part": part.get("part", ""), "points": points,
                     "verdict": verdict, "attempts": record.get("attempts", ""),
                     "hints_used": record.get("hints_used", ""), "note": note})
    for part in rubric[None]:
        rows.append({**row, "exercise": "", "part": part.get("part", ""), "points": "", "verdict": "for the teacher",
                     "note": f"{part.get('points', '')} points, graded by the teacher"})
    if not found:
        problems.insert(0, "no exercise cell (a code cell tagged `exercise` starting with %%exercise)")
    if problems:
        rows.insert(0, {**row, "exercise": "(notebook)", "verdict": "error", "note": "; ".join(problems)})
    return rows


def _execute(nb, folder: Path, cell_timeout: float, timeout: float) -> list[str]:
    """Run every cell of `nb` in a fresh kernel; what went wrong outside the exercise cells, in words."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}  # the course's simulated devices
    # This Python's own kernel, never a kernelspec found in someone's home. Async: a blocking client
    # would wait for a hung cell's output forever, past nbclient's timeout.
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    problems: list[str] = []
    started, index = time.monotonic(), 0
    with tempfile.TemporaryDirectory(prefix="jpm-grade-") as scratch:
        cwd = folder if folder.is_dir() else Path(scratch)
        client = NotebookClient(nb, km=km, timeout=cell_timeout, startup_timeout=120, allow_errors=True,
                                resources={"metadata": {"path": str(cwd)}}, record_timing=False)
        try:
            client.reset_execution_trackers()
            with client.setup_kernel(env=env):
                for index, cell in enumerate(nb.cells):
                    left = timeout - (time.monotonic() - started)
                    if left <= 0:
                        problems.append(f"stopped at cell {index}: the notebook ran past its {timeout:g} s")
                        break
                    client.timeout = max(1, int(min(cell_timeout, left)))
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                    error = next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)
                    tags = cell.metadata.get("tags", [])
                    if error is not None and "exercise" not in tags and "raises-exception" not in tags:
                        problems.append(f"cell {index} raised {error.ename}: {_line(error.evalue)}")
        except CellTimeoutError:
            problems.append(f"cell {index} ran past its {client.timeout} s (it may hang): stopped there")
        except DeadKernelError as error:
            problems.append(f"the kernel died at cell {index} ({_line(error)})")
        except Exception as error:  # the kernel would not start, or nbclient failed: this notebook only
            problems.append(f"could not run the notebook ({type(error).__name__}: {_line(error)})")
        finally:
            if km.has_kernel:  # never leave a kernel behind, whatever happened above
                run_sync(km.shutdown_kernel)(now=True)
    return problems


def _verdict(cell) -> tuple[str, str]:
    text = "".join(said(o) for o in cell.get("outputs", []))
    lines = [line for line in text.splitlines() if line.startswith(("✓", "✗"))]
    if not lines:
        return "not graded", "the check printed no verdict (it did not run, or raised)"
    return ("right" if lines[-1].startswith("✓") else "not yet"), lines[-1]


def _saved_record(cell) -> dict | None:
    records = [o["metadata"][RECORD_KEY] for o in cell.get("outputs", [])
               if o.get("output_type") == "display_data" and RECORD_KEY in o.get("metadata", {})]
    return records[-1] if records else None


def _line(error) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else text[:157] + "..."

