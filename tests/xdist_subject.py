"""Run by tests/test_xdist_groups.py only (in a pytest of its own, with `-n 2 --dist loadgroup`):
tests that share a module-scoped set-up, tests that share nothing, and a value computed once per run.
Each test writes where it ran to $JPM_SUBJECT_OUT."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

OUT = Path(os.environ.get("JPM_SUBJECT_OUT", "."))


def note(line: str) -> None:
    with open(OUT / "notes.txt", "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {line}\n")


@pytest.fixture(scope="module")
def shared():
    note("set-up")
    return "made once"


@pytest.mark.parametrize("n", range(6))
def test_sharing_a_set_up(shared, n):
    note(f"shared {n}")


@pytest.mark.parametrize("n", range(6))
def test_computed_once_per_run(n):
    from notebooks import once_per_run

    assert once_per_run("subject", lambda: note("computed") or "the value") == "the value"
    note(f"alone {n}")
