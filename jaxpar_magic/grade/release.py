"""The students' copy of a course (nbgrader's "release" step): ``python -m jaxpar_magic.grade
--release examples/ OUT/`` writes each chapter without its collapsed solutions (the
``<details><summary>Solution</summary>`` blocks under the checks) and without outputs or execution
counts (no printed answer), the exercise cells as shipped, everything else as it is.
"""
from __future__ import annotations

import re
from pathlib import Path

_SOLUTION = re.compile(r"<details>\s*<summary>\s*Solution.*?</details>\s*", re.S | re.I)


def released(nb):
    """A copy of `nb` for students: solutions cut from the markdown (a cell left empty is dropped),
    every code cell without outputs."""
    import copy

    copied = copy.deepcopy(nb)
    kept = []
    for cell in copied.cells:
        if cell.cell_type == "markdown":
            text = _SOLUTION.sub("", cell.source)
            if not text.strip():
                continue
            cell.source = text.rstrip() if text != cell.source else cell.source
        elif cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        kept.append(cell)
    copied.cells = kept
    copied.metadata.pop("widgets", None)  # saved widget state shows outputs too
    return copied


def release(course: Path, out: Path) -> list[Path]:
    """Write the released copy of each chapter of `course` (a chapter or a folder) into `out`."""
    import nbformat

    chapters = sorted(course.glob("*.ipynb")) if course.is_dir() else [course]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for chapter in chapters:
        target = out / chapter.name
        nbformat.write(released(nbformat.read(chapter, as_version=4)), target)
        written.append(target)
    return written
