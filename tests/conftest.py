"""Shared fixtures: one IPython shell with the extension loaded, over 8 simulated CPU devices.

The device count is fixed here, before anything touches the JAX backend: the whole pytest process
shares one backend, so every in-process test sees 8 CPU devices. Whatever needs a fresh backend
(asking for another count, checking that `%load_ext` starts nothing) runs in a subprocess.
"""
from __future__ import annotations


import jax

jax.config.update("jax_platforms", "cpu")  # a GPU machine must not change what these tests see
jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from traitlets.config import Config  # noqa: E402

from shell_helpers import COMPILE_EVENT  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _stop_chromium_at_the_end():
    yield
    from chromium import stop_shared_browser

    stop_shared_browser()


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
