"""Flax NNX objects as `nnx.jit` takes them: every NNX object a cell reads is split as one graph
(state two inputs share stays shared), found wherever it sits (a registered dataclass, a custom
pytree node, an Equinox module's field), and what the cell changes in place is written back.

Each result is compared with `nnx.jit` on twin objects, exactly, through several re-runs (the
re-run path matches and merges the objects again), with the view on and off."""
from __future__ import annotations

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError

from shell_helpers import assert_same_nnx_state, snapshot

optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    """A registered dataclass holding an NNX object (and a static field, as dataclasses often do)."""

    inner: object
    scale: float = dataclasses.field(default=1.0, metadata={"static": True})


class Holder:
    """A custom pytree node (register_pytree_node), holding an NNX object."""

    def __init__(self, inner):
        self.inner = inner


jax.tree_util.register_pytree_node(Holder, lambda h: ((h.inner,), None), lambda _, kids: Holder(*kids))


class EqxHolder(eqx.Module):
    inner: object


class Outer(nnx.Module):
    def __init__(self, seed: int = 0):
        self.lin = nnx.Linear(2, 2, rngs=nnx.Rngs(seed))


def cell(ip, magic: str, line: str, source: str):
    return ip.run_cell_magic(magic, line, textwrap.dedent(source))


@pytest.fixture
def nnx_ns(jx):
    jx.run_line_magic("mesh", "data=8")
    jx.push({"nnx": nnx, "optax": optax, "Box": Box})
    return jx


# --- item 4: NNX state shared between two inputs ---------------------------------------------------

SHARED = """
same = b.lin is a
a.kernel[...] += 1
b.lin.kernel[...] += 10
"""


@nnx.jit
def _shared_step(a, b):
    same = b.lin is a
    a.kernel[...] += 1
    b.lin.kernel[...] += 10
    return same


@pytest.mark.parametrize("show", ["--no-show", "--show"])
def test_shard_shares_what_two_inputs_share_like_nnx_jit(nnx_ns, show):
    model, twin = Outer(), Outer()
    nnx_ns.push({"a": model.lin, "b": model})
    for _ in range(3):  # the first run compiles; the next ones take the re-run path
        cell(nnx_ns, "shard", show, SHARED)
        twin_same = _shared_step(twin.lin, twin)
        assert nnx_ns.user_ns["same"] is True and bool(twin_same) is True  # nnx.jit returns it as an array
        assert_same_nnx_state(model, twin)
    assert nnx_ns.user_ns["a"] is model.lin and nnx_ns.user_ns["b"] is model
    np.testing.assert_array_equal(model.lin.kernel[...], Outer().lin.kernel[...] + 33)


def test_shard_two_names_for_one_object_and_a_shared_variable(nnx_ns):
    model, twin = Outer(), Outer()
    nnx_ns.push({"m1": model, "m2": model, "k": model.lin.kernel})
    source = "same = (m1 is m2, m2.lin.kernel is k)\nm1.lin.kernel[...] *= 2\nk[...] += 1\nm2.lin.bias[...] -= 1\n"

    @nnx.jit
    def step(m1, m2, k):
        same = (m1 is m2, m2.lin.kernel is k)
        m1.lin.kernel[...] *= 2
        k[...] += 1
        m2.lin.bias[...] -= 1
        return same

    for _ in range(2):
        cell(nnx_ns, "shard", "--no-show", source)
        assert nnx_ns.user_ns["same"] == step(twin, twin, twin.lin.kernel) == (True, True)
        assert_same_nnx_state(model, twin)


def test_shard_reruns_when_the_sharing_changes(nnx_ns):
    """The same structure without the sharing is another program: `b.lin is a` is False then."""
    model = Outer()
    nnx_ns.push({"a": model.lin, "b": model})
    cell(nnx_ns, "shard", "--no-show", "same = b.lin is a\nout = a(jnp.ones((1, 2))) + b.lin(jnp.ones((1, 2)))")
    assert nnx_ns.user_ns["same"] is True
    nnx_ns.push({"a": Outer(1).lin})
    cell(nnx_ns, "shard", "--no-show", "same = b.lin is a\nout = a(jnp.ones((1, 2))) + b.lin(jnp.ones((1, 2)))")
    assert nnx_ns.user_ns["same"] is False
    twin = Outer(1).lin(jnp.ones((1, 2))) + Outer().lin(jnp.ones((1, 2)))
    np.testing.assert_array_equal(nnx_ns.user_ns["out"], twin)


