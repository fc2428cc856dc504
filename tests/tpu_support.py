"""The optional libtpu: tests of XLA:TPU plans need it. Without it they are skipped with a message,
except under CI, where they fail: CI installs `.[tpu]` and must test the TPU compile on every run
(as tests/chromium.py does for the browser tests)."""
from __future__ import annotations

import os

import pytest

INSTALL = "pip install -e '.[test,lab,tpu]'"


def has_libtpu() -> bool:
    from jaxpar_magic.stages.plan.target import libtpu_version

    return libtpu_version() is not None


def require_libtpu() -> None:
    """Skip (or, under CI, fail) when libtpu is not installed."""
    if has_libtpu():
        return
    msg = f"XLA:TPU plans need the optional libtpu ({INSTALL})"
    if os.environ.get("CI"):
        pytest.fail(f"{msg}: CI must install it (.ci/run, scripts/test)")
    pytest.skip(msg)
