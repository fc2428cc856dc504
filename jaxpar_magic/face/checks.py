"""`check(...)`: the one line a check cell prints, `✓ right` or `✗ not yet: ... Hint: ...`.

A student trusts the check more than anything else in a notebook, so it compares what they wrote
the way they would by eye, and it never shows a traceback:

* any two pytrees, leaf by leaf: dicts, tuples, dataclasses, Flax NNX modules, Equinox modules,
  optax states. Their structure must match; array leaves must match in shape, in dtype *kind*
  (bool, integer, floating, complex: float32 against float64 is fine, int against float is not,
  except for a plain Python number, which JAX treats as weakly typed too) and in values within
  ``rtol`` (relative to the expected leaf's largest value: 2e-6 against 3e-6 is wrong, however small),
  NaN equal to NaN; Python integers of any size compare exactly; other leaves compare with ``==``,
  except a value of a class the notebook defined (its ``==`` and ``__array__`` are the student's code:
  it is "not yet" unless the expected value is of that class too);
* a condition (``check(a == b, hint=...)``) is right when all of it is true, an array included; it
  must be a boolean or a boolean array (a generator or a list is the check's own mistake, said so);
* anything it cannot compare is one "not yet" line that says why.

It never prints the expected value: only what differs (where, how many places, the student's own
value). ``hint`` may be a list: the first failure shows the first hint, each later failure of the
same check the next one (a nudge first, more later); running the check again on the run it already
graded shows the same hint again, so re-reading a check does not use one up. ``method`` lists ``(condition, why)`` pairs:
how the answer must have been made, tested before its value (face/exercises/ builds them from
the exercise cell's own run).

Each verdict is also kept in the kernel's ledger (`ledger()`), the channel `python -m
jaxpar_magic.grade` reads after each check cell; printed lines and displays, which any cell or hook
can make, are never read as verdicts.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cell.interrupts import host_value

_MISSING = object()
# How many times each check (known by its hints) said "not yet" in this kernel: the next hint.
_failures: dict[tuple[str, ...], int] = {}


class NotRun:
    """An answer the exercise cell's latest run did not produce, and why (face/exercises/).
    ``again``: the check already graded this run (re-reading it shows the same hint, not the next)."""

    def __init__(self, reason: str, again: bool = False):
        self.reason = reason
        self.again = again

    def __repr__(self) -> str:
        return f"NotRun({self.reason!r})"

    def __bool__(self) -> bool:  # a condition built from a missing answer is never true
        return False


def check(got: Any, want: Any = _MISSING, *, hint: str | Sequence[str], method: Sequence = (),
          done: str = "right", rtol: float = 1e-5, atol: float | None = None) -> None:
    """Print ``✓ <done>`` when ``got`` equals ``want`` (or, with no ``want``, when the condition
    ``got`` is true), else ``✗ not yet: <what differs>. Hint: <hint>``. Never raises.

    ``method``: ``(condition, why)`` pairs, each a requirement on how the answer was made; the
    first false one is reported (with ``why``) before the value is compared. With ``method`` and no
    ``want``, a ``got`` that is not a boolean is the answer itself, judged by ``method`` alone. ``atol`` (an absolute
    tolerance) is off by default: values are compared relative to the expected one (``rtol``).
    """
    hints = (hint,) if isinstance(hint, str) else tuple(hint)
    try:
        why = _verdict(got, want, method, rtol, atol)
    except Exception as error:  # a value nothing here foresaw: still one line
        why = f"could not compare the answer ({type(error).__name__}: {_short(str(error))})"
    if why is None:
        line = f"✓ {done}"
    else:
        missing = _first_missing(got)
        again = missing is not None and missing.again
        line = f"✗ not yet: {why}. {_next_hint(hints, advance=not again)}"
    graded = graded_now[0]()
    _LEDGER.append({"answers": list(graded[0]) if graded else None, "verdict": "right" if why is None else "not yet",
                    "line": line})
    del _LEDGER[:-_LEDGER_KEPT]
    _say(line, _record(hints, graded, right=why is None))


# Every verdict this kernel's checks gave, in order: the grader's channel (python -m jaxpar_magic.grade reads
# it after each check cell with a silent request, which runs no hook and prints nothing), apart from the
# printed line and the display any cell can forge.
_LEDGER: list[dict] = []
_LEDGER_KEPT = 10_000


def ledger(start: int = 0) -> str:
    """The verdicts given since the `start`-th, as JSON (a list of {"answers", "verdict", "line"}),
    and the count so far: ``{"count": N, "verdicts": [...]}``."""
    import json

    return json.dumps({"count": len(_LEDGER), "verdicts": _LEDGER[start:]})


# The check's record for `python -m jaxpar_magic.grade`, saved with the notebook in the metadata of
# the check's own line: in a kernel the line is a display of plain text, which every front end and
# nbconvert render as they render printed text (an output of a MIME type of its own would make
# nbconvert warn that it "is not able to be represented").
RECORD_KEY = "jaxpar_magic.check"


def _say(line: str, record: dict | None) -> None:
    if record is None:
        print(line)
        return
    import sys

    from IPython.display import display

    sys.stdout.flush()  # what the cell printed before stays above the line
    display({"text/plain": line}, metadata={RECORD_KEY: record}, raw=True)


def said(output: dict) -> str:
    """The text a saved output shows if it is a check's line or printed text (for readers of
    executed notebooks: the grader, the tests)."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if RECORD_KEY in output.get("metadata", {}):
        return output.get("data", {}).get("text/plain", "") + "\n"
    return ""


