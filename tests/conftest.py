"""Shared fixtures: one IPython shell with the extension loaded, over 8 simulated CPU devices.

The device count is fixed here, before anything touches the JAX backend: the whole pytest process
shares one backend, so every in-process test sees 8 CPU devices. Whatever needs a fresh backend
(asking for another count, checking that `%load_ext` starts nothing) runs in a subprocess.

The device tier (tests/device/, marked `device`) is the exception: with JPM_DEVICE=1 the backend is
left as JAX finds it (a TPU or GPU where one is attached), only `device` tests run, and every other
test is skipped; without it the device tests are skipped with the command that runs them.
"""
from __future__ import annotations

import os
from pathlib import Path

import jax

DEVICE_TIER = os.environ.get("JPM_DEVICE") == "1"  # bench/device_check.sh sets it
if not DEVICE_TIER:
    jax.config.update("jax_platforms", "cpu")  # a GPU machine must not change what these tests see
    jax.config.update("jax_num_cpu_devices", 8)

import pytest  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from traitlets.config import Config  # noqa: E402

from shell_helpers import COMPILE_EVENT  # noqa: E402

# What marks a test `chapter` or `cluster` (see pytest_collection_modifyitems): a name it uses, itself,
# through its fixtures, or through its module's helper functions.
CHAPTER_NAMES = {"executed", "exercise_probes", "executed_source", "executed_tour"}  # tests/notebooks.py's kernel runs
CLUSTER_NAMES = {"Cluster", "healthy"}  # a real ipyparallel cluster (lifecycle.Cluster), or test_cluster_faults' fixture
CLUSTER_FILES = {"test_two_hosts.py", "test_cluster_magics.py", "test_cluster_faults.py"}  # engines started by scripts, `%cluster start` or a child kernel


@pytest.fixture(scope="session", autouse=True)
def _stop_chromium_at_the_end():
    yield
    from chromium import stop_shared_browser

    stop_shared_browser()


@pytest.fixture(autouse=True)
def _sigint_handler_kept():
    """A test must leave Python's SIGINT handler as it found it: `_thread.interrupt_main()` (how tests
    press Kernel -> Interrupt) does nothing under SIG_DFL or SIG_IGN and only calls another handler, so
    one test's leftover handler made a later interrupt test wait forever. Put back, and the test that
    left it fails, naming the handler."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT's handler changed: {after!r} (it was {before!r})", pytrace=False)


@pytest.fixture(autouse=True)
def _no_status_lines_kept_open():
    """A test must leave no kept status lines open (views/progress.kept_lines): a leftover one takes every
    later status line of the thread, which then never says "done" (an interrupt injected right after the
    push left one, and test_progress failed tests later). Cleared, and the test that left it fails."""
    from jaxpar_magic.views import progress

    yield
    kept = progress._keeping()
    if kept:
        kept.clear()
        pytest.fail("the test left a kept_lines() block open (views/progress.py)", pytrace=False)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """One JupyterLab server for the run, shared by tests/test_jupyterlab.py and
    test_jupyterlab_static.py: each test shuts its kernels down and opens notebooks of its own name,
    so none needs a fresh server (a start and stop costs ~20 s on 2 loaded cores)."""
    from test_jupyterlab import jupyter_server

    with jupyter_server(tmp_path_factory.mktemp("lab"), "jupyterlab") as server:
        yield server


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
        magics.view_values = "auto"


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


def _names_used(item) -> set[str]:
    """The global names a test reaches: its own code, its fixtures' and the module functions they
    call (transitively), with nested functions and lambdas; plus its fixture names."""
    import inspect

    names = set(item.fixturenames)
    module = getattr(item, "module", None)
    scope = vars(module) if module is not None else {}
    functions = [getattr(item, "function", None)]
    fixtures = getattr(item, "_fixtureinfo", None)  # absent on items that are not test functions
    functions += [d.func for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in defs]
    codes = [f.__code__ for f in map(inspect.unwrap, functions) if hasattr(f, "__code__")]
    seen = set()
    while codes:
        code = codes.pop()
        if code in seen:
            continue
        seen.add(code)
        names.update(code.co_names)
        codes += [c for c in code.co_consts if inspect.iscode(c)]
        codes += [scope[n].__code__ for n in code.co_names if inspect.isfunction(scope.get(n))]
    return names


def pytest_configure(config):
    """On a pytest-xdist worker (`scripts/test` runs `-n 2`): the folder the run's workers share,
    where tests/notebooks.py leaves each example chapter for the other worker."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "jpm_run_folder" in workerinput:
        import notebooks

        notebooks.SHARED = Path(workerinput["jpm_run_folder"])


_run_folder: list[Path] = []  # on the xdist controller: the folder its workers share


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hooks, called on the controller
def pytest_configure_node(node):
    if not _run_folder:
        import tempfile

        _run_folder.append(Path(tempfile.mkdtemp(prefix="jpm-run-")))
    node.workerinput["jpm_run_folder"] = str(_run_folder[0])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadgroup" and _run_folder:
        from xdist_groups import scheduler

        return scheduler(config, log, _run_folder[0])
    return None


