"""The patterns of JAX's, Flax's and Equinox's own parallelism tutorials, written in our own code,
each run through the magics and through plain JAX in the same shell, values compared:

- a global `jax.set_mesh` (the shard_map notebook's style) under which every magic runs its cell;
- Explicit meshes from `jax.make_mesh`, with `jax.reshard`, `out_sharding=` and `jax.typeof`;
- an NNX model sharded with `nnx.with_partitioning`, trained with `nnx.Optimizer`;
- an Equinox model, its optimizer state and the batch, donated and sharded;
- shard_map's data-, tensor- and FSDP-parallel networks.
"""
from __future__ import annotations

import copy
import textwrap
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


def run(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, captured


def close(ours, theirs, rtol=1e-5, atol=1e-6):
    left, right = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(left) == len(right) and left
    for a, b in zip(left, right):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


@pytest.fixture
def tutorial(jx):
    """A shell as the tutorials start one, with their imports; any global mesh is unset at the end."""
    jx.push({"P": P, "NamedSharding": NamedSharding, "AxisType": AxisType, "nnx": nnx, "eqx": eqx,
             "optax": optax, "partial": partial})
    yield jx
    jax.set_mesh(None)


# --- a global mesh ----------------------------------------------------------------------------------

def test_a_global_mesh_and_every_magic(tutorial):
    """The shard_map notebook sets its mesh globally; then %%shard_map (no --mesh: the global one),
    %%shard, %%pmap, %sharding, --plan and --as-code all work, with plain JAX's values."""
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    jax.set_mesh(mesh)
    a = jax.device_put(jnp.arange(8 * 16.0).reshape(8, 16), P("x", "y"))
    b = jax.device_put(jnp.arange(16 * 4.0).reshape(16, 4), P("y", None))
    tutorial.push({"a": a, "b": b})

    @jax.jit
    @partial(jax.shard_map, in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", None))
    def matmul_basic(a_block, b_block):
        return lax.psum(jnp.dot(a_block, b_block), "y")

    run(tutorial, "shard_map", "--in a=x,y b=y,None --out c=x,None",
        "c_partial = jnp.dot(a, b)\nc = lax.psum(c_partial, 'y')")
    close(tutorial.user_ns["c"], matmul_basic(a, b))
    assert "c_partial" not in tutorial.user_ns  # a per-device temporary, as in the tutorial's body
    assert jax.typeof(tutorial.user_ns["c"]) == jax.typeof(matmul_basic(a, b))

    run(tutorial, "shard", "--no-show", "d = jnp.sin(a) * 2")
    close(tutorial.user_ns["d"], jnp.sin(a) * 2)
    run(tutorial, "pmap", "-a i --no-show", "s = lax.psum(a, 'i')")  # its own mesh; a is laid out again
    close(tutorial.user_ns["s"], np.broadcast_to(np.asarray(a).sum(0), (8, 16)))
    with capture_output():
        tutorial.run_line_magic("sharding", "a c")
    run(tutorial, "shard", "--plan --no-show", "e = jnp.matmul(a, b, out_sharding=P('x', None))")
    assert tutorial.user_ns["e"].shape == (8, 4)
    _, printed = run(tutorial, "shard_map", "--in a=x,y b=y,None --out c=x,None --as-code",
                     "c = lax.psum(jnp.dot(a, b), 'y')")
    scope = {"a": a, "b": b, "jnp": jnp, "lax": lax}
    exec(printed.stdout, scope)
    close(scope["c"], matmul_basic(a, b))
    assert jax.sharding.get_mesh() == mesh  # left as it was


# --- Explicit axes ------------------------------------------------------------------------------------

EXPLICIT = """\
print_type = jax.typeof(x)
y = jax.reshard(x, P(None, 'Y'))
z = jnp.matmul(x, w, out_sharding=P('X', None))
s = jnp.sum(x, axis=0)
"""


def explicit_plain(x, w):
    return (jax.reshard(x, P(None, "Y")), jnp.matmul(x, w, out_sharding=P("X", None)), jnp.sum(x, axis=0))


@pytest.mark.parametrize("how", ["global", "%mesh"])
def test_explicit_axes_with_reshard_out_sharding_and_typeof(tutorial, how):
    """The distributed-arrays tutorial's explicit mode: shardings in the types, reshard, out_sharding."""
    mesh = jax.make_mesh((4, 2), ("X", "Y"))
    if how == "global":
        jax.set_mesh(mesh)
        line = "--no-show"
    else:
        with capture_output():
            tutorial.run_line_magic("mesh", "X=4 Y=2 --no-show")
        assert tutorial.user_ns["mesh"] == mesh  # %mesh is jax.make_mesh: Explicit axes
        line = "--mesh mesh --no-show"
    x = jax.device_put(jnp.arange(8 * 4.0).reshape(8, 4), NamedSharding(mesh, P("X", "Y")))
    w = jax.device_put(jnp.arange(4 * 6.0).reshape(4, 6), NamedSharding(mesh, P("Y", None)))
    tutorial.push({"x": x, "w": w})
    run(tutorial, "shard", line, EXPLICIT)
    with jax.set_mesh(mesh):
        expected = jax.jit(explicit_plain)(x, w)
    ours = [tutorial.user_ns[n] for n in ("y", "z", "s")]
    close(ours, expected)
    for mine, theirs in zip(ours, expected):
        assert jax.typeof(mine) == jax.typeof(theirs)  # f32[8,4@Y], f32[8@X,6], ...
    assert str(tutorial.user_ns["print_type"]) == "float32[8@X,4@Y]"


def test_an_explicit_ambiguity_is_said_with_the_fix(tutorial):
    from IPython.core.error import UsageError

    with capture_output():
        tutorial.run_line_magic("mesh", "X=4 Y=2 --no-show")
    mesh = tutorial.user_ns["mesh"]
    tutorial.push({"x": jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("X", "Y"))),
                   "w": jax.device_put(jnp.ones((4, 6)), NamedSharding(mesh, P("Y", None)))})
    with pytest.raises(UsageError, match="out_sharding=P"):
        run(tutorial, "shard", "--no-show", "z = x @ w")


