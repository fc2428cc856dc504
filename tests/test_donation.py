"""%%shard --donate where a donation can go wrong: one buffer donated twice or donated and also read,
an interrupt once the program has its inputs, an error in the run; oracle: jax.jit(donate_argnums=...)."""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P

from shell_helpers import in_a_fresh_shell, package_lines, settle, snapshot


@pytest.fixture
def donor(jx):
    jx.run_cell("ma = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))")
    return jx


def shard(ip, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic("shard", line + " --no-show", textwrap.dedent(source))
    return value, captured.stdout




def test_aliased_donations_are_refused_before_xla_sees_them():
    """XLA ends the process ("Attempt to donate the same buffer twice"), as plain jax.jit does: run in
    a fresh interpreter, so that a crash fails this test rather than ending pytest."""
    done = in_a_fresh_shell("""
        ip.run_cell("ma = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))\\n"
                    "xg = jax.device_put(jnp.arange(32.0).reshape(8, 4), jax.NamedSharding(ma, jax.P('data')))\\n"
                    "xg2 = xg\\n"
                    "tr = {'a': xg, 'b': xg}")
        cases = [("--in xg=data xg2=data --donate xg", "y = xg + xg2", ("`xg`", "`xg2`")),
                 ("--in tr=data --donate tr", "y = tr['a'] + tr['b']", ("`tr['a']`", "`tr['b']`")),
                 ("--in xg=data --donate xg", "y = xg + xg2", ("`xg`", "`xg2`")),
                 ("--in xg=data --donate xg2", "y = xg + xg2", ("`xg2`", "`xg`"))]
        for line, source, names in cases:
            try:
                ip.run_cell_magic("shard", "--mesh ma --no-show " + line, source)
            except UsageError as e:
                assert all(n in str(e) for n in names) and "jnp.copy" in str(e), str(e)
            else:
                raise AssertionError(line + ": no UsageError")
            assert not ip.user_ns["xg"].is_deleted() and "y" not in ip.user_ns
        print("refused", len(cases))
    """)
    assert done.returncode == 0 and "refused 4" in done.stdout, done.stderr[-3000:]


def test_an_array_donated_and_its_copy_read_runs_as_jax_jit(donor):
    donor.run_cell("xg = jax.device_put(jnp.arange(32.0).reshape(8, 4), jax.NamedSharding(ma, jax.P('data')))\n"
                   "xc = jnp.copy(xg)")
    shard(donor, "--mesh ma --in xg=data xc=data --donate xg", "y = xg * 2 + xc")
    mesh = donor.user_ns["ma"]
    a = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("data")))
    expected = jax.jit(lambda a, c: a * 2 + c, donate_argnums=0)(a, jnp.copy(a))
    np.testing.assert_array_equal(np.asarray(donor.user_ns["y"]), np.asarray(expected))
    assert donor.user_ns["xg"].is_deleted() and a.is_deleted()  # as jax.jit: the donated input is gone


INTERRUPTING = """
import _thread
_interrupts = []
def interrupt_once(v):
    if not _interrupts:  # Kernel -> Interrupt arrives while the program runs, once it has the inputs
        _interrupts.append(1)
        _thread.interrupt_main()
"""


@pytest.mark.parametrize("replayed", [False, True])
def test_an_interrupt_once_the_program_has_the_donated_input_binds_its_result(donor, replayed):
    """The program owns the donated buffers once called (XLA cannot stop it): the cell waits for it,
    binds its result, says so, and then raises the interrupt (a loop of cells stops there, as a loop
    of jax.jit calls does); no name is left on a deleted array."""
    donor.run_cell(INTERRUPTING)
    source = "jax.debug.callback(interrupt_once, xd)\nxd = xd * 3\n"
    line = "--mesh ma --in xd=data --donate xd"
    donor.run_cell("xd = jnp.arange(32.0).reshape(8, 4)")
    if replayed:  # a first run without the interrupt, so the second takes the replay path
        donor.user_ns["_interrupts"].append(0)
        shard(donor, line, source)
        donor.user_ns["_interrupts"].clear()
        donor.run_cell("xd = jnp.arange(32.0).reshape(8, 4)")
    with capture_output() as shown, pytest.raises(KeyboardInterrupt):
        donor.run_cell_magic("shard", line + " --no-show", source)
    assert donor.user_ns["_interrupts"] == [1]  # the interrupt did arrive during the run
    assert "Interrupted after the program was given `xd`" in shown.stdout
    np.testing.assert_array_equal(np.asarray(donor.user_ns["xd"]), np.arange(32.0).reshape(8, 4) * 3)


