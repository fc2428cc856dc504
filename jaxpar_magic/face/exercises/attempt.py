"""One run of an exercise cell, as its check reads it (`attempt(NAME)`; face/exercises/__init__.py).

Besides the answers, a run knows *which program computed them*: every magic cell the run ran
(`Observed`), and whether each answer is one of that magic cell's own outputs, by identity. An
answer computed beside a magic cell, in plain Python or NumPy, is not the program's, and every
requirement on the program says so (`provenance`).
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

from ..checks import NotRun
from .held import GONE, digest
from .method import Method


@dataclass
class Observed:
    """A magic cell an exercise ran: what its line said and what its run produced."""

    magic: str
    options: Any  # the line's options record (face/lines.py)
    facts: Any  # the compiled program's facts (stages/run/program.ProgramFacts), or None
    bound: dict  # the names it bound: name -> held.Held
    specs: dict = field(default_factory=dict)  # --in's specs, `@NAME` read as the run read it
    placed: tuple[str, ...] = ()  # inputs it bound again, laid out on the mesh (%%shard's --in)


def line_specs(options, namespace: dict) -> dict:
    """Each `--in` spec as the run used it: a PartitionSpec, or for `NAME=@SPECS` (and the twins'
    pytrees of specs) the pytree of specs itself, read from the namespace when the cell ran."""
    from jax.sharding import PartitionSpec

    from ...cell.specs import SpecTree
    from ...cell.treespecs import GivenSpecs

    specs = {}
    for name, spec in (getattr(options, "in_specs", None) or {}).items():
        if isinstance(spec, SpecTree):
            specs[name] = namespace.get(spec.name)
        elif isinstance(spec, GivenSpecs):
            specs[name] = spec.tree
        else:
            specs[name] = PartitionSpec(*spec)
    return specs


GRADED = ("the check already graded the exercise cell's last run: run the exercise cell again, then "
          "this check (a cell emptied entirely never reaches the kernel, so a second check cannot tell it "
          "from the run it graded)")


@dataclass
class Attempt(Method):
    """One run of an exercise cell."""

    answers: tuple[str, ...]
    ok: bool = False
    finished: bool = False
    values: dict = field(default_factory=dict)  # answer -> held.Held
    observed: Observed | None = None  # the magic cell whose outputs the answers are (else the last one run)
    provenance: str | None = None  # why the answers are not that magic cell's own outputs
    on_cluster: Any = None  # the cluster the answers live on, when one was running
    voided: str | None = None  # why this run no longer counts
    namespace: dict | None = None
    graded_in: int | None = None  # the cell (by runs.cells_run()) that first read this run with attempt()
    body: str | None = None  # the cell's code below `%%exercise`, to run again on other inputs
    frozen: dict = field(default_factory=dict)  # each mutable answer's digest as the cell left it
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
            current = self.namespace.get(name, GONE)
            if current is GONE or not held.matches(current):
                return NotRun(f"`{name}` changed after the exercise cell ran: run the exercise cell again")
            value = current
        else:
            value = held.get()
            if value is GONE:
                return NotRun(f"`{name}` is gone: run the exercise cell again")
        if name in self.frozen and digest(value) != self.frozen[name]:  # changed in place since
            return NotRun(f"`{name}` was changed in place after the exercise cell ran: run the exercise cell again")
        if isinstance(value, types.FunctionType) and self.namespace is not None:
            return guarded(value, name)
        return value

    def _problem(self) -> NotRun | None:
        if self.voided is not None:  # the graded run read again: the same hint, not the next one
            return NotRun(self.voided, again=self.voided == GRADED)
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
        """The magic that computed the answers ("pmap", "shard", "shard_map"), or None: plain Python,
        a failed run, or answers that are not the magic cell's own outputs (`provenance`)."""
        if self._problem() is not None or self.observed is None or self.provenance is not None:
            return None
        return self.observed.magic

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
        from ...stages.run.pmap_function import ParallelFunction

        return {n: v for n, v in self.bound.items() if isinstance(v, ParallelFunction)}

    def _no_program(self) -> str:
        """Why there is no program to check: answers made beside the magic cell, plain Python, or a
        %%pmap function not called yet."""
        if self.provenance is not None:
            return self.provenance
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
        return {name: value for name, value in found.items() if value is not GONE}


class AnswerRefused(RuntimeError):
    """An answer that is a function changed what was there before it when the check called it."""


def guarded(function, name: str):
    """`function` (an answer the check calls: `stash_slots`, `kv_owner`) as the check calls it: each
    call may compute, and change nothing that was there before it (the check's expected value, its
    helpers, a hook: face/exercises/snapshot.py); a call that does is put back and raises."""
    import functools

    from IPython import get_ipython

    @functools.wraps(function)
    def called(*args, **kwargs):
        from .snapshot import Snapshot

        shell = get_ipython()
        before = Snapshot(shell) if shell is not None else None
        result = function(*args, **kwargs)
        changed = before.changes() if before is not None else []
        if changed:
            before.restore()
            raise AnswerRefused(f"called by the check, `{name}` {changed[0]}: it is put back, and the answer does "
                                "not count (a function answer computes, and changes nothing)")
        return result

    return called


def provenance(values: dict, observed: list[Observed], body: str) -> tuple:
    """(the magic cell whose own outputs the answers are, or the last one run; why they are not, or
    None). An exercise cell that ran a magic cell must *be* that cell (its first line below
    `%%exercise`), and every answer it set must be one of that cell's outputs, the very object."""
    if not observed:
        return None, None
    first = body.lstrip().partition("\n")[0].split()
    written = first[0][2:] if first and first[0].startswith("%%") else None
    made = [run for run in reversed(observed)  # the outermost cell's watcher is called last
            if all(name in run.bound and run.bound[name].matches(value) for name, value in values.items())]
    if not made:
        magic = written if any(run.magic == written for run in observed) else observed[-1].magic
        outside = next((name for name, value in values.items()
                        if not any(name in run.bound and run.bound[name].matches(value) for run in observed)),
                       next(iter(values)))
        return observed[-1], f"`{outside}` was not computed by the `%%{magic}` cell"
    if made[0].magic != written:
        magic = made[0].magic
        return made[0], (f"the exercise cell runs `%%{magic}` from other code: write it as the `%%{magic}` cell "
                         "itself, on the line below `%%exercise`")
    return made[0], None
