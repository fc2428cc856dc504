"""The device tier: what only an attached accelerator can show (issue 39).

Run alone, in one process (one process at a time can hold a TPU), with the backend JAX finds:

    JPM_DEVICE=1 python -m pytest -p no:cacheprovider tests/device

(bench/device_check.sh does it on a TPU VM from a checkout, and writes a summary). Without
JPM_DEVICE=1 every test here is skipped with that command as the reason (tests/conftest.py); with it
on a machine without an accelerator (the dry run), the comparisons with plain JAX run on the CPU and
what needs a chip is skipped with its reason.

Figures a test measures (a plan's bytes beside the chip's, compile counts, `%devices`' text) go to
`figures`, written to $JPM_DEVICE_OUT/device_figures.json at the end for the summary.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import pytest
from IPython.utils.capture import capture_output

_FIGURES: dict = {}


@pytest.fixture(scope="session")
def figures():
    """A dict the tests fill with what they measured; saved at the end of the session."""
    yield _FIGURES
    out = os.environ.get("JPM_DEVICE_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "device_figures.json").write_text(json.dumps(_FIGURES, indent=2, default=str))


@pytest.fixture(scope="session")
def platform() -> str:
    return jax.devices()[0].platform


@pytest.fixture
def tpu(platform):
    """Skip unless JAX's devices are TPUs: what is compared here is XLA:TPU's and the chip's own."""
    if platform != "tpu":
        pytest.skip(f"needs a TPU: JAX's devices here are {platform} (a dry run, or another accelerator)")


@pytest.fixture
def mesh(jx):
    """`%mesh data=N` over every device (N = 1 on one chip), bound as `mesh`."""
    with capture_output():
        jx.run_line_magic("mesh", f"data={jax.device_count()} --no-show")
    return jx.user_ns["mesh"]