LOOP = """
done = 0
for i in range(40):
    {step}
    done += 1
"""
POKE_FIFTH = """
import _thread
calls = []
def poke(v):
    calls.append(1)
    if len(calls) == 5:  # Kernel -> Interrupt while the fifth cell's program runs, once it has `w`
        _thread.interrupt_main()
"""


@pytest.mark.parametrize("step", [
    "get_ipython().run_cell_magic('shard', '--mesh ma --in w=data --donate w --no-show', "
    "'jax.debug.callback(poke, w)\\nw = w + 1')",
    "jaxpar_magic.shard_cell('jax.debug.callback(poke, w)\\nw = w + 1', globals(), mesh=ma, "
    "in_specs={'w': ('data',)}, donate=['w'])",
])
def test_a_loop_of_donating_cells_stops_at_the_first_interrupt(donor, step):
    """Issue 40 item 9: the interrupt that waited for the donating program is raised once its results
    are bound, so a loop of cells stops there, as a loop of jax.jit(donate_argnums=0) calls stops (it
    ran on through 15 interrupts, each one only printed)."""
    import jaxpar_magic

    donor.push({"jaxpar_magic": jaxpar_magic, "w": jnp.zeros((8, 4))})
    donor.run_cell(POKE_FIFTH)
    with capture_output() as shown:
        result = donor.run_cell(LOOP.format(step=step))
    assert isinstance(result.error_in_exec, KeyboardInterrupt), result.error_in_exec
    ns = donor.user_ns
    assert (ns["done"], len(ns["calls"])) == (4, 5)  # stopped in the fifth step, after binding its result
    assert "Interrupted after the program was given `w`" in shown.stdout
    assert not ns["w"].is_deleted()
    np.testing.assert_array_equal(np.asarray(ns["w"]), np.full((8, 4), 5.0))


DONATING = {  # how the cell is run: its --no-show replay, its full path with views, the twin
    "replay": lambda ip: ip.run_cell_magic("shard", "--mesh ma --in w=data --donate w --no-show", "w = w + 1\nv = w * 2"),
    "shown": lambda ip: ip.run_cell_magic("shard", "--mesh ma --in w=data --donate w", "w = w + 1\nv = w * 2"),
    "twin": lambda ip: __import__("jaxpar_magic").shard_cell("w = w + 1\nv = w * 2", ip.user_ns, mesh=ip.user_ns["ma"],
                                                             in_specs={"w": ("data",)}, donate=["w"]),
}


@pytest.mark.parametrize("how", list(DONATING))
def test_an_interrupt_at_every_line_of_a_donating_cell_leaves_no_name_on_a_deleted_array(donor, how):
    """Issue 40 item 10: Kernel -> Interrupt (`_thread.interrupt_main()`, as a signal arrives) at each
    successive line our code executes in a donating cell. After each: either the namespace is exactly
    as it was with `w` whole, or the cell's results are bound (`w` new, `v` with it), raised or not;
    never a name on a deleted array (it was, between the program's run and the binding, and when
    putting SIGINT's handler back raised)."""
    import _thread
    import signal
    import sys

    run = DONATING[how]
    sharding = NamedSharding(donor.user_ns["ma"], P("data"))
    start = np.arange(32.0).reshape(8, 4)

    def fresh():  # laid out as --in lays it out: the donated buffers are `w`'s own
        donor.user_ns.update(w=jax.device_put(start, sharding), v=None)

    for _ in range(2):  # compiled, and (--no-show) the replay remembered
        fresh()
        with capture_output():
            run(donor)
    counted = []
    fresh()
    sys.settrace(package_lines(lambda: counted.append(1)))
    try:
        with capture_output():
            run(donor)
    finally:
        sys.settrace(None)
    seen = {"unchanged": 0, "bound, then raised": 0, "not reached": 0}
    handler = signal.getsignal(signal.SIGINT)
    for k in range(1, len(counted) + 1):
        fresh()  # run once more, as counted: an interrupt forgets the replay, and before the call the program
        with capture_output():
            run(donor)
        fresh()
        before = snapshot(donor.user_ns)
        lines = []

        def at_line():
            lines.append(1)
            if len(lines) == k:
                _thread.interrupt_main()

        raised = False
        try:
            try:
                sys.settrace(package_lines(at_line))
                with capture_output():
                    run(donor)
            finally:
                sys.settrace(None)
            settle()
        except KeyboardInterrupt:
            raised = True
        ns = donor.user_ns
        where = f"interrupted at line {k} of {len(counted)} ({how})"
        assert signal.getsignal(signal.SIGINT) is handler, f"{where}: SIGINT's handler was left changed"
        deleted = [n for n, value in ns.items() if isinstance(value, jax.Array) and value.is_deleted()]
        assert not deleted, f"{where}: {deleted} bound to deleted arrays"
        if snapshot(ns) == before:
            assert raised, f"{where}: the cell bound nothing and raised nothing"
            np.testing.assert_array_equal(np.asarray(ns["w"]), start, err_msg=where)
            seen["unchanged"] += 1
            continue
        np.testing.assert_array_equal(np.asarray(ns["w"]), start + 1, err_msg=where)
        np.testing.assert_array_equal(np.asarray(ns["v"]), (start + 1) * 2, err_msg=where)
        if len(lines) < k:  # this run took a few lines fewer than the counted one: never interrupted
            seen["not reached"] += 1
            continue
        assert raised, f"{where}: the interrupt was swallowed (the cell ran to its end and raised nothing)"
        seen["bound, then raised"] += 1
    # Both sides of the program's call were reached, and nearly every line
    assert seen["unchanged"] and seen["bound, then raised"] and seen["not reached"] < len(counted) // 10, seen


