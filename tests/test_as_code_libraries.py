"""`--as-code` for cells that read a Flax NNX object or an Equinox module: the snippet the library
itself would write (`nnx.jit`, `nnx.split`/`nnx.merge` around `jax.jit(jax.shard_map(...))`;
`eqx.filter_jit`, `eqx.partition`/`eqx.combine`), round-tripped like the other snippets: the snippet,
run alone on copies of the inputs, gives the values the magic gives (and, for a training step, the
same updated model and optimizer state).
"""
from __future__ import annotations

import ast
import copy
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax import lax


def printed(ip, magic: str, line: str, source: str) -> str:
    with capture_output() as captured:
        ip.run_cell_magic(magic, f"{line} --as-code", textwrap.dedent(source))
    return captured.stdout


def execute(code: str, inputs: dict) -> dict:
    namespace = dict(inputs)
    exec(compile(ast.parse(code), "<as-code snippet>", "exec"), namespace)
    return namespace


def run_magic(ip, magic: str, line: str, source: str) -> None:
    with capture_output():
        ip.run_cell_magic(magic, f"{line} --no-show", textwrap.dedent(source))


def same_tree(ours, theirs):
    left = jax.tree.leaves(eqx.filter(ours, eqx.is_array))
    right = jax.tree.leaves(eqx.filter(theirs, eqx.is_array))
    assert len(left) == len(right) and left
    for a, b in zip(left, right):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.fixture
def libs(jx):
    with capture_output():
        jx.run_line_magic("mesh", "d=8 --no-show")
    jx.push({"nnx": nnx, "eqx": eqx, "optax": optax})
    return jx


def nnx_state(rngs_seed: int = 0):
    model = nnx.Linear(4, 2, rngs=nnx.Rngs(rngs_seed))
    return model, nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)


TRAIN = """\
def loss_fn(m, x):
    return jnp.mean(m(x) ** 2)
"""

STEP = """\
loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
optimizer.update(model, grads)
"""


def test_nnx_training_step_under_shard_is_nnx_jit(libs):
    libs.run_cell(TRAIN)
    model, optimizer = nnx_state()
    batch = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    libs.push({"model": model, "optimizer": optimizer, "batch": batch})
    theirs_model, theirs_optimizer = nnx.clone(model), None
    code = printed(libs, "shard", "--in batch=d --out loss", STEP)
    assert "@nnx.jit" in code and "from flax import nnx" in code
    theirs_model, theirs_optimizer = nnx.clone((model, optimizer))
    snippet = execute(code, {"model": theirs_model, "optimizer": theirs_optimizer, "batch": batch,
                             "loss_fn": libs.user_ns["loss_fn"], "nnx": nnx, "jnp": jnp})
    run_magic(libs, "shard", "--in batch=d --out loss", STEP)
    np.testing.assert_allclose(float(snippet["loss"]), float(libs.user_ns["loss"]), rtol=1e-6)
    same_tree(nnx.state(theirs_model), nnx.state(model))  # the same update, written into the objects
    same_tree(nnx.state(theirs_optimizer), nnx.state(optimizer))
    assert "grads" not in snippet and "grads" not in libs.user_ns


def test_nnx_forward_pass_under_shard_map_splits_and_merges(libs):
    model, _ = nnx_state()
    batch = jnp.arange(32.0).reshape(8, 4)
    libs.push({"model": model, "batch": batch})
    code = printed(libs, "shard_map", "--in batch=d --out y=d", "y = model(batch)")
    assert "nnx.split(model)" in code and "nnx.merge(" in code
    snippet = execute(code, {"model": model, "batch": batch, "nnx": nnx})
    run_magic(libs, "shard_map", "--in batch=d --out y=d", "y = model(batch)")
    np.testing.assert_allclose(snippet["y"], libs.user_ns["y"], rtol=1e-6)


