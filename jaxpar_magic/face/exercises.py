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
magic's ``--in`` placed it this run, has 8 distinct blocks), and ``.follows(want, x=other_x)`` (run again
with ``x`` replaced, the cell's answer is ``want``: an answer that ignores its inputs, or adds a value
worked out before, fails; face/rerun.py). Write any other as ``(condition, "why")``.

An exercise cell that runs another cell (``get_ipython().run_cell``) is refused, and the answers
are graded as the cell left them: a dict or NumPy answer changed in place later does not count.

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
below advances, not by execution counts, which a shell running cells without history never moves.)
"""
from __future__ import annotations

import ast
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import checks
from .checks import NotRun, check  # noqa: F401  (check is re-exported: jaxpar_magic.check)

# Called by the magics (face/magics.py) after a magic cell binds its names, while an exercise runs:
# watcher(magic, options, outcome). While it is not empty the magics also compute program facts.
WATCHERS: list[Callable[[str, Any, Any], None]] = []

_KEPT = 64  # attempts remembered per kernel (each holds its values weakly: `_Held`)


class _Held:
    """A run's value, held so that it does not keep the user's arrays alive (`del answer` frees
    them): by a weak reference where the value takes one, as itself when it holds no array (a
    number), else by identity (a dict of arrays), found again in the namespace."""

    __slots__ = ("ref", "ident")

    def __init__(self, value):
        self.ident = id(value)
        try:
            self.ref = weakref.ref(value)
        except TypeError:
            self.ref = None if _holds_arrays(value) else (lambda: value)

    def matches(self, candidate) -> bool:
        return candidate is self.get() if self.ref is not None else id(candidate) == self.ident

    def get(self, namespace=None, name=None):
        """The value, or _GONE (freed, or held by identity and no longer under `name` in `namespace`)."""
        if self.ref is not None:
            value = self.ref()
            return _GONE if value is None else value
        candidate = _GONE if namespace is None else namespace.get(name, _GONE)
        return candidate if candidate is not _GONE and id(candidate) == self.ident else _GONE


def _holds_arrays(value) -> bool:
    import jax

    from ..cell.inputs import is_array

    return any(is_array(leaf) for leaf in jax.tree.leaves(value))


def _held(values: dict) -> dict:
    return {name: _Held(value) for name, value in values.items()}


@dataclass
class Observed:
    """A magic cell an exercise ran: what its line said and what its run produced."""

    magic: str
    options: Any  # the line's options record (face/lines.py)
    facts: Any  # the compiled program's facts (stages/run/program.ProgramFacts), or None
    bound: dict  # the names it bound: name -> _Held
    specs: dict = field(default_factory=dict)  # --in's specs, `@NAME` read as the run read it


def _line_specs(options, namespace: dict) -> dict:
    """Each `--in` spec as the run used it: a PartitionSpec, or for `NAME=@SPECS` (and the twins'
    pytrees of specs) the pytree of specs itself, read from the namespace when the cell ran."""
    from jax.sharding import PartitionSpec

    from ..cell.specs import SpecTree
    from ..cell.treespecs import GivenSpecs

    specs = {}
    for name, spec in (getattr(options, "in_specs", None) or {}).items():
        if isinstance(spec, SpecTree):
            specs[name] = namespace.get(spec.name)
        elif isinstance(spec, GivenSpecs):
            specs[name] = spec.tree
        else:
            specs[name] = PartitionSpec(*spec)
    return specs


@dataclass
class Attempt:
    """One run of an exercise cell."""

    answers: tuple[str, ...]
    ok: bool = False
    finished: bool = False
    values: dict = field(default_factory=dict)  # answer -> _Held
    observed: Observed | None = None
    on_cluster: Any = None  # the cluster the answers live on, when one was running
    voided: str | None = None  # why this run no longer counts
    namespace: dict | None = None
    graded_in: int | None = None  # the cell (by _cells_run) that first read this run with attempt()
    body: str | None = None  # the cell's code below `%%exercise`, to run again on other inputs
    frozen: dict = field(default_factory=dict)  # each mutable answer's _digest as the cell left it
    cells_seen: int = 0  # cells run while the body ran: more than its own is a nested run_cell

    def __getitem__(self, name: str):
        """The value this run bound to the answer `name`, or a NotRun saying why there is none."""
        problem = self._problem()
        if problem is not None:
            return problem
        if self.on_cluster is not None:
            return self._gather(name)
        if name not in self.values:
            return NotRun(f"the exercise cell's last run did not set `{name}`")
        held = self.values[name]
        if self.namespace is not None:
            current = self.namespace.get(name, _GONE)
            if current is _GONE or not held.matches(current):
                return NotRun(f"`{name}` changed after the exercise cell ran: run the exercise cell again")
            value = current
        else:
            value = held.get()
            if value is _GONE:
                return NotRun(f"`{name}` is gone: run the exercise cell again")
        if name in self.frozen and _digest(value) != self.frozen[name]:  # changed in place since
            return NotRun(f"`{name}` was changed in place after the exercise cell ran: run the exercise cell again")
        return value

    def _problem(self) -> NotRun | None:
        if self.voided is not None:  # the graded run read again: the same hint, not the next one
            return NotRun(self.voided, again=self.voided == _GRADED)
        if not self.finished:
            return NotRun("the exercise cell has not finished a run")
        if not self.ok:
            return NotRun("the exercise cell stopped with an error: fix it and run it again")
        return None

    def _gather(self, name: str):
        from .rerun import one_value

        try:
            return one_value(self.on_cluster.gather([name])[name])
        except Exception:  # not defined on the processes, or the cluster is gone
            return NotRun(f"the exercise cell's last run did not set `{name}` on the cluster")

    @property
    def magic(self) -> str | None:
        return None if self._problem() is not None or self.observed is None else self.observed.magic

    def spec(self, name: str):
        """The PartitionSpec the magic line's ``--in`` gave input `name` (None if it gave none)."""
        if self.magic is None:
            return None
        return self.observed.specs.get(name)

    @property
    def program(self) -> list | None:
        """The compiled program's collectives (cell/hlo.Collective), or None without a program: a
        block cell's, or for a %%pmap function its latest call's (in the check cell, say)."""
        if self.magic is None:
            return None
        facts = self.observed.facts
        for function in self._functions().values():
            facts = facts if facts is not None else function.facts
        return None if facts is None else list(facts.collectives)

    def _functions(self) -> dict:
        """The %%pmap functions the run bound (ParallelFunction), by name."""
        from ..stages.run.pmap_function import ParallelFunction

        return {n: v for n, v in self.bound.items() if isinstance(v, ParallelFunction)}

    def _no_program(self) -> str:
        """Why there is no program to check: plain Python, or a %%pmap function not called yet."""
        if self._functions():
            name = next(iter(self._functions()))
            return (f"call `{name}` before the check reads its program (a %%pmap function compiles when it is "
                    f"called: `check({name}(x), ..., method=[...])` calls it first)")
        return "write it as a magic cell (the exercise checks the program it compiles)"

    @property
    def collectives(self) -> list[str] | None:
        """The compiled program's collective ops in program order, e.g. ``["all-gather", "all-reduce"]``."""
        program = self.program
        return None if program is None else [c.op for c in program]

    @property
    def bound(self) -> dict:
        if self.magic is None:
            return {}
        found = {name: held.get(self.namespace, name) for name, held in self.observed.bound.items()}
        return {name: value for name, value in found.items() if value is not _GONE}

    # --- requirements on how the answer was made, for check(..., method=[...]) --------------------

    def ran(self, magic: str, **specs) -> tuple[bool, str]:
        """The cell ran as `%%magic`, laying out each named input as given (``m=P(None, "i")``)."""
        wanted = " ".join(f"{name}={_spec_text(spec)}" for name, spec in specs.items())
        why = f"run it as the `%%{magic}` cell it was" + (f", with `--in {wanted}`" if wanted else "")
        if self.magic != magic:
            return False, why
        for name, spec in specs.items():
            if _normal(self.spec(name)) != _normal(spec):
                layout = f"--in {name}={_spec_text(spec)}"
                return False, f"keep `{layout}` on the `%%{magic}` line: the exercise is about that layout"
        return True, why

    def sends_only(self, *ops: str, count: int | None = None, most_bytes: int | None = None) -> tuple[bool, str]:
        """The compiled program sends something, and only these collectives (``count`` of them, whose
        buffers on one device add up to at most ``most_bytes``: `carried`)."""
        sent = self.collectives
        allowed = " or ".join(_plural([op]) for op in ops)
        if sent is None:
            return False, f"{self._no_program()}, using {allowed}"
        if not sent:
            return False, f"the cell's compiled program sends nothing between devices; it should send {allowed}"
        other = sorted(set(sent) - set(ops))
        if other:
            return False, f"the cell's compiled program sends {_plural(other)}; this exercise allows only {allowed}"
        if count is not None and len(sent) != count:
            return False, f"the cell's compiled program sends {len(sent)} collectives, not {count}"
        if most_bytes is not None and carried(self.program) > most_bytes:
            return False, (f"the cell's {_plural(sorted(set(sent)))} carry {carried(self.program):,} bytes per device, "
                           "more than the exercise's method needs: send the smallest array that does the job")
        return True, ""

    def split_into(self, name: str, blocks: int) -> tuple[bool, str]:
        """The input `name`, as the magic line placed it this run, is cut into `blocks` distinct blocks."""
        if self.spec(name) is None:
            return False, f"give {name} its layout on the magic's line: --in {name}=SPEC"
        placed = self.bound.get(name)
        count = len({str(shard.index) for shard in getattr(placed, "addressable_shards", ())})
        noun = "block" if count == 1 else "blocks"
        why = f"{name} is cut into {count} distinct {noun}, not {blocks}: the other devices hold copies"
        return count == blocks, why

    def follows(self, want, /, *, rtol: float = 1e-5, atol: float | None = None, setup: str | None = None,
                inputs_named: str = "", **inputs) -> tuple[bool, str]:
        """Run the exercise cell again with other values for its inputs (``readings=other``): its
        answers must then equal `want` (the reference's answers on those inputs; a dict by answer
        name, or the value when the exercise has one answer). An answer that does not depend on
        its inputs, or that adds a value worked out before, fails. The namespace is left as it was.
        On a cluster the inputs live in the processes: `setup` is code each process runs first to
        rebind them (`inputs_named` names them for the message), and every namespace is put back."""
        from .checks import differs
        from .rerun import run_again, run_again_on_cluster

        names = inputs_named or ", ".join(f"`{name}`" for name in inputs)
        want = want if len(self.answers) > 1 else {self.answers[0]: want}
        if self._problem() is not None or self.body is None:
            return False, (self._problem() or NotRun("the exercise cell has not finished a run")).reason
        if setup is not None and self.on_cluster is None:
            return False, "run the exercise cell in the cluster's processes (`%%cluster` below `%%exercise`)"
        if setup is None and self.on_cluster is not None:  # its inputs live in the processes
            return False, "this check cannot run a cluster cell again without `setup=` code for its inputs"
        if self.on_cluster is not None:
            got, error = run_again_on_cluster(self, setup, _running, self.on_cluster)
        else:
            got, error = run_again(self, inputs, _running)
        if error is not None:
            return False, f"run again with other values in {names}, the exercise cell failed ({error})"
        for name, expected in want.items():
            value = got.get(name, NotRun(f"the cell did not set `{name}`"))
            why = value.reason if isinstance(value, NotRun) else differs(value, expected, rtol=rtol, atol=atol)
            if why is not None:
                return False, (f"run again with other values in {names}, the cell's `{name}` is wrong ({why}): "
                               f"compute it from {names}, not from a value worked out before")
        return True, ""

    def sends_nothing(self) -> tuple[bool, str]:
        """The compiled program sends nothing between devices."""
        sent = self.collectives
        if sent is None:
            return False, self._no_program()
        return not sent, f"the cell's compiled program sends {_plural(sorted(set(sent)))}" if sent else ""


