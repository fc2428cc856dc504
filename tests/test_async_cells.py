"""A cell returns once its program is dispatched, as `jax.jit` does (issue 39): a `--no-show` re-run of
a program without collectives comes back while the devices still work, and its values, read later,
equal plain JAX's. Where the wait stays: a first run (its status line, its compile time), `--report`
(it times the run), and programs with collectives on XLA:CPU (the 2-core deadlock, tests/test_cpu_hang.py).

The slow program is a loop whose trip count is an input, so one compiled program runs for
microseconds on the first call and for a good fraction of a second on the re-run.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shell_helpers import N_DEVICES, shown_widgets

LOOP = "y = lax.fori_loop(0, n, lambda i, a: jnp.sin(a) * 0.5 + 0.25, x)\n"


def step(a):
    return jnp.sin(a) * 0.5 + 0.25


def plain_loop(x, n):
    return lax.fori_loop(0, n, lambda i, a: step(a), x)


@pytest.fixture(scope="module")
def trips():
    """Loop trips that keep plain `jax.jit` busy for about a quarter of a second on this machine now (a
    program far longer than a dispatch, whatever the load)."""
    f = jax.jit(plain_loop)
    x = jnp.arange(64.0)
    jax.block_until_ready(f(x, jnp.int32(1)))
    probe = 20_000
    start = time.perf_counter()
    jax.block_until_ready(f(x, jnp.int32(probe)))
    seconds = time.perf_counter() - start
    return int(min(probe * 0.25 / max(seconds, 1e-4), 5_000_000))


def mesh(ip, line: str):
    with capture_output():
        ip.run_line_magic("mesh", line + " --no-show")


def returned_before_its_program(ip, run, trips: int):
    """Run `run()` (a cell reading `n`) with `n = trips`, doubling the trips while the cell itself took
    longer than its program (a machine so loaded that Python crawls can make a cell outlast any
    fixed program): (whether y was still being computed when the cell returned, the trips it ran).
    Never a vacuous pass: it answers from a run whose program outlasted its cell twice over, or fails."""
    for _ in range(4):
        ip.push({"n": jnp.int32(trips)})
        start = time.perf_counter()
        result = run()
        returned = time.perf_counter() - start
        running = not ip.user_ns["y"].is_ready()
        jax.block_until_ready(ip.user_ns["y"])
        if running or time.perf_counter() - start > 2 * returned:
            return running, trips, result
        trips *= 3
    raise AssertionError("no cell returned before its program ended: it waits for it (or the machine is too "
                         "loaded to tell)")


CASES = {
    # magic: (line, the plain-JAX twin of the cell on the same inputs)
    "shard": ("--mesh mesh --in x=data --no-show", lambda mesh: jax.jit(plain_loop)),
    "shard_map": ("--mesh mesh --in x=data --out y=data --no-show",
                  lambda mesh: jax.jit(jax.shard_map(plain_loop, mesh=mesh, in_specs=(P("data"), P()),
                                                     out_specs=P("data")))),
    "pmap": ("--broadcast n --no-show", lambda mesh: jax.pmap(plain_loop, in_axes=(0, None))),
}


@pytest.mark.parametrize("magic", list(CASES))
def test_a_no_show_rerun_returns_before_its_program_finishes(jx, trips, magic):
    mesh(jx, "data=8")
    line, twin = CASES[magic]
    x = jnp.arange(64.0).reshape(N_DEVICES, 8) / 64 if magic == "pmap" else jnp.arange(64.0) / 64
    if magic != "pmap":
        x = jax.device_put(x, NamedSharding(jx.user_ns["mesh"], P("data")))
    jx.push({"x": x, "n": jnp.int32(1)})
    jx.run_cell_magic(magic, line, LOOP)  # the first run: compiles, and waits for its result
    assert jx.user_ns["y"].is_ready()
    # The same program, running for a quarter of a second or more.
    running, trips, _ = returned_before_its_program(jx, lambda: jx.run_cell_magic(magic, line, LOOP), trips)
    assert running, "the cell waited for its program"
    expected = twin(jx.user_ns["mesh"])(x, jnp.int32(trips))
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.asarray(expected))


def test_a_function_bound_by_pmap_returns_before_its_program_finishes(jx, trips):
    jx.run_cell_magic("pmap", "--in-axes (0,None) --no-show", "def loop(x, n):\n"
                      "    return lax.fori_loop(0, n, lambda i, a: jnp.sin(a) * 0.5 + 0.25, x)\n")
    loop = jx.user_ns["loop"]
    x = jnp.arange(64.0).reshape(N_DEVICES, 8) / 64
    loop(x, jnp.int32(1))  # the first call compiles and waits
    y = loop(x, jnp.int32(trips))
    assert not y.is_ready()
    expected = jax.pmap(plain_loop, in_axes=(0, None))(x, jnp.int32(trips))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(expected))


def test_programs_with_collectives_on_cpu_still_wait(jx, trips):
    """The README's "Many small collective programs" guard: on XLA:CPU a program with collectives is
    waited for, one in flight at a time."""
    jx.push({"x": jnp.arange(64.0).reshape(N_DEVICES, 8) / 64, "n": jnp.int32(1)})
    cell = "y = lax.psum(lax.fori_loop(0, n, lambda i, a: jnp.sin(a) * 0.5 + 0.25, x), 'i')\n"
    jx.run_cell_magic("pmap", "--broadcast n --no-show", cell)
    jx.push({"n": jnp.int32(trips // 4)})
    jx.run_cell_magic("pmap", "--broadcast n --no-show", cell)
    assert jx.user_ns["y"].is_ready()
    expected = jax.pmap(lambda x, n: lax.psum(plain_loop(x, n), "i"), axis_name="i", in_axes=(0, None))(
        jx.user_ns["x"], jnp.int32(trips // 4))
    np.testing.assert_allclose(np.asarray(jx.user_ns["y"]), np.asarray(expected), rtol=1e-6)


def test_report_waits_for_the_result_it_times(jx, trips):
    mesh(jx, "data=8")
    x = jax.device_put(jnp.arange(64.0) / 64, NamedSharding(jx.user_ns["mesh"], P("data")))
    jx.push({"x": x, "n": jnp.int32(1)})
    line = "--mesh mesh --in x=data --no-show"
    jx.run_cell_magic("shard", line, LOOP)
    jx.push({"n": jnp.int32(trips)})
    with capture_output() as captured:
        jx.run_cell_magic("shard", line + " --report", LOOP)
    assert jx.user_ns["y"].is_ready()
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    assert "run (waited for its result)" in view.to_text()
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.asarray(jax.jit(plain_loop)(x, jnp.int32(trips))))


# --- a shown cell: its view first, its values when they are ready ------------------------------------

def shown(ip, magic: str, line: str, source: str):
    """Run a shown cell; returns (the displayed static twin's text, the ResultView widget)."""
    with capture_output() as captured:
        ip.run_cell_magic(magic, line, source)
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    (twin,) = [o.data for o in captured.outputs if "jpm-twin-" + view._jpm_twin in o.data.get("text/html", "")]
    return twin["text/plain"], view


def tile_values(view) -> dict:
    return {o["name"]: [t["text"] for t in o["tiles"]] for o in view.state["outputs"]}


@pytest.mark.parametrize("magic, line", [("pmap", "--broadcast n"),
                                         ("shard_map", "--mesh mesh --in x=data --out y=data")])
def test_a_shown_cell_returns_before_its_values_and_fills_them_in(jx, trips, magic, line):
    from jaxpar_magic.views.later import wait_for_fills
    from jaxpar_magic.views.values import PENDING_TEXT, result_state

    mesh(jx, "data=8")
    jx.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    x = jnp.arange(64.0).reshape(N_DEVICES, 8) / 64
    if magic == "shard_map":
        x = jax.device_put(jnp.arange(64.0) / 64, NamedSharding(jx.user_ns["mesh"], P("data")))
    jx.push({"x": x, "n": jnp.int32(1)})
    shown(jx, magic, line, LOOP)  # compiles the cell and its views' small programs
    assert wait_for_fills(60)
    # On 2 cores the devices' threads slow a shown cell's Python down to 0.1-0.3 s: a program of about a second.
    running, trips, (text, view) = returned_before_its_program(jx, lambda: shown(jx, magic, line, LOOP), trips * 4)
    assert running, "the shown cell waited for its program"
    assert PENDING_TEXT in text and "dev 0" not in text  # drawn at once, without values
    assert wait_for_fills(60)
    twin = jax.pmap(plain_loop, in_axes=(0, None)) if magic == "pmap" else CASES["shard_map"][1](jx.user_ns["mesh"])
    expected = twin(x, jnp.int32(trips))
    shown_mesh = jx.user_ns["mesh"] if magic == "shard_map" else jax.make_mesh((N_DEVICES,), ("i",))
    plain_state = result_state("", shown_mesh, {"y": expected}, blocks=magic == "shard_map")  # from plain JAX
    assert tile_values(view) == {o["name"]: [t["text"] for t in o["tiles"]] for o in plain_state["outputs"]}
    assert PENDING_TEXT not in view.to_text() and plain_state["outputs"][0]["tiles"][0]["text"] in view.to_html()


def test_a_shown_rerun_reads_its_layout_once_and_shows_its_own_values(jx, monkeypatch):
    """What a %%shard_map output's layout decides is read once (views/values._BlockLayout), not every
    re-run; every re-run still shows its own values: each tile, the first values of its device's block
    as NumPy prints them."""
    from jaxpar_magic.views import values
    from jaxpar_magic.views.later import wait_for_fills

    mesh(jx, "data=8")
    jx.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    jx.push({"x": jax.device_put(jnp.arange(64.0) / 7, NamedSharding(jx.user_ns["mesh"], P("data")))})
    made = []
    real = values._BlockLayout.__init__
    monkeypatch.setattr(values._BlockLayout, "__init__", lambda self, *a: made.append(a[0]) or real(self, *a))
    for _ in range(3):
        with capture_output() as captured:
            jx.run_cell_magic("shard_map", "--mesh mesh --in x=data --out x=data", "x = x * 1.5 + 0.25")
        assert wait_for_fills(60)
        (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
        ids = [d.id for d in jx.user_ns["mesh"].devices.flat]
        blocks = {s.device.id: np.asarray(s.data) for s in jx.user_ns["x"].addressable_shards}
        assert [t["text"] for t in view.state["outputs"][0]["tiles"]] == [
            "[" + np.array2string(blocks[i][:4], precision=4, suppress_small=True)[1:-1].strip() + " …]" for i in ids]
    assert len(made) <= 1  # the first run's (or an earlier test's, on an equal mesh)


def test_a_view_whose_values_cannot_be_read_says_so(jx):
    """The values' arrays gone before they were read (an error the program raised on the devices ends
    the same way): the view says why, and shows no value."""
    from jaxpar_magic.views.later import fill
    from jaxpar_magic.views.results import ResultView
    from jaxpar_magic.views.values import result_parts

    state, pending = result_parts("t", jax.make_mesh((N_DEVICES,), ("i",)), {"y": jnp.ones((N_DEVICES, 3))})
    for _, arrays, _ in pending.parts:
        for array in arrays:
            array.delete()
    view = ResultView(state=state)
    fill(view, pending, static=False)
    (output,) = view.state["outputs"]
    assert output["error"].startswith("RuntimeError") and "deleted" in output["error"]
    assert "values unavailable: RuntimeError" in view.to_text() and not output.get("tiles")
    # Later shown cells push those arrays out of the in-flight window (values.CPU_IN_FLIGHT): no error of theirs.
    from jaxpar_magic.views.later import wait_for_fills
    from jaxpar_magic.views.values import CPU_IN_FLIGHT

    jx.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    for _ in range(CPU_IN_FLIGHT + 1):
        shown(jx, "pmap", "", "y = x + 1\n")
    assert wait_for_fills(60)
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(float(N_DEVICES)) + 1)


def test_in_a_terminal_the_view_waits_for_its_values(jx, trips):
    """view_values 'auto' outside a kernel: the printed text is all a terminal gets, so it holds the values."""
    jx.push({"x": jnp.arange(64.0).reshape(N_DEVICES, 8) / 64, "n": jnp.int32(trips // 4)})
    text, view = shown(jx, "pmap", "--broadcast n", LOOP)
    assert jx.user_ns["y"].is_ready() and "dev 0 (i=0): [" in text
    assert all(not o.get("pending") for o in view.state["outputs"])


def test_views_shown_while_the_values_thread_waits_start_their_transfers_together():
    """views/later.py: the views queued while the thread waits for an earlier view's values start
    their device-to-host copies together before it reads any of them, so their waits overlap (one
    read waits ~0.6 ms on the TPU host) instead of adding up."""
    import threading

    from jaxpar_magic.views import later

    events, release = [], threading.Event()

    class Pending:
        def __init__(self, name, hold=False):
            self.name, self.hold = name, hold

        def start_transfers(self):
            events.append(f"start {self.name}")

        def outputs(self):
            if self.hold:
                assert release.wait(30)
            events.append(f"read {self.name}")
            return []

    class View:
        state: dict = {}

    later.fill_later(View(), Pending("first", hold=True), static=False)
    deadline = time.monotonic() + 30
    while "start first" not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    later.fill_later(View(), Pending("second"), static=False)
    later.fill_later(View(), Pending("third"), static=False)
    release.set()
    assert later.wait_for_fills(30)
    assert events == ["start first", "read first", "start second", "start third", "read second", "read third"]


class _HeldThread:
    """Hold the values thread (views/later.py) inside a first job until `release()`, so that views
    shown meanwhile keep their small programs undispatched: the case where a later cell may donate the
    outputs those programs read before the thread gets to them."""

    def __init__(self):
        import threading

        from jaxpar_magic.views import later

        self.gate, self.entered = threading.Event(), threading.Event()
        held = self

        class Blocking:
            def start_transfers(self):
                held.entered.set()
                assert held.gate.wait(60)

            def outputs(self):
                return []

        class View:
            state: dict = {}

        later.fill_later(View(), Blocking(), static=False)
        assert self.entered.wait(30)

    def release(self):
        self.gate.set()


@pytest.mark.parametrize("donor", ["magic", "plain cell"])
def test_a_shown_views_values_are_read_before_a_later_cell_donates_its_output(jx, donor):
    """A shown %%shard_map view's values come after the cell returned (the values thread reads them).
    A next cell that donates the cell's output (our --donate, or plain `jax.jit(donate_argnums=0)` in a
    plain cell) while the thread has not read them yet: the view shows the output's values before the
    donation, as plain JAX computed them, not "unavailable", not the next step's, and the kernel lives.
    (Why the view's small program is dispatched by the showing cell itself, not later by the values
    thread, which would save the cell ~116 µs on the TPU host: dispatched after a donation, it crashes
    the process, "Buffer has been deleted or donated", and a donation in code that runs right after
    the cell, in the same Python, cannot be made to wait for it.)"""
    from jaxpar_magic.views import later

    mesh(jx, "data=8")
    jx.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    x0 = jnp.arange(64.0) / 7
    jx.push({"x": jax.device_put(x0, NamedSharding(jx.user_ns["mesh"], P("data")))})
    jx.run_cell("import jax, jax.numpy as jnp")
    cell = "x = x * 1.5 + 0.25"
    with capture_output():  # compiled once, its views' small programs too
        jx.run_cell_magic("shard_map", "--mesh mesh --in x=data --out x=data", cell)
    assert later.wait_for_fills(60)
    held = _HeldThread()
    try:
        with capture_output() as captured:
            jx.run_cell_magic("shard_map", "--mesh mesh --in x=data --out x=data", cell)
        (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
        shown_x = jx.user_ns["x"]
        shown_full = (np.asarray(x0) * 1.5 + 0.25) * 1.5 + 0.25  # the cell ran twice; read no buffer of x
        expected_blocks = {d.id: shown_full[index] for d, index in
                           shown_x.sharding.devices_indices_map(shown_x.shape).items()}
        if donor == "magic":
            with capture_output():
                jx.run_cell_magic("shard", "--mesh mesh --in x=data --donate x --no-show", "x = x * 3.0")
        else:
            jx.run_cell("x = jax.jit(lambda a: a * 3.0, donate_argnums=0)(x)")
        np.testing.assert_allclose(np.asarray(jx.user_ns["x"]), shown_full * 3.0, rtol=1e-6)
    finally:
        held.release()
    assert later.wait_for_fills(60)
    ids = [d.id for d in jx.user_ns["mesh"].devices.flat]
    (output,) = view.state["outputs"]
    assert "error" not in output, output.get("error")
    assert [t["text"] for t in output["tiles"]] == [
        "[" + np.array2string(expected_blocks[i][:4], precision=4, suppress_small=True)[1:-1].strip() + " …]"
        for i in ids]


def test_views_are_filled_in_the_pauses_of_the_magics(jx, trips, monkeypatch):
    """views/later.py: the values thread fills shown views only once no magic has run for QUIET_S, so
    that in a loop of shown cells its Python does not take turns with the cells' for the GIL; and a
    view whose cell is followed by a long magic is filled during it, DEFER_MAX_S after it was shown."""
    from jaxpar_magic.views import later

    mesh(jx, "data=8")
    jx.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    jx.push({"x": jax.device_put(jnp.arange(64.0) / 7, NamedSharding(jx.user_ns["mesh"], P("data")))})
    fills = []
    plain_fill = later.fill
    monkeypatch.setattr(later, "fill", lambda *args: fills.append(time.monotonic()) or plain_fill(*args))

    def shown_cell(source="x = x * 0.5 + 1.0", line="--mesh mesh --in x=data --out x=data"):
        began = time.monotonic()
        with capture_output():
            jx.run_cell_magic("shard_map", line, source)
        return began, time.monotonic()

    shown_cell()  # compiled, its view's small program too
    assert later.wait_for_fills(60)
    fills.clear()
    monkeypatch.setattr(later, "DEFER_MAX_S", 60.0)  # however loaded the machine, only pauses fill
    runs = [shown_cell() for _ in range(6)]
    assert later.wait_for_fills(60) and len(fills) == 6
    assert not [(f, r) for f in fills for r in runs if r[0] <= f <= r[1]], "a view was filled while a magic ran"
    assert all(f - runs[-1][1] >= later.QUIET_S * 0.9 for f in fills)

    # A long magic after a shown cell (--report waits for its program on every run, even when an earlier
    # test compiled the cell): the view is filled during it, once DEFER_MAX_S has passed. The loop's
    # trips grow until the magic lasts 0.2 s (the calibration ran plain jit on one device; the cell's
    # eight shards, and the load, differ), so the case is never skipped.
    monkeypatch.setattr(later, "DEFER_MAX_S", 0.02)
    jx.push({"lax": lax})
    for growth in (2, 8, 32, 128):
        fills.clear()
        shown = shown_cell()
        jx.push({"n": jnp.int32(min(trips * growth, 2**31 - 1))})
        long_run = shown_cell(LOOP, "--mesh mesh --in x=data --out y=data --no-show --report")
        assert later.wait_for_fills(60) and len(fills) == 1
        if long_run[1] - long_run[0] >= 0.2:
            break
    assert long_run[1] - long_run[0] >= 0.2, "the long magic was not long: the case did not happen"
    assert long_run[0] <= fills[0] <= long_run[1] and fills[0] - shown[1] >= 0.02 * 0.9, (shown, long_run, fills)
