"""The differential sessions of tests/test_differential.py, with %%shard cells that assign an object
holding an array, a closure over one and a functools.partial (issue 33 item 5), each used by a later
plain cell: plain Python gives a working object, so the magic must bind one that works (the later
call gives plain JAX's values) or refuse with a UsageError that leaves the namespace as it was, never
an object holding a leaked tracer.

They also run `%%exercise ans` cells (a dict, a list or a NumPy answer made from `x`), plain cells that
change the answer in place (or write back the value it holds), and the check
`check(attempt("ans")["ans"], expected)` against the answer as the exercise cell left it, or as it is
now (issue 30; issue 33, "exercise answers changed in place"). The oracle is plain Python: the same
cells on a copy of the answer. The check must say right when the answer still holds what the cell left
and this run was not graded yet, and never when the answer was changed or the run already graded.

And a Flax NNX module whose config is plain containers (a dict holding a list, a list, a set: issue 40
item 1), read by %%shard, %%shard_map and %%pmap --broadcast cells, its containers changed in place or
rebound by plain cells between them. The oracle is the same cell run eagerly on the module the plain
steps build again (not nnx.jit's own cache, which keeps the very list and so misses its change in place).

Same budget variables as the base test.
"""
from __future__ import annotations

import copy
import functools
import struct

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from IPython.utils.capture import capture_output

import test_differential as base
from shell_helpers import snapshot

pytestmark = pytest.mark.slow

SCALER = ("class Scaler:\n    def __init__(self, w):\n        self.w = w\n"
          "    def __call__(self, v):\n        return v * self.w\n")
OBJECT_CELLS = [  # (the cell, the name it binds, a later plain cell that uses it)
    ("sc = Scaler(x * 2.0)", "sc", "out = sc(x)"),
    ("fn = lambda v: v * sg + x", "fn", "out = fn(x)"),
    ("fp = functools.partial(jnp.add, x * 1.0)", "fp", "out = fp(x)"),
]

# Exercise cells (their answer `ans` made from x) and the plain cells that change it in place; some
# write back what it holds, a change of nothing.
ANSWERS = {
    "dict": "ans = {'s': float(np.asarray(x).sum()), 'v': np.asarray(x) * 2}",
    "list": "ans = [int(x.size), np.asarray(x) + 1]",
    "numpy": "ans = np.asarray(x) * 3",
}
CHANGES = {
    "dict": ["ans['s'] = ans['s'] + 1", "ans['v'][:1] = 7", "ans['s'] = ans['s']", "ans['v'] += 0",
             "ans['extra'] = 1", "del ans['s']"],
    "list": ["ans[0] = ans[0] + 1", "ans[1][-1:] = 5", "ans.append(0)", "ans[1] *= 1"],
    "numpy": ["ans[0] = ans[0] + 1", "ans[:] = ans * 1", "ans[-1:] = 9"],
}
RIGHT = "✓ right"

# A module whose config Flax keeps static (in its graphdef): every part of it changes the values.
CONFIGURED = """
from flax import nnx
class Configured(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.cfg = {'act': 'relu', 'deep': {'k': [1.0, 2.0]}}
        self.sizes = [4, 8]
        self.tags = {'a'}
    def __call__(self, v):
        y = self.lin(v)
        y = jax.nn.relu(y) if self.cfg['act'] == 'relu' else jnp.tanh(y)
        return y * len(self.sizes) + len(self.tags) + sum(self.cfg['deep']['k'])
cm = Configured()
xm = jnp.tile(jnp.reshape(x, (8, -1)) * 1.0, (1, 4))[:, :4] / 16
"""
CONFIG_CHANGES = ["cm.sizes.append(16)", "del cm.sizes[1:]", "cm.cfg['act'] = 'tanh'", "cm.cfg['act'] = 'relu'",
                  "cm.tags.add('b')", "cm.tags.discard('a')", "cm.cfg['deep']['k'].append(0.5)",
                  "cm.cfg['deep'] = {'k': [3.0]}", "cm.sizes = [4, 8]"]