def carried(program: list) -> int:
    """Bytes the collectives carry on one device: each one's larger buffer (a reduce-scatter's input,
    an all-gather's result), times the times it runs (a loop of unknown length counts once)."""
    return sum(max(c.bytes, c.operand_bytes or 0) * (c.count or 1) for c in program)


def _plural(ops: list[str]) -> str:
    return " and ".join(f"an {op}" if op[0] in "aeiou" else f"a {op}" for op in ops)


def _normal(spec):
    """A spec as a tuple without trailing Nones (P('x') and P('x', None) are one layout); a pytree of
    specs (`--in m=@specs`) as the list of its leaves' (with their structure), or the one spec
    all its leaves share, so `m=P("i")` and `@specs` that give every leaf P("i") are one layout."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if spec is None:
        return None
    if isinstance(spec, NamedSharding):
        spec = spec.spec
    if isinstance(spec, PartitionSpec) or (isinstance(spec, tuple) and all(map(_is_entry, spec))):
        entries = list(spec)
        while entries and entries[-1] is None:
            entries.pop()
        return tuple(entries)
    leaves, structure = jax.tree.flatten(spec, is_leaf=lambda leaf: isinstance(leaf, (PartitionSpec, NamedSharding)))
    normal = [_normal(leaf) for leaf in leaves]
    if normal and all(n == normal[0] for n in normal):
        return normal[0]
    return str(structure), normal  # a PyTreeDef does not compare with a spec


def _is_entry(entry) -> bool:
    """One entry of a spec in our tuple form: None, an axis name, or a tuple of axis names."""
    return entry is None or isinstance(entry, str) or (isinstance(entry, tuple) and all(isinstance(e, str) for e in entry))


def _spec_text(spec) -> str:
    from jax.sharding import PartitionSpec

    if not isinstance(spec, (PartitionSpec, tuple)):  # a pytree of specs: the line would say @NAME
        return f"@<{type(spec).__name__} of specs>"
    return ",".join("None" if e is None else (f"({','.join(e)})" if isinstance(e, tuple) else str(e)) for e in spec)


_GONE = object()
_attempts: list[Attempt] = []
_running: list[Attempt] = []  # the exercise running now (a nested cell must not void it)
_read_last: tuple = ((), -1)  # the answers attempt() read last, and in which cell
_runs: dict[tuple[str, ...], int] = {}  # runs of each exercise cell in this kernel, for the grades
_cells_run = 0  # cells run in this kernel so far (each exercise body counts with its cell)

_GRADED = ("the check already graded the exercise cell's last run: run the exercise cell again, then "
           "this check (a cell emptied entirely never reaches the kernel, so a second check cannot tell it "
           "from the run it graded)")


def attempt(name: str) -> Attempt:
    """The latest run of the exercise cell whose answers include `name`. The first cell that asks
    grades that run; a later cell asking for the same run gets it voided (the module's docstring)."""
    global _read_last
    for found in reversed(_attempts):
        if name in found.answers:
            _read_last = (found.answers, _cells_run)
            if found.graded_in is None:
                found.graded_in = _cells_run
            elif found.graded_in != _cells_run and found.voided is None:
                found.voided = _GRADED
            return found
    never = Attempt(answers=(name,), finished=True, ok=False)
    never.voided = f"run the exercise cell first (the cell that starts with `%%exercise {name}`)"
    return never


def _graded_now() -> tuple[tuple[str, ...], int] | None:
    """For the check's record (face/checks.py): the answers the running cell read with attempt(),
    and how many times this kernel ran their exercise cell; None if it read none."""
    answers, cell = _read_last
    return (answers, _runs.get(answers, 0)) if cell == _cells_run else None


checks.graded_now[0] = _graded_now


def run_exercise(shell, answers: tuple[str, ...], body: str, cluster=None) -> None:
    """``%%exercise ANSWERS``: forget the answers, run `body` as a cell, record the run. With a
    `cluster` running, the answers are forgotten in its processes too, and a magic cell's answers
    are read from there.

    Raises :class:`ExerciseStopped` (one line, after the body's own error) when the body failed.
    """
    record = Attempt(answers=tuple(answers), namespace=shell.user_ns, body=body)
    _runs[record.answers] = _runs.get(record.answers, 0) + 1
    _attempts.append(record)
    del _attempts[:-_KEPT]
    for name in answers:
        shell.user_ns.pop(name, None)
    if cluster is not None:
        cluster.execute("".join(f"globals().pop({name!r}, None)\n" for name in answers))

    def watch(magic, options, outcome) -> None:
        for value in outcome.bindings.values():  # a %%pmap function: its calls keep their program's facts
            if hasattr(value, "keep_facts"):
                value.keep_facts = True
        record.observed = Observed(magic, options, getattr(outcome, "facts", None), _held(outcome.bindings),
                                   _line_specs(options, shell.user_ns))

    WATCHERS.append(watch)
    _running.append(record)
    try:
        result = shell.run_cell(body, store_history=False) if body.strip() else None
    finally:
        WATCHERS.remove(watch)
        _running.remove(record)
    record.finished = True
    record.ok = result is None or result.success
    if not record.ok:  # plain Python may have set an answer before its error: that one is forgotten too
        for name in answers:
            shell.user_ns.pop(name, None)
        raise ExerciseStopped(answers)
    on_processes = record.observed is not None or body.lstrip().startswith("%%cluster")
    if cluster is not None and on_processes:  # the cell ran in every process: its names live there
        record.on_cluster = cluster
    values = {name: shell.user_ns[name] for name in answers if name in shell.user_ns}
    record.values = _held(values)
    record.frozen = {name: _digest(value) for name, value in values.items() if _mutable(value)}


def _mutable(value) -> bool:
    import numpy as np

    return isinstance(value, (dict, list, np.ndarray)) or (
        isinstance(value, tuple) and any(isinstance(v, (dict, list, np.ndarray)) for v in value))


def _digest(value):
    """What a mutable answer (a dict, list or NumPy array, or a tuple of them) was when the cell
    ended, small enough to keep: its structure, each NumPy leaf's dtype, shape and a hash of its
    bytes, each other leaf's identity (JAX arrays are immutable). A later in-place change shows as
    another digest, and the check refuses to grade it, without keeping the arrays alive (issue 33
    item 15 keeps no answer's arrays; issue 30 grades an answer only as the cell left it)."""
    import hashlib

    import jax
    import numpy as np

    def leaf(x):
        if isinstance(x, np.ndarray):
            return ("np", x.dtype.str, x.shape, hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=16).digest())
        if isinstance(x, (int, float, complex, str, bytes, bool, type(None))):
            return (type(x), x)
        return ("id", id(x))

    try:
        leaves, tree = jax.tree_util.tree_flatten(value)
    except Exception:  # a value jax cannot walk: its identity alone
        return ("id", id(value))
    return tree, tuple(leaf(x) for x in leaves)