# --- Flax NNX: nnx.with_partitioning, nnx.Optimizer ---------------------------------------------------

class MLP(nnx.Module):
    def __init__(self, din, dmid, dout, rngs):
        init = nnx.initializers.lecun_normal()
        self.w1 = nnx.Param(nnx.with_partitioning(init, (None, "model"))(rngs.params(), (din, dmid)))
        self.b1 = nnx.Param(nnx.with_partitioning(nnx.initializers.zeros_init(), ("model",))(rngs.params(), (dmid,)))
        self.w2 = nnx.Param(nnx.with_partitioning(init, ("model", None))(rngs.params(), (dmid, dout)))

    def __call__(self, x):
        return nnx.relu(x @ self.w1 + self.b1) @ self.w2


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_an_nnx_model_sharded_with_with_partitioning_trained_with_nnx_optimizer(tutorial):
    """Flax's multi-device guide: an Auto mesh set while the annotated model is made (its variables
    are sharded eagerly), nnx.Optimizer, a train step. %%shard returns only the loss; model and
    optimizer are updated in place, as nnx.jit updates them."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    with jax.set_mesh(mesh):  # the optimizer's state takes the parameters' annotations: made under the mesh too
        model = MLP(8, 32, 4, rngs=nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        theirs_model, theirs_optimizer = nnx.clone((model, optimizer))
    assert model.w1[...].sharding.spec == P(None, "model")
    x = jax.device_put(jax.random.normal(jax.random.PRNGKey(1), (16, 8)), NamedSharding(mesh, P("data", None)))
    y = jax.device_put(jax.random.normal(jax.random.PRNGKey(2), (16, 4)), NamedSharding(mesh, P("data", None)))

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(mse)(model, x, y)
        optimizer.update(model, grads)
        return loss

    tutorial.push({"model": model, "optimizer": optimizer, "x": x, "y": y, "mse": mse, "mesh": mesh})
    for _ in range(3):
        run(tutorial, "shard", "--mesh mesh --out loss --no-show", """\
            loss, grads = nnx.value_and_grad(mse)(model, x, y)
            optimizer.update(model, grads)
        """)
        with jax.set_mesh(mesh):
            expected = train_step(theirs_model, theirs_optimizer, x, y)
        np.testing.assert_allclose(float(tutorial.user_ns["loss"]), float(expected), rtol=1e-6)
    assert "grads" not in tutorial.user_ns
    close(nnx.state(model), nnx.state(theirs_model))
    close(nnx.state(optimizer), nnx.state(theirs_optimizer))
    assert model.w1[...].sharding.spec == P(None, "model")  # still laid out as annotated


# --- Equinox: model, optimizer state and batch donated and sharded -----------------------------------

def test_an_equinox_model_optimizer_and_batch_donated_and_sharded(tutorial):
    """Equinox's parallelism example: the batch split over the devices, the model and optimizer
    state replicated, all of them donated, eqx.filter_jit's values. Its mesh has Auto axes (the
    example's plain `Mesh`): eqx.filter_shard constrains, which Explicit axes refuse."""
    with capture_output():
        tutorial.run_line_magic("mesh", "batch=8 --axis-types auto --no-show")
    mesh = tutorial.user_ns["mesh"]
    model = eqx.nn.MLP(4, 2, 16, 2, key=jax.random.PRNGKey(0))
    optim = optax.adam(1e-2)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 4))
    y = jax.random.normal(jax.random.PRNGKey(2), (32, 2))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("batch"))

    @eqx.filter_jit(donate="all")
    def train_step(model, opt_state, x, y):
        x, y = eqx.filter_shard((x, y), split)
        loss, grads = eqx.filter_value_and_grad(
            lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        model, opt_state = eqx.filter_shard((model, opt_state), replicated)
        return loss, model, opt_state

    theirs = (eqx.filter_shard(copy.deepcopy(model), replicated), eqx.filter_shard(opt_state, replicated))
    tutorial.push({"model": model, "opt_state": opt_state, "optim": optim, "mesh": mesh})
    for step in range(3):
        xs, ys = x + step, y - step
        tutorial.push({"x": jnp.copy(xs), "y": jnp.copy(ys)})
        run(tutorial, "shard", "--mesh mesh --in x=batch y=batch model=None opt_state=None "
                               "--donate model opt_state x y --out loss model opt_state --no-show", """\
            loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
            updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            model = eqx.apply_updates(model, updates)
        """)
        loss, *theirs = train_step(*theirs, jnp.copy(xs), jnp.copy(ys))
        np.testing.assert_allclose(float(tutorial.user_ns["loss"]), float(loss), rtol=1e-6)
    close(eqx.filter(tutorial.user_ns["model"], eqx.is_array), eqx.filter(theirs[0], eqx.is_array))
    close(tutorial.user_ns["opt_state"], theirs[1])
    assert tutorial.user_ns["x"].is_deleted()  # donated, and not returned: reading it is our UsageError
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="`x` was deleted"):
        run(tutorial, "shard", "--mesh mesh --no-show", "again = x * 2")