# face/exercises/runs.py sets it: () -> (the answers the running cell read with attempt(), the exercise
# cell's runs in this kernel), or None when the cell read none.
graded_now: list = [lambda: None]


def _record(hints: tuple[str, ...], graded, right: bool) -> dict | None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or graded is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None  # only a kernel saves it with the notebook
    answers, attempts = graded
    return {"answers": list(answers), "verdict": "right" if right else "not yet", "attempts": attempts,
            "hints_used": _failures.get(hints, 0)}


def _next_hint(hints: tuple[str, ...], advance: bool = True) -> str:
    if not hints:
        return ""
    shown = _failures.get(hints, 0)
    if advance:
        _failures[hints] = shown + 1
    else:  # the same run read again: the hint it was last given
        shown = max(shown - 1, 0)
    text = hints[min(shown, len(hints) - 1)].strip()
    text = text if text.endswith((".", "?", "!")) else text + "."
    if len(hints) == 1:
        return f"Hint: {text}"
    return f"Hint {min(shown, len(hints) - 1) + 1}/{len(hints)}: {text}"


def _verdict(got, want, method, rtol, atol) -> str | None:
    missing = _first_missing(got)
    if missing is not None:
        return missing.reason
    for condition, why in method:
        if isinstance(condition, NotRun):
            return condition.reason
        if not _is_condition(condition):
            return f"the check's requirement “{why}” is a {type(condition).__name__}, not True or False"
        if not _all_true(condition):
            return why
    if want is _MISSING:
        if method and not _is_condition(got):  # `got` is the answer, judged by `method` alone
            return None
        if not _is_condition(got):
            return (f"the check's condition is a {type(got).__name__}, not True or False (write a comparison, "
                    "or all(...) around a generator)")
        return None if _all_true(got) else "the check is false"
    return differs(got, want, rtol=rtol, atol=atol)


def _is_condition(value) -> bool:
    """A boolean, a NumPy/JAX boolean scalar or array, or a NotRun (always false)."""
    if isinstance(value, (bool, NotRun)):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and getattr(dtype, "kind", None) == "b" and hasattr(value, "shape")


