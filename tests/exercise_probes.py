"""What each exercise cell is tried with after a chapter's full run, and whose check must then say
"not yet" (tests/notebooks.py runs them; tests/test_exercise_contract.py reads what the checks said).

Every exercise gets the generic probes: its cell emptied below the `%%exercise` line, emptied but
for its cell magic's line, the skeleton the notebook ships, and the solution followed by a line that
fails. `CHEATS` adds each exercise's known ways to get the value without doing what it asks (issue
25's list first), and wrong answers a student is likely to write.
"""
from __future__ import annotations

# (notebook, first answer name) -> [(label, the exercise cell's whole source)]
CHEATS: dict[tuple[str, str], list[tuple[str, str]]] = {}


def probes_for(notebook: str, exercise) -> list[tuple[str, str]]:
    first, _, body = exercise.solution.partition("\n")
    probes = [("emptied", first + "\n")]
    magic_line = body.splitlines()[0] if body else ""
    if magic_line.startswith("%%"):
        probes.append(("emptied below its magic line", f"{first}\n{magic_line}\n"))
    probes.append(("the shipped skeleton", exercise.skeleton))
    probes.append(("the solution, then an error", exercise.solution.rstrip() + "\nraise RuntimeError('probe: stop')"))
    probes += CHEATS.get((notebook, exercise.answers[0]), [])
    return probes