def _interrupt_in_shard_list(k: int, hits: list):
    """A sys.settrace function that presses Kernel -> Interrupt as JAX, building an array's list of
    per-device buffers on its first read (`addressable_shards`), calls back for the k-th device;
    `hits` gets the reads it interrupted."""
    import _thread

    calls = []

    def trace(frame, event, arg):
        if frame.f_code.co_name == "make_single_device_sharding" and frame.f_back is not None \
                and frame.f_back.f_code.co_name == "addressable_shards":
            calls.append(1)
            if len(calls) == k:
                hits.append(k)
                _thread.interrupt_main()
        return None

    return trace


def test_plain_jax_loses_an_arrays_buffers_to_an_interrupt_while_listing_them(donor):
    """The oracle for the test below, in plain JAX (0.10.2): an interrupt while JAX builds an array's
    list of shards leaves that list cut short for good; the array is not deleted, and cannot be read.
    If this fails, JAX builds the list whole now, and cell/interrupts.py's hold is no longer needed."""
    import sys

    w = jax.device_put(np.arange(32.0).reshape(8, 4), NamedSharding(donor.user_ns["ma"], P("data")))
    hits = []
    sys.settrace(_interrupt_in_shard_list(3, hits))
    try:
        with pytest.raises(KeyboardInterrupt):
            w.addressable_shards
            settle()
    finally:
        sys.settrace(None)
    assert hits == [3] and not w.is_deleted()
    with pytest.raises(IndexError):
        np.asarray(w)


@pytest.mark.parametrize("read", ["addressable_shards", "host_value"])
def test_our_reads_of_an_arrays_shards_hold_the_interrupt_until_the_list_is_built(donor, read):
    """cell/interrupts' reads of a user's array (the exercises' checks and snapshots, `check`, a
    cluster's push, scatter and gather): the interrupt that came while JAX built the array's list of
    buffers is raised once the list is whole, and the array stays readable."""
    import sys

    from jaxpar_magic.cell import interrupts

    reading = getattr(interrupts, read)
    sharding = NamedSharding(donor.user_ns["ma"], P("data"))
    for k in (1, 5, 8):
        w = jax.device_put(np.arange(32.0).reshape(8, 4), sharding)
        hits = []
        sys.settrace(_interrupt_in_shard_list(k, hits))
        try:
            with pytest.raises(KeyboardInterrupt):
                reading(w)
                settle()
        finally:
            sys.settrace(None)
        assert hits == [k] and len(w.addressable_shards) == 8
        np.testing.assert_array_equal(np.asarray(w), np.arange(32.0).reshape(8, 4))


@pytest.mark.parametrize("how", list(DONATING))
def test_an_interrupt_while_the_donation_check_lists_shards_leaves_w_readable(donor, how):
    """CI, 2026-12-06: a loop of `%%shard --donate w` cells, interrupted, left `w` unreadable
    (IndexError) though not deleted: the interrupt landed while the donation check read a fresh result's
    shards, a list JAX builds on the first read (the test above). The check now reads them with the
    interrupt held: at each device of that list, the cell either binds nothing or runs whole, and `w`
    reads as the start or the step after."""
    import sys

    sharding = NamedSharding(donor.user_ns["ma"], P("data"))
    start = np.arange(32.0).reshape(8, 4)
    for _ in range(2):  # compiled, and (--no-show) the replay remembered
        donor.user_ns.update(w=jax.device_put(start, sharding), v=None)
        with capture_output():
            DONATING[how](donor)
    interrupted = []
    for k in range(1, 9):
        donor.user_ns.update(w=jax.device_put(start, sharding), v=None)  # a fresh array: its list not built yet
        sys.settrace(_interrupt_in_shard_list(k, interrupted))
        try:
            with capture_output(), pytest.raises(KeyboardInterrupt):
                DONATING[how](donor)
                settle()
        finally:
            sys.settrace(None)
        w = donor.user_ns["w"]
        assert not w.is_deleted(), k
        assert np.asarray(w).tolist() in (start.tolist(), (start + 1).tolist()), k
    assert interrupted == list(range(1, 9)), interrupted  # each device's turn was interrupted


