"""A Flax NNX training step re-run at nnx.jit's cost (cell/nnx_replay.py): once a `%%shard` cell has
run twice on the same objects, a re-run checks them with one JAX flatten and writes the new state
straight into their Variables, calling none of nnx's graph walks (split, flatten, state, update,
merge). Yet every change nnx.jit would see between two calls is seen: each case runs the cell until
it takes that path, changes the objects and their twin alike, and compares every result and every
Variable with `nnx.jit` on the twin, exactly."""
from __future__ import annotations

import textwrap
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shell_helpers import assert_same_nnx_state

optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")

WALKS = ("split", "flatten", "state", "update", "merge", "graphdef")


@pytest.fixture
def nnx_ns(jx):
    jx.run_line_magic("mesh", "data=8")
    jx.push({"nnx": nnx})
    return jx


@pytest.fixture
def walks(monkeypatch):
    """How many times our package called each of nnx's graph walks (the package calls them as
    attributes of flax.nnx, so counting them there sees every call)."""
    counts = Counter()
    for name in WALKS:
        original = getattr(nnx, name)

        def counting(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(nnx, name, counting)
    return counts


def cell(ip, line: str, source: str):
    return ip.run_cell_magic("shard", line, textwrap.dedent(source))


class Mlp(nnx.Module):
    def __init__(self):
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=nnx.Rngs(i)) for i in range(3)])

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


def _loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


TRAIN = """
loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
optimizer.update(model, grads)
"""


