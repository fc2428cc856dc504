"""A check's re-run of an exercise cell leaves no trace (issue 40, items 2 to 4).

`attempt(NAME).follows(...)` runs the exercise cell again on other inputs. The exercise cell's own
run keeps its effects (a log line appended, a counter moved, a line written to a file, a training
step taken, an input donated), and the check's re-run adds none: the log, the counter and the file
are as the exercise cell left them, an NNX model and its optimizer have taken one step
(`opt.step == 1`, the parameters `nnx.jit`'s one step gives), and a donated input is never deleted by
the check. A cell whose effects a re-run could not undo (it runs a process) is not run again, and
the check's line says why.
"""
from __future__ import annotations

import numpy as np
import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.face import checks, exercises
from shell_helpers import assert_same_nnx_state

optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")


@pytest.fixture
def ex(jx, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the notebook's folder
    exercises.forget_all()
    checks._failures.clear()
    jx.run_cell("from jaxpar_magic import attempt, check\nreadings = jnp.arange(8.0)")
    yield jx
    exercises.forget_all()
    checks._failures.clear()


def run(shell, source: str) -> list[str]:
    with capture_output() as shown:
        result = shell.run_cell(source)
    assert result.success, shown.stdout + shown.stderr
    return [line for line in shown.stdout.splitlines() if line.startswith(("✓", "✗"))]


def test_the_reruns_log_counter_and_file_line_are_undone(ex, tmp_path):
    ex.run_cell("log = []\nclass Stats:\n    pass\nstats = Stats()\nstats.runs = 0\ncounts = {'runs': 0}")
    run(ex, "%%exercise doubled\nlog.append(float(readings[1]))\nstats.runs += 1\ncounts['runs'] += 1\n"
            "with open('log.txt', 'a') as f:\n    f.write('a line\\n')\ndoubled = readings * 2")
    said = run(ex, "run = attempt('doubled')\ncheck(run['doubled'], readings * 2, "
                   "method=[run.follows(readings * 0 + 10, readings=readings * 0 + 5)], hint='h')")
    assert said == ["✓ right"]
    ns = ex.user_ns
    assert ns["log"] == [1.0] and ns["stats"].runs == 1 and ns["counts"] == {"runs": 1}
    assert (tmp_path / "log.txt").read_text() == "a line\n"
    assert [p.name for p in tmp_path.iterdir()] == ["log.txt"]
    assert np.array_equal(ns["readings"], np.arange(8.0))


def test_a_training_cell_rerun_by_its_check_steps_the_model_once(ex):
    """The exercise cell takes one step of an NNX model with its optimizer (`%%shard` writes the new
    state back); the check runs it again on the same batch. After the check: one step, the state
    `nnx.jit`'s one step gives a twin."""
    import jax
    import jax.numpy as jnp

    def built():
        model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        mesh = jax.make_mesh((8,), ("data",))
        nnx.update(model, jax.device_put(nnx.state(model), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    model, opt = built()
    twin, twin_opt = built()
    x = jnp.arange(32.0).reshape(8, 4) / 32
    y = jnp.sin(x)
    ex.push({"model": model, "opt": opt, "x": x, "y": y, "loss_fn": loss_fn, "nnx": nnx})
    run(ex, "%%exercise step_loss\n%%shard --mesh data=8 --in x=data y=data --out step_loss --no-show\n"
            "step_loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)\nopt.update(model, grads)")
    assert int(opt.step[...]) == 1
    said = run(ex, "run = attempt('step_loss')\ncheck(run['step_loss'], run['step_loss'], "
                   "method=[run.follows(loss_fn(model, x, y), x=x, y=y)], hint='h')")
    assert said == ["✓ right"]

    @nnx.jit
    def step(model, opt, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        opt.update(model, grads)

    step(twin, twin_opt, ex.user_ns["x"], ex.user_ns["y"])  # as --in laid them out: the same sums
    assert int(opt.step[...]) == 1 and ex.user_ns["model"] is model
    assert_same_nnx_state(model, twin)
    assert_same_nnx_state(opt, twin_opt)


def test_a_donated_input_is_never_deleted_by_the_check(ex):
    import jax.numpy as jnp

    ex.run_cell("xx = jnp.arange(32.0).reshape(8, 4)\nw = jnp.ones((8, 4))")
    run(ex, "%%exercise w_new\n%%shard --mesh data=8 --in w=data xx=data --donate w --out w_new --no-show\n"
            "w_new = w - 0.1 * xx")
    assert ex.user_ns["w"].is_deleted()  # the exercise cell's own donation
    ex.run_cell("w = jnp.ones((8, 4))")  # the student's next weights
    kept = ex.user_ns["w"]
    said = run(ex, "run = attempt('w_new')\ncheck(run['w_new'], 1 - 0.1 * xx, "
                   "method=[run.follows(1 - 0.2 * xx, xx=xx * 2)], hint='h')")
    assert said == ["✓ right"]
    assert ex.user_ns["w"] is kept and not kept.is_deleted()
    assert np.array_equal(np.asarray(kept), np.ones((8, 4)))


def test_a_cell_with_effects_a_rerun_cannot_undo_is_not_run_again(ex, tmp_path):
    run(ex, "%%exercise doubled\nimport subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'open(\"ran.txt\", \"a\").write(\"x\")'], check=True)\n"
            "doubled = readings * 2")
    assert (tmp_path / "ran.txt").read_text() == "x"
    said = run(ex, "run = attempt('doubled')\ncheck(run['doubled'], readings * 2, "
                   "method=[run.follows(readings * 0 + 10, readings=readings * 0 + 5)], hint='h')")
    assert said[0].startswith("✗ not yet: this check runs the exercise cell again, and the cell runs "
                              "`subprocess.run`, which a re-run could not undo"), said
    assert (tmp_path / "ran.txt").read_text() == "x"


@pytest.mark.parametrize("given", ["w=w2", "dict"])
def test_a_donating_rerun_never_deletes_the_checks_inputs_or_a_donated_trees_leaves(ex, given):
    """Issue 40 (found by tests/test_differential_paths.py): the check's input `w=w2`, an array of the
    student's already laid out as `--in w=data` lays it out, was given to the re-run itself and donated
    (deleted); and `--donate p` of a dict of arrays ran on the student's own leaves (only a bare array
    ran as a copy). Both stay alive, their values as they were."""
    import jax
    import jax.numpy as jnp

    ex.run_cell("mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))\n"
                "xx = jnp.arange(32.0).reshape(8, 4)\n"
                "w2 = jax.device_put(jnp.ones((8, 4)) * 3, jax.NamedSharding(mesh, jax.P('data')))")
    if given == "w=w2":
        ex.run_cell("w = jnp.ones((8, 4))")
        run(ex, "%%exercise w_new\n%%shard --mesh mesh --in w=data xx=data --donate w --out w_new --no-show\n"
                "w_new = w - 0.1 * xx")
        follows, kept = "run.follows(w2 - 0.2 * xx, w=w2, xx=xx * 2)", lambda: [ex.user_ns["w2"]]
    else:
        ex.run_cell("p = {'w': jnp.ones((8, 4))}")
        run(ex, "%%exercise w_new\n%%shard --mesh mesh --in p=data xx=data --donate p --out w_new --no-show\n"
                "w_new = p['w'] - 0.1 * xx")
        ex.run_cell("p = {'w': w2}")  # the student's next weights: laid out as the cell lays them out
        follows, kept = "run.follows(w2 - 0.2 * xx, xx=xx * 2)", lambda: [ex.user_ns["p"]["w"], ex.user_ns["w2"]]
    said = run(ex, f"run = attempt('w_new')\ncheck(run['w_new'], 1 - 0.1 * xx, method=[{follows}], hint='h')")
    assert said == ["✓ right"]
    for array in kept():
        assert not array.is_deleted()
        assert np.array_equal(np.asarray(array), np.full((8, 4), 3.0))
