"""Every magic against its plain-JAX twin on the attached devices, bitwise (issue 39): `%%pmap` against
`jax.pmap`, `%%shard` against `jax.jit` (a small transformer's training step in f32 and bf16, and a
Flax NNX + optax step against `nnx.jit`), `%%shard_map` against `jax.jit(jax.shard_map(...))`, and
each one's `--as-code` snippet run alone against the magic (tests/test_as_code.py's round trip).

On a TPU v5e these were first checked by hand (shared TPU.md); this file keeps them checked. On one
chip the mesh has one device: the collectives are trivial, the compiler and the run are the chip's.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from device_helpers import assert_bitwise, nnx_train_step
from test_as_code import round_trip

pytestmark = pytest.mark.device
STEPS = 3

TRANSFORMER = """
def layer_norm(x, scale):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * scale

def block(p, x):
    s = x.shape[1]
    h = layer_norm(x, p["ln1"])
    q, k, v = (jnp.einsum("bsd,dhk->bshk", h, p[n]) for n in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) * (q.shape[-1] ** -0.5)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, jnp.finfo(scores.dtype).min)
    attention = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
    x = x + jnp.einsum("bhqs,bshk,hkd->bqd", attention, v, p["wo"])
    return x + jax.nn.gelu(layer_norm(x, p["ln2"]) @ p["w1"]) @ p["w2"]

def loss_fn(params, x, y):
    for p in params:
        x = block(p, x)
    return jnp.mean((x.astype(jnp.float32) - y) ** 2)
