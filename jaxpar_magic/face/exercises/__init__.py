"""Exercises in a course notebook: a cell to fill in, and a check that cannot be fooled.

The contract (tests/test_notebooks.py and tests/test_exercise_contract.py hold every chapter to it):

* **The exercise cell** is a code cell tagged ``exercise``. Its first line is
  ``%%exercise ANSWER [ANSWER ...]``, the names its check reads; the rest is the student's code,
  which may itself be a cell magic (``%%pmap``, ``%%shard``, ``%%shard_map``, ...)::

      %%exercise ring_total
      %%pmap -a batch
      ring_total = readings
      # your loop: ...

  Every run first *forgets* the answers (in the kernel, and in every process of a running
  cluster, where a magic cell or a ``%%cluster`` body binds them and where the check reads them
  by ``%cluster gather``'s rules), then runs the rest as a cell of its own, and records the run:
  whether it ended without an error, the objects it bound to the answers, and, for a magic cell,
  the program it ran (its compiled collectives, the line's specs, what it bound). A run that
  fails leaves its answers forgotten; the error shows as usual, then one line says so.
  Notebooks ship the exercise cell as a skeleton the student fills in: it must run without an
  error (so that "Run all" goes through) and leave its check at "not yet".

* **The check cell** is the next code cell, tagged ``check``. It reads the latest run with
  :func:`attempt` and prints exactly one line with :func:`check` (face/checks.py)::

      ring = attempt("ring_total")
      check(ring["ring_total"], total, method=[ring.sends_only("collective-permute")],
            hint=["a nudge", "more", "the most; or open *Solution* below"])

  ``ring["ring_total"]`` is the value *this run of the exercise cell* produced. When there is no
  such value it is a :class:`~jaxpar_magic.face.checks.NotRun` and the check says why: the cell
  was never run, stopped with an error, did not set the name, or a later cell without
  ``%%exercise`` set it again (a cell that assigns an answer's name outside its exercise cell
  voids the exercise's run, so an edited copy of the cell cannot borrow the old answer).
  ``method`` tests how the answer was made, on the program the cell really ran.

* **The solution** follows the check as a markdown cell with a collapsed block, so a student
  opens it on purpose (the tests run every chapter with it in the exercise cell)::

      <details><summary>Solution</summary>

      ```python
      %%exercise ring_total
      ...
      ```
      </details>

Requirements for ``method=`` (each a ``(condition, why)`` pair that names what is wrong):
``.ran("shard_map", m=P(None, "i"))`` (the cell ran as that magic, laying out those inputs so),
``.sends_only("collective-permute", count=None)`` (the compiled program sends something, and only
these collectives), ``.sends_nothing()``, and ``.split_into("m", 8)`` (the input ``m``, as the
magic's ``--in`` placed it this run, has 8 distinct blocks; for ``%%pmap``, ``m`` is mapped over the
devices, not given whole to each with ``--broadcast``), and ``.follows(want, x=other_x)`` (run again
with ``x`` replaced, the cell's answer is ``want``: an answer that ignores its inputs, or adds a value
worked out before, fails; face/exercises/rerun.py, in a sandbox: face/exercises/sandbox.py). Write any other as
``(condition, "why")``.

An exercise cell that runs another cell (``get_ipython().run_cell``) is refused, and the answers
are graded as the cell left them: a dict or NumPy answer changed in place later does not count.
An exercise cell sets its answers and names of its own, nothing else: one that rebinds a name
defined before it (the course's constants, helpers, ``check``) to another value, changes a
function's code, a function of the package or JAX, or registers a hook, is put back and refused in
one line
(face/exercises/runs.py, face/exercises/snapshot.py). The answers must be the outputs of the magic
cell the exercise cell *is* (its line below ``%%exercise``), by identity: an answer computed beside
it, in plain Python or NumPy, "was not computed by the ``%%shard_map`` cell" (face/exercises/attempt.py).

What :class:`Attempt` offers a check: ``attempt[name]`` (an answer), ``.ok``, ``.magic`` (``"pmap"``,
``"shard"``, ``"shard_map"`` or None for plain Python), ``.spec(name)`` (the PartitionSpec the
line's ``--in`` gave ``name``), ``.collectives`` (the compiled program's
collective ops in program order, e.g. ``["all-reduce"]``; None when the cell ran no program of
ours), ``.program`` (every compiled collective with its shape, bytes and groups) and ``.bound``
(every name the magic bound, placed inputs included). All of them are safe to read on a run that
failed: they are None (or a NotRun) and the check reports the failure first.

The tests (tests/notebooks.py) run every chapter with its solutions, and right after each check
try the exercise cell emptied, as shipped, failing, and with the cheats and wrong answers that
tests/exercise_probes.py lists for it: add a new exercise's there.

A cell emptied *entirely* (its ``%%exercise`` line too) never reaches the kernel: JupyterLab and
nbclient send no request for an empty cell, so the kernel cannot tell "run again, empty" from "not
run again". Hence **a run is graded once**: the first cell that calls ``attempt(NAME)`` after a run
of the exercise cell grades it, and any later cell that asks for the same run gets a NotRun that
says to run the exercise cell again. Emptying the whole cell and running it, then the check, so
never shows the old run's ``✓ right``. (Cells are told apart by a counter the ``pre_run_cell`` hook
of runs.py advances, not by execution counts, which a shell running cells without history never moves.)
"""
from __future__ import annotations

from ..checks import NotRun, check  # noqa: F401  (check is re-exported: jaxpar_magic.check)
from .attempt import Attempt, Observed  # noqa: F401
from .method import carried  # noqa: F401
from .runs import (ATTEMPTS, RUNNING, WATCHERS, ExerciseRefused, ExerciseStopped, assigned_names,  # noqa: F401
                   attempt, forget_all, run_exercise, unwatch_cells, watch_cells)
