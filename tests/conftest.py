"""Shared fixtures: one IPython shell with the extension loaded, over 8 simulated CPU devices.

The device count is fixed here, before anything touches the JAX backend: the whole pytest process
shares one backend, so every in-process test sees 8 CPU devices. Whatever needs a fresh backend
(asking for another count, checking that `%load_ext` starts nothing) runs in a subprocess.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import jax

jax.config.update("jax_platforms", "cpu")  # a GPU machine must not change what these tests see
jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402
from traitlets.config import Config  # noqa: E402

N_DEVICES = 8
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture(scope="session")
def _shell():
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "jaxpar_magic")
    baseline = dict(shell.user_ns)
    yield shell, baseline
    InteractiveShell.clear_instance()


@pytest.fixture
def ip(_shell):
    """The shell with the extension loaded and a user namespace holding only IPython's own names."""
    shell, baseline = _shell
    if shell.find_cell_magic("pmap") is None:  # a test unloaded the extension
        shell.run_line_magic("load_ext", "jaxpar_magic")
    ns = shell.user_ns
    ns.clear()
    ns.update(baseline)
    yield shell
    ns.clear()
    ns.update(baseline)
    shell.config.pop("JaxparMagics", None)
    magics = shell.magics_manager.registry.get("JaxparMagics")
    if magics is not None:  # undo any %config of the test
        magics.axis_name = "i"
        magics.show = True


@pytest.fixture
def jx(ip):
    """The shell with jax, jnp, lax and np already imported in the user namespace."""
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    ip.push({"jax": jax, "jnp": jnp, "lax": lax, "np": np})
    return ip


def pmap(ip, line: str, source: str):
    """Run a `%%pmap` cell the way a notebook does; returns what the cell returns."""
    return ip.run_cell_magic("pmap", line, textwrap.dedent(source))


def snapshot(ns: dict) -> dict:
    """Names and identities of a namespace, to show a failed cell changed nothing."""
    return {name: id(value) for name, value in ns.items()}


def shown_widgets(captured) -> list:
    """The widget objects a cell displayed, found by the model ids in the captured mime bundles."""
    from ipywidgets.widgets.widget import _instances

    found = []
    for output in captured.outputs:
        ref = output.data.get("application/vnd.jupyter.widget-view+json")
        if ref is not None:
            found.append(_instances[ref["model_id"]])
    return found


def shown_state(ip, line: str, source: str) -> tuple[object, dict]:
    """Run a cell with --show and return (its return value, the displayed ResultView's state)."""
    with capture_output() as captured:
        value = pmap(ip, line, source)
    views = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    assert len(views) == 1, f"expected one ResultView, got {captured.outputs!r}"
    return value, views[0].state


class CompileCounter:
    """Counts XLA backend compiles through the public jax.monitoring events."""

    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kwargs):
        if event == COMPILE_EVENT:
            self.count += 1


@pytest.fixture
def compiles():
    import jax.monitoring

    counter = CompileCounter()
    jax.monitoring.register_event_duration_secs_listener(counter)
    yield counter
    jax.monitoring.unregister_event_duration_listener(counter)


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a fresh JAX backend) with this Python, importing the
    installed package (the working directory is a temporary one, not the checkout)."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    env.pop("JAXPAR_SIMULATED_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tempfile.gettempdir(),
    )
