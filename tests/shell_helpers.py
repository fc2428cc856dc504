"""Helpers the tests import (a plain module: `from conftest import ...` is ambiguous once
tests/browser/conftest.py is collected too)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

from IPython.utils.capture import capture_output

N_DEVICES = 8
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def pmap(ip, line: str, source: str):
    """Run a `%%pmap` cell the way a notebook does; returns what the cell returns."""
    return ip.run_cell_magic("pmap", line, textwrap.dedent(source))


def snapshot(ns: dict) -> dict:
    """Names and identities of a namespace, to show a failed cell changed nothing."""
    return {name: id(value) for name, value in ns.items()}


def assert_same_nnx_state(mine, twin) -> None:
    """Every array leaf of two Flax NNX objects' states, equal exactly (and the same structure)."""
    import jax
    import numpy as np
    from flax import nnx

    mine_leaves, mine_tree = jax.tree.flatten(nnx.state(mine))
    twin_leaves, twin_tree = jax.tree.flatten(nnx.state(twin))
    assert mine_tree == twin_tree
    for a, b in zip(mine_leaves, twin_leaves):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


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


def run_python(code: str, timeout: float = 120, platforms: str | None = "cpu",
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a fresh JAX backend) with this Python, importing the
    installed package (the working directory is a temporary one, not the checkout). `platforms`:
    JAX_PLATFORMS for it; None leaves it unset, as a user's kernel has it. `env`: variables to set
    besides (PYTHONPATH, PYTHONUSERBASE...)."""
    env = {**os.environ, **(env or {})}
    env.pop("JAX_PLATFORMS", None)
    if platforms is not None:
        env["JAX_PLATFORMS"] = platforms
    env.pop("XLA_FLAGS", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tempfile.gettempdir(),
    )


FRESH_SHELL = """
import jax
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.error import UsageError
ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "jaxpar_magic")
ip.push({"jax": jax, "jnp": jnp})
"""


def in_a_fresh_shell(body: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `body` in a fresh interpreter's shell (`ip`, on 8 simulated CPU devices, the extension loaded;
    `jax`, `jnp` and `UsageError` imported), through `run_python`. Nothing has compiled yet: the body
    may still set JAX's options that are read at the first compile."""
    return run_python(FRESH_SHELL + textwrap.dedent(body), timeout=timeout, env=env)


def package_lines(on_line):
    """A sys.settrace function calling `on_line()` at each line jaxpar_magic's own code executes: where a
    test presses Kernel -> Interrupt (`_thread.interrupt_main()`) at every point of a cell."""
    import jaxpar_magic

    package = os.path.dirname(jaxpar_magic.__file__) + os.sep

    def local(frame, event, arg):
        if event == "line":
            on_line()
        return local

    return lambda frame, event, arg: local if frame.f_code.co_filename.startswith(package) else None


def settle() -> None:
    """Calls: where a pending interrupt is raised, if the cell returned before Python checked for it."""
    for _ in range(3):
        len(())
