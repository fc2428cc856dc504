"""The exercises of one kernel: every run of an exercise cell (`run_exercise`), the check's way to
read the latest (`attempt`), and the `pre_run_cell` hook that watches the other cells.

An exercise cell sets its answers and names of its own; whatever else it changes in the kernel (a
name defined before it, such as the course's constants, helpers or `check`; a hook; a function of
the package; see face/exercises/snapshot.py) is put back and the run is refused in one line: a
check then reads the course's own values, functions and hooks, whatever the exercise cell tried.
"""
from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from .. import checks
from .attempt import GRADED, Attempt, Observed, line_specs, provenance
from .held import digest, held, mutable
from .rerun import RUNNING
from .snapshot import Snapshot, ipython_name

# Called by the magics (face/magics.py) after a magic cell binds its names, while an exercise runs:
# watcher(magic, options, outcome). While it is not empty the magics also compute program facts.
WATCHERS: list[Callable[[str, Any, Any], None]] = []
ATTEMPTS: list[Attempt] = []  # the latest runs, oldest first
_KEPT = 64  # attempts remembered per kernel (each holds its values weakly: held.Held)


class _Kernel:
    """What this kernel has counted: cells run (each exercise body counts with its cell), runs of
    each exercise cell (for the grades), the names each exercise's runs made, and which answers
    the running cell read with attempt()."""

    def __init__(self):
        self.cells = 0
        self.runs: dict[tuple[str, ...], int] = {}
        self.made: dict[tuple[str, ...], set[str]] = {}
        self.read_last: tuple = ((), -1)


KERNEL = _Kernel()


def forget_all() -> None:
    """Forget every run (a test's fresh start)."""
    ATTEMPTS.clear()
    KERNEL.runs.clear()
    KERNEL.made.clear()


def attempt(name: str) -> Attempt:
    """The latest run of the exercise cell whose answers include `name`. The first cell that asks
    grades that run; a later cell asking for the same run gets it voided (face/exercises/__init__.py)."""
    for found in reversed(ATTEMPTS):
        if name in found.answers:
            KERNEL.read_last = (found.answers, KERNEL.cells)
            if found.graded_in is None:
                found.graded_in = KERNEL.cells
            elif found.graded_in != KERNEL.cells and found.voided is None:
                found.voided = GRADED
            return found
    never = Attempt(answers=(name,), finished=True, ok=False)
    never.voided = f"run the exercise cell first (the cell that starts with `%%exercise {name}`)"
    return never


def _graded_now() -> tuple[tuple[str, ...], int] | None:
    """For the check's record (face/checks.py): the answers the running cell read with attempt(),
    and how many times this kernel ran their exercise cell; None if it read none."""
    answers, cell = KERNEL.read_last
    return (answers, KERNEL.runs.get(answers, 0)) if cell == KERNEL.cells else None


checks.graded_now[0] = _graded_now


def run_exercise(shell, answers: tuple[str, ...], body: str, cluster=None) -> None:
    """``%%exercise ANSWERS``: forget the answers, run `body` as a cell, record the run. With a
    `cluster` running, the answers are forgotten in its processes too, and a magic cell's answers
    are read from there.

    Raises :class:`ExerciseStopped` (one line, after the body's own error) when the body failed, and
    :class:`ExerciseRefused` when it changed what it may not (put back first).
    """
    record = Attempt(answers=tuple(answers), namespace=shell.user_ns, body=body)
    KERNEL.runs[record.answers] = KERNEL.runs.get(record.answers, 0) + 1
    ATTEMPTS.append(record)
    del ATTEMPTS[:-_KEPT]
    for name in answers:
        shell.user_ns.pop(name, None)
    if cluster is not None:
        cluster.execute("".join(f"globals().pop({name!r}, None)\n" for name in answers))
    before = Snapshot(shell)
    observed: list[Observed] = []

    def watch(magic, options, outcome) -> None:
        for value in outcome.bindings.values():  # a %%pmap function: its calls keep their program's facts
            if hasattr(value, "keep_facts"):
                value.keep_facts = True
        observed.append(Observed(magic, options, getattr(outcome, "facts", None), held(outcome.bindings),
                                 line_specs(options, shell.user_ns), _placed(options, outcome, body)))

    WATCHERS.append(watch)
    RUNNING.append(record)
    try:
        result = shell.run_cell(body, store_history=False) if body.strip() else None
    finally:
        WATCHERS.remove(watch)
        RUNNING.remove(record)
    record.finished = True
    record.ok = result is None or result.success
    allowed = set(answers) | KERNEL.made.get(record.answers, set()) | {n for run in observed for n in run.placed}
    changed = before.changes(allowed)
    if changed:
        lost = before.restore()
        record.ok = False
        record.voided = refusal(changed, lost)
        raise ExerciseRefused(record.voided)
    made = {name for name in shell.user_ns if name not in before.names and not ipython_name(name)}
    KERNEL.made.setdefault(record.answers, set()).update(made - set(answers))
    if not record.ok:  # plain Python may have set an answer before its error: that one is forgotten too
        for name in answers:
            shell.user_ns.pop(name, None)
        raise ExerciseStopped(answers)
    on_processes = bool(observed) or body.lstrip().startswith("%%cluster")
    values = {name: shell.user_ns[name] for name in answers if name in shell.user_ns}
    if cluster is not None and on_processes:  # the cell ran in every process: its names live there
        record.on_cluster = cluster
        record.observed = observed[-1] if observed else None
    else:
        record.observed, record.provenance = provenance(values, observed, body)
    record.values = held(values)
    record.frozen = {name: digest(value) for name, value in values.items() if mutable(value)}