# --- shard_map's networks: data, FSDP and tensor parallel ---------------------------------------------

def init_layer(key, n_in, n_out):
    k1, k2 = jax.random.split(key)
    return jax.random.normal(k1, (n_in, n_out)) / jnp.sqrt(n_in), jax.random.normal(k2, (n_out,)) * 0.1


def predict(params, inputs):
    for W, b in params:
        inputs = jax.nn.relu(jnp.dot(inputs, W) + b)
    return inputs


@pytest.fixture
def network(tutorial):
    layer_sizes = [16, 32, 32, 8]
    keys = jax.random.split(jax.random.PRNGKey(0), len(layer_sizes))
    params = [init_layer(k, a, b) for k, a, b in zip(keys, layer_sizes[:-1], layer_sizes[1:])]
    inputs = jax.random.normal(jax.random.PRNGKey(1), (32, 16))
    targets = jax.random.normal(jax.random.PRNGKey(2), (32, 8))
    tutorial.push({"params": params, "inputs": inputs, "targets": targets, "predict": predict})
    return params, inputs, targets


def test_shard_map_data_parallel_network(tutorial, network):
    params, inputs, targets = network
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
    tutorial.push({"mesh": mesh})

    def loss_dp(params, inputs, targets):
        @partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("batch", None), P("batch", None)), out_specs=P())
        def loss_spmd(params, local_inputs, local_targets):
            local_loss = jnp.mean(jnp.sum((predict(params, local_inputs) - local_targets) ** 2, axis=-1))
            return lax.pmean(local_loss, "batch")
        return loss_spmd(params, jax.reshard(inputs, P("batch", None)), jax.reshard(targets, P("batch", None)))

    with jax.set_mesh(mesh):
        expected = jax.jit(loss_dp)(params, inputs, targets)
        expected_grads = jax.jit(jax.grad(loss_dp))(params, inputs, targets)
    run(tutorial, "shard_map", "--mesh mesh --in inputs=batch,None targets=batch,None --out loss --no-show", """\
        predictions = predict(params, inputs)
        local_loss = jnp.mean(jnp.sum((predictions - targets) ** 2, axis=-1))
        loss = lax.pmean(local_loss, 'batch')
    """)
    np.testing.assert_allclose(float(tutorial.user_ns["loss"]), float(expected), rtol=1e-5)
    # The gradient, through %%shard around the same shard_map the tutorial writes:
    tutorial.push({"loss_dp": loss_dp})
    run(tutorial, "shard", "--mesh mesh --out grads --no-show", "grads = jax.grad(loss_dp)(params, inputs, targets)")
    close(tutorial.user_ns["grads"], expected_grads, rtol=1e-4)