def _first_missing(value) -> NotRun | None:
    """A NotRun anywhere in `value` (a dict or tuple of answers included)."""
    if isinstance(value, NotRun):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_missing(item)
            if found is not None:
                return found
    return None


def _all_true(condition) -> bool:
    if isinstance(condition, NotRun):
        return False
    if hasattr(condition, "shape") and hasattr(condition, "dtype"):
        import numpy as np

        return bool(np.all(host_value(condition)))
    return bool(condition)


# --- comparing two values --------------------------------------------------------------------------

def differs(got: Any, want: Any, *, rtol: float = 1e-5, atol: float | None = None) -> str | None:
    """Why `got` is not `want` (None when they agree), in words that never show `want`'s values."""
    import jax

    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    same_paths = [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    if got_tree != want_tree and not (same_paths and type(got) is type(want)):
        return _structure_differs(got, want, got_leaves, want_leaves)
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        why = _leaf_differs(g, w, rtol, atol)
        if why is not None:
            where = jax.tree_util.keystr(path)
            return f"at {where}: {why}" if where else why
    if got_tree != want_tree:  # the same leaves, other static fields (a layer's sizes, a flag)
        return f"got {_describe(got)} whose other fields (not its arrays) differ"
    return None


def _structure_differs(got, want, got_leaves, want_leaves) -> str:
    where, got, want = _where_structures_part(got, want)
    at = f"at {where}: " if where else ""
    if isinstance(got, dict) and isinstance(want, dict):
        missing = [k for k in want if k not in got]
        extra = [k for k in got if k not in want]
        if missing:
            more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
            return f"{at}the dict has no key {missing[0]!r}{more}"
        if extra:
            return f"{at}the dict has an unexpected key {extra[0]!r}"
    if isinstance(got, (list, tuple)) and type(got) is type(want) and len(got) != len(want):
        return f"{at}got {len(got)} values in a {type(got).__name__}, expected {len(want)}"
    if isinstance(got, (list, tuple)) and not isinstance(want, (list, tuple, dict)) and _is_array(want):
        return f"{at}got {_describe(got)}, expected one value, not a {type(got).__name__}"
    return f"{at}got {_describe(got)}, expected {_describe(want, values=False)}"


def _where_structures_part(got, want, where: str = "") -> tuple[str, Any, Any]:
    """The first place, from the root, where the two trees' shapes part: (where, got there, want there)."""
    if type(got) is type(want) and isinstance(got, (list, tuple)) and len(got) == len(want):
        pairs = [(f"[{i}]", a, b) for i, (a, b) in enumerate(zip(got, want))]
    elif isinstance(got, dict) and isinstance(want, dict) and set(got) == set(want):
        pairs = [(f"[{k!r}]", got[k], want[k]) for k in want]
    else:
        return where, got, want
    for key, a, b in pairs:
        if _structure(a) != _structure(b):
            return _where_structures_part(a, b, where + key)
    return where, got, want


def _structure(value):
    import jax

    return jax.tree_util.tree_structure(value)


def _is_array(value) -> bool:
    """A NumPy or JAX array or scalar, or a Python number: not any object that says it has a shape
    (a class of the notebook's could hand `__array__` anything)."""
    import jax
    import numpy as np

    return isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, jax.Array))


def _notebooks_own(value) -> bool:
    """A value of a class the notebook defined (in a cell): its `==` and `__array__` are the
    student's code, so a check never compares by them."""
    return type(value).__module__ == "__main__"


_KINDS = (("bool", "a boolean"), ("integer", "an integer"), ("floating", "a floating-point"),
          ("complexfloating", "a complex"))


_PYTHON_KINDS = {bool: "bool", int: "integer", float: "floating", complex: "complexfloating"}


def _kind(value) -> str | None:
    import jax.numpy as jnp

    if isinstance(value, (bool, int, float, complex)):  # by type: JAX would refuse an int past int32
        return next(kind for kind_type, kind in _PYTHON_KINDS.items() if isinstance(value, kind_type))
    dtype = value.dtype
    for kind, _ in _KINDS:
        if jnp.issubdtype(dtype, getattr(jnp, "bool_" if kind == "bool" else kind)):
            return kind
    return None