def pytest_unconfigure(config):
    if _run_folder:
        import shutil

        shutil.rmtree(_run_folder.pop(), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Mark what `bash scripts/test --quick` leaves out: tests that run an example chapter in a
    kernel (`chapter`) and tests that start a real cluster (`cluster`). On an xdist worker, tell the
    controller which tests share a set-up (tests/xdist_groups.py)."""
    for item in items:
        _device_tier(item)
        names = _names_used(item)
        if names & CHAPTER_NAMES:
            item.add_marker(pytest.mark.chapter)
        if names & CLUSTER_NAMES or item.path.name in CLUSTER_FILES:
            item.add_marker(pytest.mark.cluster)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "jpm_run_folder" in workerinput:
        from xdist_groups import write_groups

        write_groups(Path(workerinput["jpm_run_folder"]), workerinput["workerid"], items)


def _device_tier(item) -> None:
    """Skip a `device` test outside the device tier, and every other test inside it."""
    if DEVICE_TIER and item.get_closest_marker("device") is None:
        item.add_marker(pytest.mark.skip(reason="JPM_DEVICE=1 runs only the device tier (tests/device/)"))
    elif not DEVICE_TIER and item.get_closest_marker("device") is not None:
        item.add_marker(pytest.mark.skip(reason="the device tier runs on a machine with an accelerator, alone: "
                                                "JPM_DEVICE=1 python -m pytest tests/device (bench/device_check.sh)"))


KINDS = ("browser", "cluster", "chapter", "slow")
_deselected: dict[str, tuple[str, tuple[str, ...]]] = {}  # node id: (file name, its KINDS)
_runs: list[tuple[str, float]] = []  # the notebooks xdist's workers ran (tests/notebooks.py's RUNS)
_workers: dict[str, list[float]] = {}  # on the xdist controller: worker id -> [seconds in tests, last report's time]


def pytest_deselected(items):
    for item in items:
        _deselected[item.nodeid] = (item.path.name, tuple(k for k in KINDS if item.get_closest_marker(k)))


def pytest_runtest_logreport(report):
    """On the xdist controller: how long each worker spent in tests, and when it last reported, for
    the end of the run (a worker that finishes long before the other shows a grouping to split)."""
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None:
        import time

        busy = _workers.setdefault(worker.id, [0.0, 0.0])
        busy[0] += report.duration
        busy[1] = time.monotonic()


def pytest_sessionfinish(session):
    """On an xdist worker: send what the end of the run reports to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        import sys

        workeroutput["jpm_runs"] = list(getattr(sys.modules.get("notebooks"), "RUNS", []))
        workeroutput["jpm_deselected"] = _deselected


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called on the controller
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    _runs.extend(tuple(run) for run in output.get("jpm_runs", []))
    _deselected.update(output.get("jpm_deselected", {}))  # every worker deselects the same tests


def pytest_terminal_summary(terminalreporter):
    """Each xdist worker's time in tests, the notebooks run in a kernel (each example chapter once per
    run), and what `-m` left out (e.g. `scripts/test --quick`), by marker, so a quick run is not
    mistaken for the whole suite."""
    import collections
    import sys

    if _workers:
        ends = [last for _, last in _workers.values()]
        said = ", ".join(f"{worker} {busy:.0f} s in tests" for worker, (busy, _) in sorted(_workers.items()))
        terminalreporter.write_sep("-", f"workers: {said}; the first to finish ended {max(ends) - min(ends):.0f} s "
                                        "before the last")
    notebooks = sys.modules.get("notebooks")  # imported only by the tests that run notebooks
    runs = _runs + getattr(notebooks, "RUNS", [])
    if runs:
        total = sum(seconds for _, seconds in runs)
        terminalreporter.write_sep("-", f"notebooks run in a kernel: {len(runs)}, {total:.0f} s in all")
        terminalreporter.write_line(", ".join(f"{name} {seconds:.0f} s" for name, seconds in runs))
        counted = collections.Counter(name for name, _ in runs if name.endswith(".ipynb"))
        again = sorted(name for name, count in counted.items() if count > 1)
        if again:
            terminalreporter.write_line(f"run more than once (share tests/notebooks.py's executed()): {again}")
    if not _deselected:
        return
    counts = {kind: sum(1 for _, kinds in _deselected.values() if kind in kinds) for kind in KINDS}
    files = sorted({name for name, _ in _deselected.values()})
    said = ", ".join(f"{count} {kind}" for kind, count in counts.items() if count)
    marked = f" ({said}; a test may have several marks)" if said else ""
    terminalreporter.write_sep("-", f"not run here (deselected by -m or -k): {len(_deselected)} tests{marked}")
    terminalreporter.write_line(f"from {len(files)} files: {' '.join(files)}")