def test_shard_map_fsdp_network(tutorial, network):
    """Each device keeps a slice of every parameter and all-gathers it when it needs it."""
    params, inputs, targets = network
    mesh = jax.make_mesh((8,), ("batch",))
    tutorial.push({"mesh": mesh})

    def predict_fsdp(params_frag, inputs):
        for W_frag, b_frag in params_frag:
            W = lax.all_gather(W_frag, "batch", tiled=True)
            b = lax.all_gather(b_frag, "batch", tiled=True)
            inputs = jax.nn.relu(jnp.dot(inputs, W) + b)
        return inputs

    def loss_fsdp(params, inputs, targets):
        local = jnp.mean(jnp.sum((predict_fsdp(params, inputs) - targets) ** 2, axis=-1))
        return lax.pmean(local, "batch")

    with jax.set_mesh(mesh):
        placed = jax.device_put(params, P("batch"))
        expected = jax.jit(jax.shard_map(loss_fsdp, in_specs=(P("batch"), P("batch"), P("batch")),
                                         out_specs=P()))(placed, jax.device_put(inputs, P("batch")),
                                                         jax.device_put(targets, P("batch")))
    tutorial.push({"predict_fsdp": predict_fsdp})
    run(tutorial, "shard_map", "--mesh mesh --in params=batch inputs=batch targets=batch --out loss --no-show", """\
        local = jnp.mean(jnp.sum((predict_fsdp(params, inputs) - targets) ** 2, axis=-1))
        loss = lax.pmean(local, 'batch')
    """)
    np.testing.assert_allclose(float(tutorial.user_ns["loss"]), float(expected), rtol=1e-5)


def test_shard_map_tensor_parallel_network(tutorial):
    """Megatron-style tensor parallelism over `feats` (the first weight split by columns, the second
    by rows, one psum), data parallelism over `batch`."""
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(3), 4)
    params = {"W1": jax.random.normal(k1, (16, 32)) / 4, "b1": jnp.zeros(32),
              "W2": jax.random.normal(k2, (32, 8)) / 6, "b2": jnp.ones(8) * 0.1}
    inputs, targets = jax.random.normal(k3, (32, 16)), jax.random.normal(k4, (32, 8))
    mesh = jax.make_mesh((4, 2), ("batch", "feats"))
    specs = {"W1": P(None, "feats"), "b1": P("feats"), "W2": P("feats", None), "b2": P()}

    def loss_tp(params, inputs, targets):
        hidden = jax.nn.relu(inputs @ params["W1"] + params["b1"])  # this device's columns
        outputs = lax.psum(hidden @ params["W2"], "feats") + params["b2"]  # its rows' part, summed
        return lax.pmean(jnp.mean(jnp.sum((outputs - targets) ** 2, axis=-1)), "batch")

    with jax.set_mesh(mesh):
        expected = jax.jit(jax.shard_map(loss_tp, in_specs=(specs, P("batch", None), P("batch", None)),
                                         out_specs=P()))(jax.device_put(params, specs),
                                                         jax.device_put(inputs, P("batch", None)),
                                                         jax.device_put(targets, P("batch", None)))
    tutorial.push({"params": params, "inputs": inputs, "targets": targets, "mesh": mesh, "specs": specs})
    run(tutorial, "shard_map",
        "--mesh mesh --in params=@specs inputs=batch,None targets=batch,None --out loss --no-show", """\
        hidden = jax.nn.relu(inputs @ params['W1'] + params['b1'])
        outputs = lax.psum(hidden @ params['W2'], 'feats') + params['b2']
        loss = lax.pmean(jnp.mean(jnp.sum((outputs - targets) ** 2, axis=-1)), 'batch')
    """)
    np.testing.assert_allclose(float(tutorial.user_ns["loss"]), float(expected), rtol=1e-5)