class ExerciseStopped(Exception):
    """The exercise cell's code stopped with an error (shown above it): one line, no traceback."""

    def __init__(self, answers):
        names = ", ".join(f"`{n}`" for n in answers)
        which = f"its answer {names} is" if len(answers) == 1 else f"its answers {names} are"
        super().__init__(f"the exercise cell stopped at the error above, so {which} forgotten until the cell runs "
                         "to the end")

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
    global _cells_run
    if _running:  # the exercise's own body, run as a cell; a second cell is a nested run_cell
        record = _running[-1]
        record.cells_seen += 1
        if record.cells_seen > 1 and record.voided is None:
            record.voided = ("the exercise cell ran another cell (get_ipython().run_cell): write the code in "
                             "the exercise cell itself, then run it")
        return
    _cells_run += 1
    source = (getattr(info, "raw_cell", "") or "").lstrip()
    if source.startswith("%%exercise"):
        first, _, body = source.partition("\n")
        if not body.strip():
            _record_empty(first)
        return
    if not _attempts:
        return
    try:
        assigned = assigned_names(source)
    except Exception:  # a cell we cannot read is one Python will refuse: it sets nothing
        return
    for record in _attempts:
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
    _attempts.append(Attempt(answers=answers, ok=True, finished=True, namespace=shell.user_ns))
    del _attempts[:-_KEPT]


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