def _placed(options, outcome, body: str) -> tuple[str, ...]:
    """The inputs a %%shard cell binds again as it laid them out (`--in NAME=SPEC`, the same values on
    the mesh), unless the cell also assigns them."""
    try:
        assigned = assigned_names(body)
    except Exception:  # a body Python refuses ran nothing
        assigned = set()
    given = getattr(options, "in_specs", None) or {}
    return tuple(name for name in outcome.bindings if name in given and name not in assigned)


def refusal(changed: list[str], lost: list[str]) -> str:
    """The one line of a refused exercise run."""
    more = f" (and {len(changed) - 1} more change{'s' if len(changed) > 2 else ''})" if len(changed) > 1 else ""
    kept = (f"{', '.join(lost)} could not be put back" if lost
            else "it is put back")
    rename = (": give yours other names, or let the magic bind only the answers with --out"
              if changed[0].startswith(("rebinds", "deletes")) else "")
    return (f"the exercise cell {changed[0]}{more}: {kept}, and this run does not count (an exercise cell sets its "
            f"answers and names of its own, nothing else{rename})")


class ExerciseStopped(Exception):
    """The exercise cell's code stopped with an error (shown above it): one line, no traceback."""

    def __init__(self, answers):
        names = ", ".join(f"`{n}`" for n in answers)
        which = f"its answer {names} is" if len(answers) == 1 else f"its answers {names} are"
        super().__init__(f"the exercise cell stopped at the error above, so {which} forgotten until the cell runs "
                         "to the end")

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


class ExerciseRefused(Exception):
    """The exercise cell changed what was there before it (put back): one line, no traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"✗ {self}"]


# --- what every cell does to the exercises (a pre_run_cell hook, installed by %load_ext) ---------

def watch_cells(shell) -> None:
    """Install the hook: an exercise cell emptied below its first line forgets its answers (IPython
    refuses an empty cell magic before `%%exercise` could run), and a cell that sets an answer's
    name outside its exercise cell voids the exercise's run."""
    unwatch_cells(shell)
    shell.events.register("pre_run_cell", _before_cell)


def unwatch_cells(shell) -> None:
    if _before_cell in shell.events.callbacks["pre_run_cell"]:
        shell.events.unregister("pre_run_cell", _before_cell)


def _before_cell(info) -> None:
    if RUNNING:  # the exercise's own body, run as a cell; a second cell is a nested run_cell
        record = RUNNING[-1]
        record.cells_seen += 1
        if record.cells_seen > 1 and record.voided is None:
            record.voided = ("the exercise cell ran another cell (get_ipython().run_cell): write the code in "
                             "the exercise cell itself, then run it")
        return
    KERNEL.cells += 1
    source = (getattr(info, "raw_cell", "") or "").lstrip()
    if source.startswith("%%exercise"):
        first, _, body = source.partition("\n")
        if not body.strip():
            _record_empty(first)
        return
    if not ATTEMPTS:
        return
    try:
        assigned = assigned_names(source)
    except Exception:  # a cell we cannot read is one Python will refuse: it sets nothing
        return
    for record in ATTEMPTS:
        hit = sorted(set(record.answers) & assigned)
        if hit and record.voided is None:
            record.voided = (f"`{hit[0]}` was set again by a cell without `%%exercise` at its top: run the "
                             "exercise cell")


def _record_empty(first_line: str) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    answers = tuple(word for word in first_line.split()[1:] if word.isidentifier())
    if shell is None or not answers:
        return
    for name in answers:
        shell.user_ns.pop(name, None)
    ATTEMPTS.append(Attempt(answers=answers, ok=True, finished=True, namespace=shell.user_ns))
    del ATTEMPTS[:-_KEPT]


def assigned_names(source: str) -> set[str]:
    """Names a cell (or the body of its cell magic) assigns or deletes at its top level."""
    from IPython.core.inputtransformer2 import TransformerManager

    text = source.lstrip()
    if text.startswith("%%"):
        text = text.partition("\n")[2]
        if text.lstrip().startswith("%%"):  # a cell magic around another one
            return assigned_names(text)
    tree = ast.parse(TransformerManager().transform_cell(text))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names