CONFIG_CELL = ("ym = cm(xm)", ("ym",))


def _same_answer(a, b) -> bool:
    """Plain Python's equality of two answers, exact: structure, NumPy dtype, shape and bytes, float bits."""
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes()
    if isinstance(b, dict):
        return type(a) is dict and a.keys() == b.keys() and all(_same_answer(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return type(a) is list and len(a) == len(b) and all(_same_answer(p, q) for p, q in zip(a, b))
    if isinstance(b, float):
        return type(a) is float and struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


class NotebookWithObjects(base.Notebook):
    """The base sessions, plus assign_object and exercise answers changed in place."""

    def __init__(self):
        super().__init__()
        self.history.append(SCALER)
        self.play(SCALER)
        self.play("from jaxpar_magic import attempt, check")
        self.exercise = None  # (kind, the answer as the cell left it, plain Python's answer now, graded?)
        self.configured = False  # `cm` (a Configured module) and `xm` are defined

    @initialize(shape=st.sampled_from(base.SHAPES), dtype=st.sampled_from(base.DTYPES),
                fill=st.sampled_from(base.FILLS), sg=st.sampled_from(base.GLOBALS),
                helper=st.sampled_from(list(base.HELPERS)), op=st.sampled_from(base.OPERATORS),
                kind=st.sampled_from(list(ANSWERS)))
    def start(self, shape, dtype, fill, sg, helper, op, kind):
        """The base session's start, then an exercise cell (the base rules are many)."""
        super().start(shape, dtype, fill, sg, helper, op)
        self.run_exercise(kind)
        self.make_configured()

    # --- an NNX module configured by plain containers (issue 40 item 1) ---------------------------

    @rule()
    def make_configured(self):
        self.configured = True
        self.plain_step(CONFIGURED)

    @precondition(lambda self: self.configured)
    @rule(pick=st.integers(0, len(CONFIG_CHANGES) - 1))
    def change_config(self, pick):
        self.plain_step(CONFIG_CHANGES[pick])

    @precondition(lambda self: self.configured)
    @rule(magic=st.sampled_from(["shard", "shard_map", "pmap"]), show=st.booleans(),
          picks=st.lists(st.integers(0, len(CONFIG_CHANGES) - 1), min_size=1, max_size=3))
    def configured_changed_between_reruns(self, magic, show, picks):
        """The three cells in a row, the same cell each time (the rules above also come apart): each
        re-run, on the full path or on the re-run record, must see the change just made."""
        self.read_configured(magic, show)
        for pick in picks:
            self.change_config(pick)
            self.rerun_last()

    @precondition(lambda self: self.configured)
    @rule(magic=st.sampled_from(["shard", "shard_map", "pmap"]), show=st.booleans())
    def read_configured(self, magic, show):
        """The module read whole (%%shard), per block (%%shard_map) or broadcast to every device (%%pmap)."""
        shown = "" if show else " --no-show"
        base.Found.kinds[f"nnx config {magic}"] = base.Found.kinds.get(f"nnx config {magic}", 0) + 1
        if magic == "shard":
            self.check("shard", "--mesh mesh" + shown, CONFIG_CELL, self.oracle_whole)
        elif magic == "shard_map":
            self.check("shard_map", "--mesh mesh --in xm=data --out ym=data" + shown, CONFIG_CELL,
                       functools.partial(self.oracle_per_block, mapped="xm"))
        else:
            self.check("pmap", "--broadcast cm" + shown, CONFIG_CELL,
                       functools.partial(self.oracle_per_device, mapped="xm"))

    @rule(kind=st.sampled_from(list(ANSWERS)))
    def run_exercise(self, kind):
        base.Found.steps += 1
        ns = self.fresh_namespace()
        exec(ANSWERS[kind], ns)  # the oracle: the cell as plain Python
        self.exercise = (kind, copy.deepcopy(ns["ans"]), ns["ans"], False)
        self.session.append(f"%%exercise ans\n{ANSWERS[kind]}")
        with capture_output():
            result = self.shell.run_cell(f"%%exercise ans\n{ANSWERS[kind]}", store_history=False)
        result.raise_error()

    @precondition(lambda self: self.exercise is not None)
    @rule(pick=st.integers(0, 5))
    def change_answer(self, pick):
        kind, made, plain, graded = self.exercise
        change = CHANGES[kind][pick % len(CHANGES[kind])]
        base.Found.steps += 1
        exec(change, {"ans": plain, "np": np})
        self.session.append(change)
        self.play(change)

    @rule(kind=st.sampled_from(list(ANSWERS)), pick=st.integers(0, 5), against=st.sampled_from(["as the cell left it", "as it is now"]))
    def exercise_changed_then_checked(self, kind, pick, against):
        """The three cells in a row (the rules above also come apart, with other cells between)."""
        self.run_exercise(kind)
        self.change_answer(pick)
        self.check_answer(against)

    @precondition(lambda self: self.exercise is not None)
    @rule(against=st.sampled_from(["as the cell left it", "as it is now"]))
    def check_answer(self, against):
        """The check never grades a changed answer, or an answer graded before, as right."""
        kind, made, plain, graded = self.exercise
        self.exercise = (kind, made, plain, True)
        base.Found.steps += 1
        base.Found.checks += 1
        changed = not _same_answer(plain, made)
        base.Found.kinds[f"exercise check, {'changed' if changed else 'unchanged'}"] = \
            base.Found.kinds.get(f"exercise check, {'changed' if changed else 'unchanged'}", 0) + 1
        self.shell.user_ns["_expected"] = copy.deepcopy(made if against == "as the cell left it" else plain)
        source = 'check(attempt("ans")["ans"], _expected, hint="h")'
        self.session.append(f"{source}  # _expected: the answer {against}")
        with capture_output() as shown:
            result = self.shell.run_cell(source, store_history=False)
        del self.shell.user_ns["_expected"]
        result.raise_error()
        said = shown.stdout.strip()
        if changed or graded:
            assert not said.startswith(RIGHT), (f"the check graded an answer {'changed in place' if changed else 'graded before'} "
                                                f"as right: {said!r}{self.context()}")
        else:
            assert said == RIGHT, f"the answer as the exercise cell left it, not yet graded: {said!r}{self.context()}"

    @rule(pick=st.integers(0, len(OBJECT_CELLS) - 1))
    def assign_object(self, pick):
        source, name, use = OBJECT_CELLS[pick]
        base.Found.steps += 1
        base.Found.checks += 1
        ns = self.fresh_namespace()
        try:
            base._run_plain(source + "\n" + use, ns)
            expected, error = ns["out"], None
        except Exception as exc:  # noqa: BLE001
            expected, error = None, exc
        self.session.append(f"%%shard --mesh mesh --in x=data --no-show\n{source}")
        before = snapshot(self.ns)
        try:
            with capture_output():
                self.shell.run_cell_magic("shard", "--mesh mesh --in x=data --no-show", self.tag + source)
        except Exception as exc:  # noqa: BLE001
            from IPython.core.error import UsageError

            assert isinstance(exc, UsageError), f"the cell raised {exc!r}, not a UsageError{self.context()}"
            assert snapshot(self.ns) == before, f"a failed cell changed the namespace{self.context()}"
            base.Found.raised += 1
            return
        self.session.append(use)
        with capture_output():
            result = self.shell.run_cell(use, store_history=False, silent=True)
        if error is not None:
            assert result.error_in_exec is not None, f"plain JAX raised {error!r}, `{use}` did not{self.context()}"
            return
        if result.error_in_exec is not None:
            raise AssertionError(f"`{use}` raised {result.error_in_exec!r} on what the cell bound to {name}, where "
                                 f"plain Python's {name} works{self.context()}")
        self.compare(self.ns["out"], expected, use)


def test_cells_that_assign_objects_give_working_objects(jx, capsys):
    base.play_sessions(NotebookWithObjects, jx, capsys, "differential (objects, exercises)", max(4, base.EXAMPLES // 2))