"""
STEP = """\
loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
"""
LINE = "--mesh mesh --in x=data y=data --out loss params --no-show"


def transformer(dtype, layers=2, d=256, heads=4, seq=64, batch_per_device=4):
    keys = iter(jax.random.split(jax.random.key(0), 8 * layers + 2))

    def normal(*shape):
        return (jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(shape[0])).astype(dtype)

    params = [{"ln1": jnp.ones(d, dtype), "ln2": jnp.ones(d, dtype), "wq": normal(d, heads, d // heads),
               "wk": normal(d, heads, d // heads), "wv": normal(d, heads, d // heads),
               "wo": normal(heads, d // heads, d), "w1": normal(d, 4 * d), "w2": normal(4 * d, d)}
              for _ in range(layers)]
    batch = batch_per_device * jax.device_count()
    x = jax.random.normal(next(keys), (batch, seq, d), jnp.float32).astype(dtype)
    y = jax.random.normal(next(keys), (batch, seq, d), jnp.float32)
    return params, x, y


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shard_trains_a_transformer_as_jax_jit_does_bitwise(jx, mesh, dtype):
    jx.run_cell(TRANSFORMER, store_history=False).raise_error()
    params, x, y = transformer(jnp.dtype(dtype))
    jx.push({"params": params, "x": x, "y": y})
    loss_fn = jx.user_ns["loss_fn"]

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    data = NamedSharding(mesh, P("data"))
    theirs = params
    with jax.set_mesh(mesh):
        placed = jax.device_put(x, data), jax.device_put(y, data)
        for i in range(STEPS):
            jx.run_cell_magic("shard", LINE, STEP)
            loss, theirs = step(theirs, *placed)
            assert_bitwise(jx.user_ns["loss"], loss, f"{dtype} loss, step {i}")
            assert_bitwise(jx.user_ns["params"], theirs, f"{dtype} params, step {i}")
    assert jx.user_ns["params"][0]["w1"].dtype == jnp.dtype(dtype)
    _, ours, magic = round_trip(jx, "shard", LINE.replace(" --no-show", ""), STEP)  # its --as-code, alone
    assert_bitwise(ours["params"], magic["params"], f"{dtype} --as-code params")


def test_pmap_is_jax_pmap_bitwise_in_block_and_function_mode(jx):
    n = jax.device_count()
    x = jax.random.normal(jax.random.key(1), (n, 128, 128))
    jx.push({"x": x, "lax": lax})
    source = "y = lax.psum(jnp.tanh(x @ x), 'i')\nz = x * (lax.axis_index('i') + 1)\n"
    with capture_output():
        jx.run_cell_magic("pmap", "--no-show", source)
    twin = jax.pmap(lambda x: (lax.psum(jnp.tanh(x @ x), "i"), x * (lax.axis_index("i") + 1)), axis_name="i")
    assert_bitwise((jx.user_ns["y"], jx.user_ns["z"]), twin(x), "%%pmap block mode")
    _, ours, magic = round_trip(jx, "pmap", "", source)
    assert_bitwise((ours["y"], ours["z"]), (magic["y"], magic["z"]), "%%pmap --as-code")

    with capture_output():
        jx.run_cell_magic("pmap", "--no-show", "def step(x):\n    return lax.psum(x @ x, 'i') / 128\n")
    hand = jax.pmap(lambda x: lax.psum(x @ x, "i") / 128, axis_name="i")
    assert_bitwise(jx.user_ns["step"](x), hand(x), "%%pmap function mode")


def test_shard_map_is_jit_of_shard_map_bitwise(jx, mesh):
    n = jax.device_count()
    a = jax.random.normal(jax.random.key(2), (64 * n, 256))
    w = jax.random.normal(jax.random.key(3), (256, 128))
    jx.push({"a": a, "w": w, "lax": lax})
    line = "--mesh mesh --in a=data,None --out c=data,None total"
    source = "c = jnp.tanh(a @ w)\ntotal = lax.psum(a.sum(), 'data')\n"
    with capture_output():
        jx.run_cell_magic("shard_map", f"{line} --no-show", source)
    twin = jax.jit(jax.shard_map(lambda a, w: (jnp.tanh(a @ w), lax.psum(a.sum(), "data")), mesh=mesh,
                                 in_specs=(P("data", None), P()), out_specs=(P("data", None), P())))
    placed = jax.device_put(a, NamedSharding(mesh, P("data", None))), jax.device_put(w, NamedSharding(mesh, P()))
    assert_bitwise((jx.user_ns["c"], jx.user_ns["total"]), twin(*placed), "%%shard_map")
    _, ours, magic = round_trip(jx, "shard_map", line, source)
    assert_bitwise((ours["c"], ours["total"]), (magic["c"], magic["total"]), "%%shard_map --as-code")


NNX_STEP = """\
loss, grads = nnx.value_and_grad(nnx_loss)(model, x, y)
optimizer.update(model, grads)
"""
NNX_LINE = "--mesh mesh --in x=data y=data --out loss --no-show"


def test_flax_nnx_and_optax_step_is_nnx_jit_bitwise(jx, mesh):
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    jx.run_cell(textwrap.dedent("""
        from flax import nnx
        import optax

        class MLP(nnx.Module):
            def __init__(self, rngs):
                self.layers = nnx.List([nnx.Linear(256, 256, rngs=rngs) for _ in range(3)])
            def __call__(self, x):
                for layer in self.layers:
                    x = jnp.tanh(layer(x))
                return x

        def nnx_loss(model, x, y):
            return jnp.mean((model(x) - y) ** 2)
    """), store_history=False).raise_error()
    replicated = NamedSharding(mesh, P())

    def fresh():
        model = jx.user_ns["MLP"](nnx.Rngs(0))
        nnx.update(model, jax.device_put(nnx.state(model), replicated))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    model, optimizer = fresh()
    twin_model, twin_optimizer = fresh()
    x = jax.random.normal(jax.random.key(4), (32 * jax.device_count(), 256))
    jx.push({"model": model, "optimizer": optimizer, "x": x, "y": jnp.tanh(x)})
    train_step = nnx_train_step(jx.user_ns["nnx_loss"])

    for i in range(STEPS):
        jx.run_cell_magic("shard", NNX_LINE, NNX_STEP)
        loss = train_step(twin_model, twin_optimizer, jx.user_ns["x"], jx.user_ns["y"])  # the batch the cell placed
        assert_bitwise(jx.user_ns["loss"], loss, f"NNX loss, step {i}")
        assert_bitwise(nnx.state(model), nnx.state(twin_model), f"NNX model, step {i}")
        assert_bitwise(nnx.state(optimizer), nnx.state(twin_optimizer), f"optax state, step {i}")
