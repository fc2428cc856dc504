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

from shell_helpers import in_a_fresh_shell, snapshot


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
    binds its result and says so; no name is left on a deleted array."""
    donor.run_cell(INTERRUPTING)
    source = "jax.debug.callback(interrupt_once, xd)\nxd = xd * 3\n"
    line = "--mesh ma --in xd=data --donate xd"
    donor.run_cell("xd = jnp.arange(32.0).reshape(8, 4)")
    if replayed:  # a first run without the interrupt, so the second takes the replay path
        donor.user_ns["_interrupts"].append(0)
        shard(donor, line, source)
        donor.user_ns["_interrupts"].clear()
        donor.run_cell("xd = jnp.arange(32.0).reshape(8, 4)")
    _, printed = shard(donor, line, source)
    assert donor.user_ns["_interrupts"] == [1]  # the interrupt did arrive during the run
    assert "Interrupted after the program was given `xd`" in printed
    np.testing.assert_array_equal(np.asarray(donor.user_ns["xd"]), np.arange(32.0).reshape(8, 4) * 3)


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
