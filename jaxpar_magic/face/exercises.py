"""`check(...)`: the one-line check cell after an exercise.

A check cell asserts the student's answer. When it is right it says so in one line; when it is
wrong it raises :class:`NotYet`, an :class:`AssertionError` that IPython shows as one line
("✗ not yet: ... Hint: ...", through ``_render_traceback_``), never a traceback wall. The cell
still fails, so a course notebook run by nbclient with the solutions filled in checks them.

    check(total, jnp.sum(x), hint="psum adds the blocks of every device")   # compare values
    check(len(report.collectives) == 0, hint="give every input the same spec")  # a condition
"""
from __future__ import annotations

from typing import Any

_MISSING = object()


class NotYet(AssertionError):
    """A check cell's answer is not right yet: the message carries the hint."""

    def _render_traceback_(self) -> list[str]:
        # IPython (terminal and kernel) shows these lines instead of a traceback.
        return [f"✗ {self}"]


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "dtype", None) is not None:
        return f"an array of shape {tuple(shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _differs(got: Any, want: Any, rtol: float, atol: float) -> str | None:
    """Why `got` is not `want` (None when they agree): arrays by shape then values, the rest by ==."""
    if hasattr(want, "shape") or hasattr(got, "shape"):
        import numpy as np

        try:
            g, w = np.asarray(got), np.asarray(want)
        except Exception:  # something numpy cannot read: a different kind of value
            return f"got {_describe(got)}"
        if g.shape != w.shape:
            return f"the shape is {g.shape}, expected {w.shape}"
        try:
            close = np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        except TypeError:
            close = bool(np.array_equal(g, w))
        if not close:
            wrong = int(np.sum(~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))) if g.dtype.kind in "fciub" else None
            return "the values differ" + (f" in {wrong} of {g.size} places" if wrong is not None else "")
        return None
    try:
        same = bool(got == want)
    except Exception:
        same = False
    return None if same else f"got {_describe(got)}"


def check(got: Any, want: Any = _MISSING, *, hint: str, done: str = "right", rtol: float = 1e-5,
          atol: float = 1e-6) -> None:
    """Check an exercise's answer: ``check(value, expected, hint=...)`` compares (arrays by shape,
    then values within ``rtol``/``atol``), ``check(condition, hint=...)`` asserts a truth value.

    Right: prints ``✓`` and ``done``. Wrong: raises :class:`NotYet` with what differs and ``hint``.
    """
    if want is _MISSING:
        why = None if bool(got) else "the check is false"
    else:
        why = _differs(got, want, rtol, atol)
    if why is not None:
        raise NotYet(f"not yet: {why}. Hint: {hint}")
    print(f"✓ {done}")