def test_an_interrupt_while_compiling_leaves_the_donated_input_whole(donor, monkeypatch):
    from jaxpar_magic.stages.run import program

    def interrupting():
        raise KeyboardInterrupt

    donor.run_cell("xk = jnp.arange(32.0).reshape(8, 4)")
    before = snapshot(donor.user_ns)
    monkeypatch.setattr(program, "compile_progress", interrupting)
    with pytest.raises(KeyboardInterrupt):
        shard(donor, "--mesh ma --in xk=data --donate xk", "yk = xk * 5")
    assert snapshot(donor.user_ns) == before and not donor.user_ns["xk"].is_deleted()


def test_an_error_in_a_donating_run_is_reported_first():
    """The cell's own error (a callback raising), not "`xr` was deleted" blaming the read: the
    program took `xr` before it failed, as under jax.jit. In a fresh interpreter: the failed
    callback stays in JAX's effect tokens for the rest of the process."""
    done = in_a_fresh_shell("""
        ip.run_cell("ma = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))\\n"
                    "xr = jnp.arange(8.0)\\n"
                    "def boom(v):\\n    raise ValueError('boom')")
        try:
            ip.run_cell_magic("shard", "--mesh ma --in xr=data --donate xr --no-show",
                              "jax.debug.callback(boom, xr)\\nxr = xr * 2")
        except UsageError as e:
            raise AssertionError("our UsageError hid the error: " + str(e))
        except Exception as e:
            assert "boom" in str(e), str(e)
            assert any("--donate: `xr` went to the program" in n for n in e.__notes__), e.__notes__
            print("reported", type(e).__name__)
    """)
    assert "reported JaxRuntimeError" in done.stdout, done.stderr[-3000:]


def test_a_donated_input_deleted_before_the_run_is_named(donor):
    donor.run_cell("xe = jnp.arange(8.0)\nxe.delete()")
    with pytest.raises(UsageError, match="`xe` was deleted"):
        shard(donor, "--mesh ma --in xe=data --donate xe", "ye = xe * 2")


# --- NNX objects donated (issue 33, item 3); oracle: nnx.jit(donate_argnums=...) -----------------------

def placed(ip, value):
    """`value` laid out as --in xm=data lays it out, so that both programs see the same layout."""
    return jax.device_put(value, NamedSharding(ip.user_ns["ma"], P("data")))


def _models():
    from flax import nnx

    return nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 4, rngs=nnx.Rngs(0))


def test_a_donated_model_the_cell_only_reads_stays_usable_as_under_nnx_jit(donor):
    from flax import nnx

    ours, theirs = _models()
    xm = placed(donor, jnp.arange(32.0).reshape(8, 4))
    donor.push({"model": ours, "xm": xm})
    shard(donor, "--mesh ma --in xm=data --donate model", "ym = model(xm)")
    expected = nnx.jit(lambda m, v: m(v), donate_argnums=0)(theirs, xm)
    np.testing.assert_array_equal(np.asarray(donor.user_ns["ym"]), np.asarray(expected))
    assert donor.user_ns["model"] is ours  # the user's very object, with its state written back
    assert not ours.bias.get_value().is_deleted() and not theirs.bias.get_value().is_deleted()
    np.testing.assert_array_equal(np.asarray(ours(xm)), np.asarray(theirs(xm)))  # usable, as nnx.jit leaves it


def test_a_donated_train_step_is_bit_for_bit_nnx_jit(donor):
    import optax
    from flax import nnx

    ours, theirs = _models()
    opt_ours = nnx.Optimizer(ours, optax.sgd(0.1), wrt=nnx.Param)
    opt_theirs = nnx.Optimizer(theirs, optax.sgd(0.1), wrt=nnx.Param)
    xm = placed(donor, jnp.arange(32.0).reshape(8, 4) / 32)
    donor.push({"model": ours, "opt": opt_ours, "xm": xm})
    step = "loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(xm) ** 2))(model)\nopt.update(model, grads)"
    donor.push({"nnx": nnx})

    @nnx.jit(donate_argnums=(0, 1))
    def train(model, opt, v):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(v) ** 2))(model)
        opt.update(model, grads)
        return loss

    for _ in range(2):
        shard(donor, "--mesh ma --in xm=data --donate model opt --out loss", step)
        expected = train(theirs, opt_theirs, xm)
        assert np.asarray(donor.user_ns["loss"]).tobytes() == np.asarray(expected).tobytes()
    for ours_leaf, their_leaf in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(theirs))):
        assert np.asarray(ours_leaf).tobytes() == np.asarray(their_leaf).tobytes()