def test_nnx_forward_pass_under_pmap(libs):
    model, _ = nnx_state()
    batch = jnp.arange(32.0).reshape(8, 4)
    libs.push({"model": model, "batch": batch})
    code = printed(libs, "pmap", "--broadcast model", "y = model(batch)")
    snippet = execute(code, {"model": model, "batch": batch, "nnx": nnx})
    run_magic(libs, "pmap", "--broadcast model", "y = model(batch)")
    np.testing.assert_allclose(snippet["y"], libs.user_ns["y"], rtol=1e-6)


@pytest.fixture
def mlp():
    return eqx.nn.MLP(4, 2, 8, 2, key=jax.random.PRNGKey(0))


def test_equinox_forward_pass_under_shard_is_filter_jit(libs, mlp):
    batch = jnp.arange(32.0).reshape(8, 4)
    libs.push({"model": mlp, "batch": batch})
    code = printed(libs, "shard", "--in batch=d model=None", "y = jax.vmap(model)(batch)")
    assert "@eqx.filter_jit" in code and "eqx.filter_shard(model" in code
    snippet = execute(code, {"model": mlp, "batch": batch, "jax": jax})
    run_magic(libs, "shard", "--in batch=d model=None", "y = jax.vmap(model)(batch)")
    np.testing.assert_allclose(snippet["y"], libs.user_ns["y"], rtol=1e-6)
    same_tree(snippet["model"], libs.user_ns["model"])  # placed, and rebound as %%shard rebinds it


EQX_STEP = """\
loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(jax.vmap(m)(batch) ** 2))(model)
updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
model = eqx.apply_updates(model, updates)
"""


def test_equinox_training_step_donated_under_shard(libs, mlp):
    opt = optax.adam(0.01)
    opt_state = opt.init(eqx.filter(mlp, eqx.is_array))
    batch = jax.random.normal(jax.random.PRNGKey(2), (8, 4))
    libs.push({"model": mlp, "opt": opt, "opt_state": opt_state, "batch": batch})
    line = "--in batch=d --donate model opt_state batch --out loss model opt_state"
    code = printed(libs, "shard", line, EQX_STEP)
    assert '@eqx.filter_jit(donate="all")' in code
    inputs = {"model": copy.deepcopy(mlp), "opt": opt, "opt_state": jax.tree.map(jnp.copy, opt_state),
              "batch": jnp.copy(batch), "eqx": eqx, "jax": jax, "jnp": jnp}
    snippet = execute(code, inputs)
    run_magic(libs, "shard", line, EQX_STEP)
    np.testing.assert_allclose(float(snippet["loss"]), float(libs.user_ns["loss"]), rtol=1e-6)
    same_tree(snippet["model"], libs.user_ns["model"])
    same_tree(snippet["opt_state"], libs.user_ns["opt_state"])


def test_equinox_forward_pass_under_shard_map_and_pmap(libs, mlp):
    batch = jnp.arange(32.0).reshape(8, 4)
    libs.push({"model": mlp, "batch": batch})
    for magic, line, source in (("shard_map", "--in batch=d --out y=d", "y = jax.vmap(model)(batch)"),
                                ("pmap", "--broadcast model", "y = model(batch)")):
        code = printed(libs, magic, line, source)
        assert "eqx.partition(model, eqx.is_array)" in code and "eqx.combine(" in code
        snippet = execute(code, {"model": mlp, "batch": batch, "jax": jax})
        run_magic(libs, magic, line, source)
        np.testing.assert_allclose(snippet["y"], libs.user_ns["y"], rtol=1e-6)


def test_a_module_returned_from_shard_map_is_said(libs, mlp):
    libs.push({"model": mlp, "batch": jnp.ones((8, 4))})
    with pytest.raises(UsageError, match="returns 'same'.*leaves that are not arrays"):
        printed(libs, "shard_map", "--in batch=d --out y=d same", "y = batch * 2\nsame = model")


def test_eqx_filter_jit_donates_all_or_none(libs, mlp):
    libs.push({"model": mlp, "batch": jnp.ones((8, 4))})
    with pytest.raises(UsageError, match="donates every argument or none"):
        printed(libs, "shard", "--donate batch", "y = jax.vmap(model)(batch)")
