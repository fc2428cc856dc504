"""Running an exercise cell again on other inputs, for ``Attempt.follows`` (face/exercises.py).

A check cannot see *how* an answer was computed from the value alone: ``lax.ppermute(x, ...) * 0 + 31.0``
has the right value and sends the right collective. Run again with other values in its inputs, the
cell must give the reference's answer on those values; a hard-coded or copied answer then cannot.

The run is invisible: its output, views and any traceback are swallowed, and every name it (or its
magic) set or changed in the namespace is put back as it was.
"""
from __future__ import annotations

_ABSENT = object()


def run_again(record, inputs: dict, running: list) -> tuple[dict, str | None]:
    """Run `record.body` with `inputs` in the namespace: (the answers it set, None) or ({}, why it failed).
    `running`: face/exercises.py's list of exercises running now (a cell run inside one is its body)."""
    from IPython import get_ipython
    from IPython.utils.capture import capture_output

    shell = get_ipython()
    if shell is None:
        return {}, "no IPython shell to run it in"
    namespace = shell.user_ns
    before = dict(namespace)
    for name, value in inputs.items():
        namespace[name] = value
    for name in record.answers:
        namespace.pop(name, None)
    errors: list[str] = []

    def keep_quiet(*args, **kwargs):  # the traceback would print under the check: keep its last line only
        import sys

        kind, error = sys.exc_info()[:2]
        errors.append(f"{kind.__name__}: {str(error).splitlines()[0][:120]}" if kind else "an error")

    running.append(record)
    seen, record.cells_seen = record.cells_seen, 0  # the run's own cell is no nested one
    shell.showtraceback, shell.showsyntaxerror = keep_quiet, keep_quiet
    try:
        with capture_output(display=True):
            result = shell.run_cell(record.body, store_history=False, silent=False)
        got = {name: namespace[name] for name in record.answers if name in namespace}
        ok = result.success
        if not ok and not errors:
            error = result.error_in_exec or result.error_before_exec
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:120]}" if error else "an error")
    finally:
        del shell.showtraceback, shell.showsyntaxerror  # the class's methods again
        running.remove(record)
        record.cells_seen = seen
        _restore(namespace, before)
    return (got, None) if ok else ({}, errors[0])


def _restore(namespace: dict, before: dict) -> None:
    for name in [n for n in namespace if n not in before]:
        del namespace[name]
    for name, value in before.items():
        if namespace.get(name, _ABSENT) is not value:
            namespace[name] = value
