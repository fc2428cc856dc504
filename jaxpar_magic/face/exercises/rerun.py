"""Running an exercise cell again on other inputs, for ``Attempt.follows`` (face/exercises/).

A check cannot see *how* an answer was computed from the value alone: ``lax.ppermute(x, ...) * 0 + 31.0``
has the right value and sends the right collective. Run again with other values in its inputs, the
cell must give the reference's answer on those values; a hard-coded or copied answer then cannot.

The run is invisible: its output, views and any traceback are swallowed, and everything it (or its
magic) changed is put back as it was: names, containers, objects, NNX state, files (the sandbox of
face/exercises/sandbox.py). A cell whose effects cannot be undone is not run again (`NotRunAgain`).
"""
from __future__ import annotations

_ABSENT = object()
RUNNING: list = []  # the exercises running now, innermost last (a cell run inside one is its body)


class NotRunAgain(Exception):
    """The cell was not run again, or its re-run left what the check could not undo: the check's reason."""


def run_again(record, inputs: dict, running: list) -> tuple[dict, str | None]:
    """Run `record.body` with `inputs` in the namespace, in a sandbox (face/exercises/sandbox.py):
    (the answers it set, None) or ({}, why it failed, or why it was not run again).
    `running`: the list of exercises running now (a cell run inside one is its body)."""
    from IPython import get_ipython
    from IPython.utils.capture import capture_output

    from .sandbox import Sandbox, cannot_undo

    shell = get_ipython()
    if shell is None:
        return {}, "no IPython shell to run it in"
    effect = cannot_undo(record.body)
    if effect is not None:
        raise NotRunAgain(f"this check runs the exercise cell again, and the cell {effect}, which a re-run could "
                          "not undo: compute the answer without it")
    namespace = shell.user_ns
    errors: list[str] = []

    def keep_quiet(*args, **kwargs):  # the traceback would print under the check: keep its last line only
        import sys

        kind, error = sys.exc_info()[:2]
        errors.append(f"{kind.__name__}: {str(error).splitlines()[0][:120]}" if kind else "an error")

    sandbox = Sandbox(shell, record.body)
    running.append(record)
    seen, record.cells_seen = record.cells_seen, 0  # the run's own cell is no nested one
    try:
        with sandbox:
            for name, value in inputs.items():
                namespace[name] = sandbox.given(value)
            for name in record.answers:
                namespace.pop(name, None)
            shell.showtraceback, shell.showsyntaxerror = keep_quiet, keep_quiet
            try:
                with capture_output(display=True):
                    result = shell.run_cell(record.body, store_history=False, silent=False)
            finally:
                del shell.showtraceback, shell.showsyntaxerror  # the class's methods again
            got = {name: namespace[name] for name in record.answers if name in namespace}
            ok = result.success
            if not ok and not errors:
                error = result.error_in_exec or result.error_before_exec
                errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:120]}" if error else "an error")
    finally:
        running.remove(record)
        record.cells_seen = seen
    if sandbox.left:
        raise NotRunAgain(f"run again by the check, the exercise cell {sandbox.left[0]}, which the check could not "
                          "put back: write the cell so that it only computes its answer")
    return (got, None) if ok else ({}, errors[0])


def _restore(namespace: dict, before: dict) -> None:
    for name in [n for n in namespace if n not in before]:
        del namespace[name]
    for name, value in before.items():
        if namespace.get(name, _ABSENT) is not value:
            namespace[name] = value


# --- on a running cluster: the inputs live in its processes ---------------------------------------

def run_again_on_cluster(record, setup: str, running: list, cluster) -> tuple[dict, str | None]:
    """Run `setup` (code that rebinds the inputs) then `record.body` in every process of `cluster`,
    and gather the answers: (answers as `one_value` reads them, None) or ({}, why it failed). Every
    process's namespace is put back as it was before `setup`, and the kernel's too."""
    from IPython.utils.capture import capture_output

    answers = list(record.answers)
    with capture_output(display=True):
        cluster.call("jaxpar_magic.face.exercises.rerun:keep_namespace", answers)
        try:
            try:
                cluster.execute(setup)
            except Exception as error:  # the check's own code: say so, do not blame the student
                return {}, f"the check could not set its other inputs ({type(error).__name__})"
            _, error = run_again(record, {}, running)
            if error is not None:
                return {}, error
            present = [name for name in answers if name in _defined(cluster, answers)]
            got = cluster.gather(present) if present else {}
        finally:
            cluster.call("jaxpar_magic.face.exercises.rerun:put_namespace_back")
    return {name: one_value(value) for name, value in got.items()}, None


def _defined(cluster, names: list[str]) -> set[str]:
    replies = cluster.call("jaxpar_magic.face.exercises.rerun:defined_names", names)
    return set.intersection(*(set(reply) for reply in replies)) if replies else set()


def one_value(gathered):
    """A value gathered from the processes as the check reads it: a global array as itself; a
    plain value (a NumPy number, a float) that every process holds alike as that one value, as
    `%cluster gather` would give one replicated array; processes that disagree as a NotRun naming
    what each holds (a process-local answer is the exercise's bug)."""
    from ..checks import NotRun, differs

    if not isinstance(gathered, list):
        return gathered
    if gathered and all(differs(value, gathered[0], rtol=1e-6) is None for value in gathered[1:]):
        return gathered[0]
    held = ", ".join(f"process {rank}: {_short(value)}" for rank, value in enumerate(gathered[:4]))
    return NotRun(f"the processes ended with different values ({held}); the answer must be one value every "
                  "process agrees on")


def _short(value) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= 40 else text[:37] + "..."


# Run in each process by ClusterRuns.call (`func(namespace, *args)` -> (reply, bindings to commit)).
_kept: list[dict] = []


def keep_namespace(namespace: dict, answers: list[str]) -> tuple[None, dict]:
    _kept[:] = [dict(namespace)]
    for name in answers:  # a rerun that does not set an answer must not find the old one
        namespace.pop(name, None)
    return None, {}


def put_namespace_back(namespace: dict) -> tuple[None, dict]:
    if _kept:
        _restore(namespace, _kept.pop())
    return None, {}


def defined_names(namespace: dict, names: list[str]) -> tuple[list[str], dict]:
    return [name for name in names if name in namespace], {}