@pytest.mark.parametrize("magic,line", [("pmap", "--broadcast a b"), ("shard_map", "")])
def test_per_device_magics_share_too_and_refuse_changes(nnx_ns, magic, line):
    model = Outer()
    nnx_ns.push({"a": model.lin, "b": model})
    cell(nnx_ns, magic, f"--no-show {line}", "same = b.lin is a")
    assert nnx_ns.user_ns["same"] is True
    kernel = np.asarray(model.lin.kernel[...])
    before = snapshot(nnx_ns.user_ns)
    with pytest.raises(UsageError, match="changes the Flax NNX object '(a|b)' in place.*%%shard"):
        cell(nnx_ns, magic, f"--no-show {line}", SHARED)
    assert snapshot(nnx_ns.user_ns) == before
    np.testing.assert_array_equal(model.lin.kernel[...], kernel)


# --- item 5: an NNX object inside another pytree ---------------------------------------------------

WRAPPERS = {
    "dataclass": Box,
    "pytree node": Holder,
    "equinox field": EqxHolder,
}


def _batch():
    return jnp.arange(24.0).reshape(8, 3) / 7


@pytest.mark.parametrize("wrap", list(WRAPPERS))
def test_shard_writes_back_batchnorm_statistics_inside_any_pytree(nnx_ns, wrap):
    make = WRAPPERS[wrap]
    mine, twin = make(nnx.BatchNorm(3, rngs=nnx.Rngs(0))), make(nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
    nnx_ns.push({"box": mine, "x": _batch()})
    step = nnx.jit(lambda box, x: box.inner(x))
    for _ in range(3):
        cell(nnx_ns, "shard", "--no-show", "y = box.inner(x)")
        np.testing.assert_array_equal(nnx_ns.user_ns["y"], step(twin, _batch()))
        assert_same_nnx_state(mine.inner, twin.inner)
    assert float(jnp.abs(mine.inner.mean[...]).sum()) > 0  # the statistics moved
    assert nnx_ns.user_ns["box"] is mine


def test_shard_writes_back_an_rngs_draw_inside_a_dataclass(nnx_ns):
    mine, twin = Box(nnx.Rngs(0, dropout=1)), Box(nnx.Rngs(0, dropout=1))
    nnx_ns.push({"box": mine})
    draw = nnx.jit(lambda box: jax.random.normal(box.inner.dropout(), (4,)))
    for _ in range(3):  # each draw must be a new one, as nnx.jit's are
        cell(nnx_ns, "shard", "", "noise = jax.random.normal(box.inner.dropout(), (4,))")
        np.testing.assert_array_equal(nnx_ns.user_ns["noise"], draw(twin))
    assert int(mine.inner.dropout.count[...]) == int(twin.inner.dropout.count[...]) == 3


def test_shard_writes_back_an_optimizer_update_inside_an_equinox_module(nnx_ns):
    def fresh():
        model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
        return EqxHolder((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))

    mine, twin = fresh(), fresh()
    x = _batch()
    nnx_ns.push({"state": mine, "x": x})
    source = """
    model, opt = state.inner
    loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
    opt.update(model, grads)
    del model, opt, grads
    """

    @nnx.jit
    def step(state, x):
        model, opt = state.inner
        loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
        opt.update(model, grads)
        return loss

    for _ in range(3):
        cell(nnx_ns, "shard", "--no-show", source)
        np.testing.assert_array_equal(nnx_ns.user_ns["loss"], step(twin, x))
        assert_same_nnx_state(mine.inner[0], twin.inner[0])
        assert_same_nnx_state(mine.inner[1], twin.inner[1])
    assert int(mine.inner[1].step[...]) == 3


def test_shard_writes_back_variables_of_an_nnx_state(nnx_ns):
    """The functional form: a State holds Variables, which `nnx.merge` reuses; changing the merged
    model changes the State, in plain Python and under nnx.jit alike."""
    graphdef, mine = nnx.split(Outer())
    _, twin = nnx.split(Outer())
    nnx_ns.push({"graphdef": graphdef, "state": mine})

    @nnx.jit
    def step(state):
        nnx.merge(graphdef, state).lin.kernel[...] += 1

    for _ in range(2):
        cell(nnx_ns, "shard", "--no-show", "nnx.merge(graphdef, state).lin.kernel[...] += 1")
        step(twin)
    np.testing.assert_array_equal(mine["lin"]["kernel"][...], twin["lin"]["kernel"][...])
    np.testing.assert_array_equal(mine["lin"]["kernel"][...], nnx.state(Outer())["lin"]["kernel"][...] + 2)


def test_shard_writes_back_into_the_object_even_when_the_cell_rebinds_its_name(nnx_ns):
    """nnx.jit updates the object it was given; a cell that then binds the name to something else
    must update that object too (the name's new value is not an NNX object to write into)."""
    mine, twin = nnx.BatchNorm(3, rngs=nnx.Rngs(0)), nnx.BatchNorm(3, rngs=nnx.Rngs(0))
    nnx_ns.push({"bn": mine, "x": _batch()})
    cell(nnx_ns, "shard", "--no-show", "bn = bn(x).sum()")
    expected = nnx.jit(lambda bn, x: bn(x).sum())(twin, _batch())
    np.testing.assert_array_equal(nnx_ns.user_ns["bn"], expected)
    assert_same_nnx_state(mine, twin)


@pytest.mark.parametrize("wrap", list(WRAPPERS))
def test_pmap_refuses_an_nnx_object_inside_any_pytree_changed_in_place(nnx_ns, wrap):
    mine = WRAPPERS[wrap](nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
    nnx_ns.push({"box": mine, "x": _batch()})
    before = snapshot(nnx_ns.user_ns)
    with pytest.raises(UsageError, match=r"changes the Flax NNX object \"?'?box.*in place.*%%shard"):
        cell(nnx_ns, "pmap", "--no-show --broadcast box", "y = box.inner(x)")
    assert snapshot(nnx_ns.user_ns) == before
    np.testing.assert_array_equal(mine.inner.mean[...], np.zeros(3))
    # Reading it is fine: in eval mode the statistics are only read.
    mine.inner.eval()
    cell(nnx_ns, "pmap", "--no-show --broadcast box", "y = box.inner(x)")
    twin = WRAPPERS[wrap](nnx.BatchNorm(3, rngs=nnx.Rngs(0)))
    twin.inner.eval()
    np.testing.assert_allclose(nnx_ns.user_ns["y"], twin.inner(_batch()), rtol=1e-6)


# --- --in lays out the user's own objects, wherever they sit ----------------------------------------

def test_shard_in_places_an_nnx_model_by_its_partition_specs_and_one_inside_a_dataclass(nnx_ns):
    from jax.sharding import PartitionSpec as P

    nnx_ns.run_line_magic("mesh", "data=4 model=2")
    mesh = nnx_ns.user_ns["mesh"]

    def fresh():
        with jax.set_mesh(mesh):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            return nnx.Linear(4, 8, kernel_init=init, rngs=nnx.Rngs(0))

    model, twin = fresh(), fresh()
    specs = nnx.get_partition_spec(nnx.state(model))
    x = jnp.ones((8, 4))
    nnx_ns.push({"model": model, "specs": specs, "x": x})
    cell(nnx_ns, "shard", "--in model=@specs x=data --no-show", "y = model(x)\nmodel.kernel[...] += 1")
    @nnx.jit
    def step(m, x):
        y = m(x)
        m.kernel[...] += 1
        return y

    with jax.set_mesh(mesh):  # the twin on the same layout: x split over data
        expected = step(twin, jax.device_put(x, jax.sharding.NamedSharding(mesh, P("data"))))
    assert nnx_ns.user_ns["model"] is model
    assert model.kernel[...].sharding.spec == P(None, "model")
    np.testing.assert_array_equal(nnx_ns.user_ns["y"], expected)
    assert_same_nnx_state(model, twin)

    inner = fresh()
    box = Box(inner)
    nnx_ns.push({"box": box})
    cell(nnx_ns, "shard", "--in box=None --no-show", "y = box.inner(x)")
    placed = nnx_ns.user_ns["box"]
    assert type(placed) is Box and placed.inner is inner  # the user's own module, laid out in place
    assert inner.kernel[...].sharding.is_fully_replicated and inner.kernel[...].sharding.mesh.shape == mesh.shape


# --- what nnx.jit also carries back: static attributes, new and deleted attributes, identity -----------

class Net(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(3, rngs=nnx.Rngs(1))

    def __call__(self, x):
        return self.bn(self.lin(x))


STRUCTURE = """
y = net(x)
net.eval()
net.extra = nnx.Param(jnp.ones(2))
del net.lin
"""


@nnx.jit
def _structure_step(net, x):
    y = net(x)
    net.eval()
    net.extra = nnx.Param(jnp.ones(2))
    del net.lin
    return y


@pytest.mark.parametrize("show", ["--no-show", "--show"])
def test_shard_writes_back_static_attributes_and_the_graph_like_nnx_jit(nnx_ns, show):
    for _ in range(2):  # the second run replays the compiled program on fresh objects of the same structure
        mine, twin = Net(), Net()
        nnx_ns.push({"net": mine, "x": _batch()})
        cell(nnx_ns, "shard", show, STRUCTURE)
        expected = _structure_step(twin, _batch())
        np.testing.assert_array_equal(nnx_ns.user_ns["y"], expected)
        assert mine.bn.use_running_average is True and twin.bn.use_running_average is True  # .eval() kept
        assert not hasattr(mine, "lin") and not hasattr(twin, "lin")
        assert_same_nnx_state(mine, twin)
        assert nnx_ns.user_ns["net"] is mine
        assert not any(name.startswith("<") for name in nnx_ns.user_ns)


def test_shard_binds_an_output_that_is_an_object_read_as_that_object(nnx_ns):
    model, twin = Outer(), Outer()
    x = jnp.ones((1, 2))
    nnx_ns.push({"model": model, "x": x})
    source = "sub = model.lin\nsame = model\nk = model.lin.kernel\npair = (model.lin, sub(x))\nsub.kernel[...] += 1\n"

    @nnx.jit
    def step(model, x):
        sub = model.lin
        pair = (model.lin, sub(x))
        sub.kernel[...] += 1
        return sub, model, model.lin.kernel, pair

    for _ in range(3):  # full path, then the re-run path
        cell(nnx_ns, "shard", "--no-show", source)
        sub, same, k, pair = step(twin, x)
        assert sub is twin.lin and same is twin and k is twin.lin.kernel and pair[0] is twin.lin  # nnx.jit's way
        ns = nnx_ns.user_ns
        assert ns["sub"] is model.lin and ns["same"] is model and ns["k"] is model.lin.kernel
        assert ns["pair"][0] is model.lin
        np.testing.assert_array_equal(ns["pair"][1], pair[1])
        assert_same_nnx_state(model, twin)


def test_pmap_refuses_a_static_change_it_cannot_write_back(nnx_ns):
    net = Net()
    nnx_ns.push({"net": net, "x": jnp.ones((8, 3))})
    before = snapshot(nnx_ns.user_ns)
    with pytest.raises(UsageError, match="changes the Flax NNX object 'net' in place.*eval"):
        cell(nnx_ns, "pmap", "--no-show --broadcast net", "net.eval()\ny = net(x)")
    assert snapshot(nnx_ns.user_ns) == before and net.bn.use_running_average is False


# --- issue 40 item 1: plain dict, list and set attributes (a config) ---------------------------------

class Configured(nnx.Module):
    """A module with the configs users keep as plain containers: Flax keeps them static, in the graphdef."""

    def __init__(self):
        self.lin = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
        self.cfg = {"act": "relu", "deep": {"k": [1.0, 2.0]}}
        self.sizes = [4, 8]
        self.tags = {"a"}

    def __call__(self, x):
        y = self.lin(x)
        y = jax.nn.relu(y) if self.cfg["act"] == "relu" else jnp.tanh(y)
        return y * len(self.sizes) + len(self.tags) + sum(self.cfg["deep"]["k"])


IN_PLACE = ["pass", "pass", "pass", "model.sizes.append(16)", "model.cfg['act'] = 'tanh'", "pass",
            "model.tags.add('b')", "model.cfg['deep']['k'].append(3.0)", "pass", "model.tags.discard('a')", "pass"]


@pytest.mark.parametrize("magic,line", [("shard", ""), ("shard_map", "--in x=P('data') --out y=P('data')"),
                                        ("pmap", "--broadcast model")])
def test_a_module_with_dict_list_and_set_attributes_runs_and_sees_them_changed_in_place(nnx_ns, magic, line):
    """It raised TypeError: unhashable type: 'dict' (the graphdef in the cache key). Each re-run after
    an in-place change must see it, as eager code does (nnx.jit in Flax 0.12 does not: its cache holds
    the very list, so the change compares equal to itself)."""
    model = Configured()
    x = jnp.arange(32.0).reshape(8, 4) / 10 - 1
    nnx_ns.push({"model": model, "x": x})
    for change in IN_PLACE:  # the first runs take the full path, then the re-run record (nnx_replay)
        nnx_ns.run_cell(change).raise_error()
        cell(nnx_ns, magic, f"--no-show {line}", "y = model(x)")
        if magic == "pmap":  # each device calls it on its row
            expected = jnp.stack([model(row[None])[0] for row in x])
        else:
            expected = model(x)  # eager: the config as it is now
        np.testing.assert_allclose(nnx_ns.user_ns["y"], expected, rtol=1e-6, err_msg=change)
    assert model.sizes == [4, 8, 16] and model.tags == {"b"} and model.cfg["act"] == "tanh"