@nnx.jit
def _train(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss


def _trained(mesh):
    """A model replicated on the mesh, then its optimizer (whose state takes the same layout): on
    Explicit axes a plain nnx.jit step needs its parameters on the mesh, as the magic puts them."""
    model = Mlp()
    nnx.update(model, jax.device_put(nnx.state(model), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


@pytest.mark.parametrize("line", ["--in x=data y=data --out loss --no-show", "--no-show", "--show"])
def test_a_training_step_rerun_walks_no_graph_and_matches_nnx_jit(nnx_ns, walks, line):
    mesh = nnx_ns.user_ns["mesh"]
    (model, optimizer), (twin, twin_optimizer) = _trained(mesh), _trained(mesh)
    x = jnp.arange(32.0).reshape(8, 4) / 32
    y = jnp.sin(x)
    nnx_ns.push({"model": model, "optimizer": optimizer, "x": x, "y": y, "loss_fn": _loss})
    for step in range(5):
        walks.clear()
        cell(nnx_ns, line, TRAIN)
        if step >= 2:  # the first run compiles, the second makes the record, the next ones use it
            assert not walks, f"step {step} walked the graph: {dict(walks)}"
        placed = nnx_ns.user_ns["x"], nnx_ns.user_ns["y"]  # as --in laid them out: the same sums on both sides
        assert float(nnx_ns.user_ns["loss"]) == float(_train(twin, twin_optimizer, *placed))
        assert_same_nnx_state(model, twin)
        assert_same_nnx_state(optimizer, twin_optimizer)
    assert nnx_ns.user_ns["model"] is model and nnx_ns.user_ns["optimizer"] is optimizer
    assert int(optimizer.step[...]) == 5


class Stateless(nnx.Module):
    def __init__(self):
        self.k = 1


class Zoo(nnx.Module):
    """Every kind of thing a graph can change between two calls: submodules (shareable), a
    stateless submodule, a BatchNorm (train/eval), a static attribute, a counter Variable."""

    def __init__(self):
        self.a = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
        self.b = nnx.Linear(3, 3, rngs=nnx.Rngs(1))
        self.f1, self.f2 = Stateless(), Stateless()
        self.bn = nnx.BatchNorm(3, rngs=nnx.Rngs(2))
        self.scale = 2.0
        self.count = nnx.BatchStat(jnp.zeros(()))

    def __call__(self, x):
        return self.bn(self.b(self.a(x))) * self.scale


ZOO = """
out = m(x)
shared = (m.a is m.b, m.f1 is getattr(m, "f2", None))
params = len(jax.tree.leaves(nnx.state(m, nnx.Param)))
tag = m.a.kernel.get_metadata().get("tag", 0)
m.a.kernel[...] += 1
m.count[...] += 1
"""


@nnx.jit
def _zoo(m, x):
    out = m(x)
    shared = (m.a is m.b, m.f1 is getattr(m, "f2", None))
    params = len(jax.tree.leaves(nnx.state(m, nnx.Param)))
    tag = m.a.kernel.get_metadata().get("tag", 0)
    m.a.kernel[...] += 1
    m.count[...] += 1
    return out, shared, params, tag


def _replace_kernel(m):
    m.a.kernel = nnx.Param(m.a.kernel[...] * 2)


def _retype_bias(m):
    m.b.bias = nnx.BatchStat(m.b.bias[...])


def _share(m):
    m.b = m.a


def _share_stateless(m):
    m.f2 = m.f1


def _add(m):
    m.extra = nnx.Param(jnp.ones(2))


def _delete(m):
    del m.f2


def _reshape_count(m):
    m.count.set_value(jnp.zeros((2,)))


CHANGES = {
    "nothing": lambda m: None,
    "a static attribute": lambda m: setattr(m, "scale", 3.0),
    "eval mode": lambda m: m.eval(),
    "a Variable replaced": _replace_kernel,
    "a Variable's type": _retype_bias,
    "a Variable's metadata": lambda m: m.a.kernel.set_metadata(tag=5),
    "an object now shared": _share,
    "a stateless object now shared": _share_stateless,
    "a new attribute": _add,
    "an attribute deleted": _delete,
    "an array of another shape": _reshape_count,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_rerun_sees_what_changed_between_calls_like_nnx_jit(nnx_ns, walks, change):
    mine, twin = Zoo(), Zoo()
    x = jnp.arange(24.0).reshape(8, 3) / 7
    nnx_ns.push({"m": mine, "x": x})

    def check():
        out, shared, params, tag = _zoo(twin, x)
        ns = nnx_ns.user_ns
        np.testing.assert_array_equal(ns["out"], out)
        assert ns["shared"] == tuple(bool(s) for s in shared)
        assert ns["params"] == int(params) and ns["tag"] == int(tag)
        assert_same_nnx_state(mine, twin)

    for _ in range(3):
        walks.clear()
        cell(nnx_ns, "--no-show", ZOO)
        counted = dict(walks)
        check()
    assert not counted  # the third run took the record's path
    old_kernel = mine.a.kernel
    before = np.asarray(old_kernel[...])
    CHANGES[change](mine)
    CHANGES[change](twin)
    for _ in range(3):  # the first run after the change and the ones after it
        cell(nnx_ns, "--no-show", ZOO)
        check()
    assert nnx_ns.user_ns["m"] is mine
    if mine.a.kernel is not old_kernel:  # the new Variable took the updates, the one it replaced none
        np.testing.assert_array_equal(old_kernel[...], before)


def test_a_rerun_sees_a_global_that_a_method_reads(nnx_ns):
    """The record fingerprints the user's classes again on every call, as the full check does."""
    nnx_ns.run_cell("sg = 1.0\nclass Scaled(nnx.Module):\n    def __init__(self):\n"
                    "        self.w = nnx.Param(jnp.float32(2.0))\n        self.n = nnx.BatchStat(jnp.zeros(()))\n"
                    "    def __call__(self, v):\n        return v * self.w[...] * sg\nh = Scaled()")
    x = jnp.arange(8.0)
    nnx_ns.push({"x": x})
    for sg in (1.0, 1.0, 1.0, 3.0, 3.0, -0.0):
        nnx_ns.user_ns["sg"] = sg
        cell(nnx_ns, "--no-show", "y = h(x)\nh.n[...] += 1")
        np.testing.assert_array_equal(nnx_ns.user_ns["y"], x * 2.0 * sg)
        np.testing.assert_array_equal(np.signbit(nnx_ns.user_ns["y"]), np.signbit(x * 2.0 * sg))
    assert int(nnx_ns.user_ns["h"].n[...]) == 6


def _unshare(m):
    m.b = nnx.Linear(3, 3, rngs=nnx.Rngs(1))


def test_objects_shared_from_the_start_are_checked_by_their_graph(nnx_ns, walks):
    """Where an object appears twice, JAX's flatten cannot stand for the graph: the record compares
    graphs (one nnx.flatten a call, as nnx.jit walks them) and still writes directly."""
    mine, twin = Zoo(), Zoo()
    _share(mine)
    _share(twin)
    x = jnp.arange(24.0).reshape(8, 3) / 7
    nnx_ns.push({"m": mine, "x": x})
    for run in range(5):
        if run == 3:
            _unshare(mine)
            _unshare(twin)
        walks.clear()
        cell(nnx_ns, "--no-show", ZOO)
        counted = dict(walks)
        out, shared, _, _ = _zoo(twin, x)
        np.testing.assert_array_equal(nnx_ns.user_ns["out"], out)
        assert nnx_ns.user_ns["shared"] == tuple(bool(s) for s in shared) == (run < 3, False)
        assert_same_nnx_state(mine, twin)
        if run == 2:
            assert counted == {"flatten": 1}
