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

# The memory and model-parallel chapters: answers that get the number without the reasoning, and
# the likely wrong ones.
CHEATS.update({
    ("memory_chapter.ipynb", "dp_gradient"): [
        ("the one-device gradient, closed over", "%%exercise dp_gradient\ndef dp_gradient(params, x, y):\n"
                                                 "    return whole\n"),
        ("psum instead of pmean", "%%exercise dp_gradient\ndef dp_gradient(params, x, y):\n"
                                  "    return lax.psum(jax.grad(loss_fn)(params, x, y), 'data')\n"),
    ],
    ("memory_chapter.ipynb", "stash_slots"): [
        ("every microbatch, both schedules", "%%exercise stash_slots\ndef stash_slots(stages, micro, kind):\n"
                                            "    return micro\n"),
        ("1F1B without the few-microbatches case", "%%exercise stash_slots\ndef stash_slots(stages, micro, kind):\n"
                                                   "    return micro if kind == 'GPipe' else stages\n"),
    ],
    ("model_parallel_chapter.ipynb", "crossover_tokens"): [
        ("the book's number", "%%exercise crossover_tokens\ncrossover_tokens = 2550\n"),
        ("a wrapped axis", "%%exercise crossover_tokens\ncrossover_tokens = 7 / 8 * 4.59e14 / (2 * 9e10)\n"),
    ],
    ("model_parallel_chapter.ipynb", "kv_owner"): [
        ("the other direction", "%%exercise kv_owner\ndef kv_owner(me, t, n):\n    return (me + t) % n\n"),
        ("no wrap-around", "%%exercise kv_owner\ndef kv_owner(me, t, n):\n    return me - t\n"),
    ],
})


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
