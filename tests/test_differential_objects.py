"""The differential sessions of tests/test_differential.py, with %%shard cells that assign an object
holding an array, a closure over one and a functools.partial (issue 33 item 5), each used by a later
plain cell: plain Python gives a working object, so the magic must bind one that works (the later
call gives plain JAX's values) or refuse with a UsageError that leaves the namespace as it was, never
an object holding a leaked tracer. Same budget variables as the base test.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test
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


class NotebookWithObjects(base.Notebook):
    """The base sessions, plus assign_object."""

    def __init__(self):
        super().__init__()
        self.history.append(SCALER)
        self.play(SCALER)

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
    NotebookWithObjects.shell = jx
    NotebookWithObjects.baseline = dict(jx.user_ns)
    base.Found.sequences = base.Found.steps = base.Found.checks = base.Found.raised = 0
    run = settings(max_examples=max(4, base.EXAMPLES // 4), stateful_step_count=base.STEPS, deadline=None, database=None,
                   derandomize=not base.RANDOM, suppress_health_check=list(HealthCheck), print_blob=True,
                   phases=[Phase.explicit, Phase.generate])  # no shrinking while the mark stands: it fails fast
    run_state_machine_as_test(NotebookWithObjects, settings=run)
    assert base.Found.checks > 0
