"""`scripts/test` runs `-n 2 --dist loadgroup`: the tests that share a module-scoped set-up run on one
worker, so it is made once per run (tests/xdist_groups.py), and `notebooks.once_per_run` computes once
across the workers (each example chapter runs once). Checked on tests/xdist_subject.py, in a pytest of
its own."""
from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from notebooks import ROOT

pytestmark = pytest.mark.slow


def test_a_module_set_up_is_made_once_and_a_shared_value_computed_once(tmp_path):
    pytest.importorskip("xdist", reason="scripts/test installs pytest-xdist with the test extra")
    env = {**os.environ, "JPM_SUBJECT_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider",
                           "tests/xdist_subject.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    notes = [line.split(" ", 1) for line in (tmp_path / "notes.txt").read_text().splitlines()]
    said = collections.Counter(what for _, what in notes)
    assert said["set-up"] == 1, notes  # all six tests on the worker that made it
    assert {worker for worker, what in notes if what.startswith("shared")} == {worker for worker, what in notes
                                                                               if what == "set-up"}
    assert said["computed"] == 1, notes
    assert sum(what.startswith("alone") for _, what in notes) == 6
    assert {worker for worker, _ in notes} <= {"gw0", "gw1"}