def _leaf_differs(got, want, rtol, atol) -> str | None:
    import numpy as np

    if _notebooks_own(got) and type(got) is not type(want):
        return f"got a {type(got).__name__}, a class of the notebook's, expected {_describe(want, values=False)}"
    if _python_int(got) and _python_int(want):  # exact, and of any size (NumPy stops at 2**63)
        return None if got == want else f"got {_describe(got)}"
    if _is_array(got) and _is_array(want):
        g, w = _host(got), _host(want)
        if g.shape != w.shape:
            return f"the shape is {g.shape}, expected {w.shape}"
        got_kind, want_kind = _kind(got), _kind(want)
        weak = isinstance(got, (int, float)) or isinstance(want, (int, float))  # Python numbers are weakly typed
        numbers = {"integer", "floating"}
        if got_kind != want_kind and not (weak and {got_kind, want_kind} <= numbers):
            wanted = dict(_KINDS).get(want_kind, str(w.dtype))
            return f"the dtype is {g.dtype}, expected {wanted} dtype"
        if want_kind in ("floating", "complexfloating") or got_kind in ("floating", "complexfloating"):
            common = np.result_type(g, w, np.float32)
            g, w = g.astype(common), w.astype(common)
            if atol is None:  # relative to the expected leaf's scale: its zeros need not be exact
                finite = np.abs(w[np.isfinite(w)])
                atol = rtol * float(finite.max()) if finite.size else 0.0
            close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = np.equal(g, w)
        if bool(np.all(close)):
            return None
        if g.size == 1:
            return f"got {_describe(got)}"
        return f"the values differ in {int(np.sum(~close))} of {g.size} places"
    if _is_array(got) != _is_array(want):
        return f"got {_describe(got)}, expected {_describe(want, values=False)}"
    if isinstance(got, float) and isinstance(want, float) and got != got and want != want:
        return None  # NaN is NaN
    same = got == want
    if not _all_true(same):
        return f"got {_describe(got)}"
    return None


def _python_int(value) -> bool:
    return type(value) is int


def _host(value):
    """A NumPy copy of an array leaf; bfloat16 and other ML dtypes as float32, so NumPy can compare them;
    a Python int too large for int64 as a float (it is then compared with a float)."""
    import numpy as np

    if _python_int(value) and not -2**63 <= value < 2**63:
        return np.asarray(float(value))
    array = host_value(value)
    if array.dtype.kind == "V":  # ml_dtypes (bfloat16, float8): NumPy knows them as void
        array = array.astype(np.float32)
    return array


def _describe(value, values: bool = True) -> str:
    """A few words about `value`; with `values=False` nothing that would give an expected answer away."""
    if value is None:
        return "None"
    if isinstance(value, bool) or (values and isinstance(value, (int, float, complex, str))):
        return _short(repr(value))
    if isinstance(value, (int, float, complex)):
        return f"a number ({type(value).__name__})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        if values and tuple(value.shape) == () and hasattr(value, "item"):
            return f"{_short(repr(value.item()))} ({value.dtype})"
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, dict):
        return f"a dict with keys {_short(repr(list(value)))}"
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        shown = f" ({_short(repr(value), 40)})" if values and all(_is_array(v) and not hasattr(v, "shape")
                                                                  for v in value) else ""
        return f"a {type(value).__name__} of {len(value)}{shown}"
    if values and type(value).__repr__ is object.__repr__ or not values or _is_pytree_node(value):
        return f"a {type(value).__name__}"
    return _short(repr(value))


def _is_pytree_node(value) -> bool:
    import jax

    leaves = jax.tree_util.tree_leaves(value)
    return not (len(leaves) == 1 and leaves[0] is value)


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
