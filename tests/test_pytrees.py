"""Any pytree is an input: the state researchers hold (dataclasses, optax, Equinox, Flax NNX and Linen),
through the real magics in a real shell, each result compared with the plain-library twin."""
from __future__ import annotations

import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from jax.sharding import PartitionSpec as P

from shell_helpers import run_python, snapshot

optax = pytest.importorskip("optax")
eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


def cell(ip, magic: str, line: str, source: str):
    return ip.run_cell_magic(magic, line, textwrap.dedent(source))


@pytest.fixture
def tree_ns(jx):
    jx.push({"Params": Params, "optax": optax, "eqx": eqx, "nnx": nnx, "P": jax.sharding.PartitionSpec})
    return jx


# --- %%pmap block mode slices every leaf, as jax.pmap does ---------------------------------------

def test_pmap_slices_every_leaf_of_a_dataclass_like_jax_pmap(tree_ns):
    p = Params(w=jnp.arange(24.0).reshape(8, 3), b=jnp.zeros(8))
    x = jnp.arange(8.0)
    tree_ns.push({"p": p, "x": x})
    cell(tree_ns, "pmap", "--no-show", "y = p.w.sum() + x\nq = Params(w=p.w * 2, b=p.b + 1)")
    twin_y, twin_q = jax.pmap(lambda p, x: (p.w.sum() + x, Params(w=p.w * 2, b=p.b + 1)))(p, x)
    np.testing.assert_allclose(tree_ns.user_ns["y"], twin_y)
    q = tree_ns.user_ns["q"]
    assert type(q) is Params  # outputs keep their type
    np.testing.assert_allclose(q.w, twin_q.w)
    np.testing.assert_allclose(q.b, twin_q.b)


def test_pmap_reassigning_a_pytree_input_binds_it_back(tree_ns):
    tree_ns.push({"p": Params(w=jnp.ones((8, 3)), b=jnp.zeros(8))})
    cell(tree_ns, "pmap", "--no-show", "p = Params(w=p.w * 2, b=p.b)")
    p = tree_ns.user_ns["p"]
    assert type(p) is Params and p.w.shape == (8, 3)
    np.testing.assert_allclose(p.w, 2.0)


def test_pmap_broadcast_and_split_take_whole_pytrees(tree_ns):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    batch = {"x": jnp.arange(32.0).reshape(16, 2)}
    tree_ns.push({"params": params, "batch": batch})
    cell(tree_ns, "pmap", "--no-show --broadcast params --split batch --merge out",
         "out = batch['x'] @ params['w'] + params['b']")
    np.testing.assert_allclose(tree_ns.user_ns["out"], batch["x"] @ params["w"] + params["b"])


def test_pmap_error_names_the_leaf_path_and_leaves_the_namespace(tree_ns):
    tree_ns.push({"bad": Params(w=jnp.ones((9, 3)), b=jnp.zeros(8))})
    before = snapshot(tree_ns.user_ns)
    with pytest.raises(UsageError, match=r"bad\.w") as err:
        cell(tree_ns, "pmap", "--no-show", "y = bad.w + 1")
    assert "(9, 3)" in str(err.value) and "--broadcast bad" in str(err.value)
    with pytest.raises(UsageError, match=r"bad\.w.*9 rows"):
        cell(tree_ns, "pmap", "--no-show --split bad", "y = bad.w + 1")
    assert snapshot(tree_ns.user_ns) == before


# --- %%shard: specs for pytrees, optax, no recompiles ---------------------------------------------

def _mlp_params(key, sizes=(4, 8, 1)):
    keys = jax.random.split(key, len(sizes) - 1)
    return {f"w{i}": jax.random.normal(k, (a, b)) * 0.3 for i, (k, a, b) in enumerate(zip(keys, sizes, sizes[1:]))}


def _loss(params, x, y):
    h = x
    for i in range(len(params)):
        h = h @ params[f"w{i}"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return ((h - y) ** 2).mean()


OPTAX_STEP = """
loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
updates, opt_state = tx.update(grads, opt_state, params)
params = optax.apply_updates(params, updates)
"""


def test_shard_trains_with_optax_like_jax_jit_and_stops_compiling(tree_ns, compiles):
    tx = optax.adam(1e-2)
    params = _mlp_params(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (16, 4))
    y = jnp.sum(x, axis=1, keepdims=True)
    tree_ns.push({"tx": tx, "loss_fn": _loss, "params": params, "opt_state": tx.init(params), "x": x, "y": y})

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    twin_params, twin_state = params, tx.init(params)
    counts = []
    for _ in range(4):
        cell(tree_ns, "shard", "--mesh data=8 --in x=data y=data params=P() --no-show", OPTAX_STEP)
        counts.append(compiles.count)
        twin_loss, twin_params, twin_state = step(twin_params, twin_state, x, y)
    ns = tree_ns.user_ns
    np.testing.assert_allclose(ns["loss"], twin_loss, rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(ns["params"][name], twin_params[name], rtol=1e-5, atol=1e-6)
    assert type(ns["opt_state"][0]).__name__ == "ScaleByAdamState"  # optax's NamedTuples come back
    assert int(ns["opt_state"][0].count) == 4
    # The first run compiles our program (the twin compiles its own); the later ones compile nothing.
    assert counts[-1] == counts[1], f"compiles after each run: {counts}"


def test_shard_one_spec_applies_to_every_leaf_and_a_spec_tree_gives_one_per_leaf(tree_ns):
    params = {"w": jnp.ones((8, 4)), "b": jnp.ones(8)}
    specs = {"w": jax.sharding.PartitionSpec("data", None), "b": jax.sharding.PartitionSpec()}
    tree_ns.push({"params": params, "specs": specs})
    cell(tree_ns, "shard", "--mesh data=8 --in params=data --no-show", "total = params['w'].sum() + params['b'].sum()")
    placed = tree_ns.user_ns["params"]
    assert all(leaf.sharding.spec == jax.sharding.PartitionSpec("data") for leaf in jax.tree.leaves(placed))
    cell(tree_ns, "shard", "--mesh data=8 --in params=@specs --no-show", "total = params['w'].sum()")
    placed = tree_ns.user_ns["params"]
    assert placed["w"].sharding.spec == jax.sharding.PartitionSpec("data", None)
    assert placed["b"].sharding.spec == jax.sharding.PartitionSpec()
    assert float(tree_ns.user_ns["total"]) == 32.0


def test_shard_spec_tree_of_the_wrong_shape_is_a_usage_error(tree_ns):
    tree_ns.push({"params": {"w": jnp.ones((8, 4))}, "specs": {"v": jax.sharding.PartitionSpec()}})
    before = snapshot(tree_ns.user_ns)
    with pytest.raises(UsageError, match=r"params=@specs: the specs' structure does not match 'params'"):
        cell(tree_ns, "shard", "--mesh data=8 --in params=@specs --no-show", "t = params['w'].sum()")
    with pytest.raises(UsageError, match=r"params\['w'\].*dimension 1.*has 4 elements, which does not divide"):
        cell(tree_ns, "shard", "--mesh data=8 --in params=P(None,data) --no-show", "t = params['w'].sum()")
    assert snapshot(tree_ns.user_ns) == before


@pytest.mark.parametrize("magic", ["shard", "shard_map"])
def test_an_out_spec_tree_rebound_between_runs_is_read_again(tree_ns, magic):
    """Issue 40 item 7: a re-run after `specs` is rebound takes the new layout (it kept the old one,
    silently, where --in @specs and %%shard_map saw the change); oracle: jax.device_put's layout."""
    w = jnp.arange(64.0).reshape(8, 8)
    tree_ns.push({"w": w, "specs": {"w": P("data", None)}})
    line = "--mesh data=8 --in w=data --out out=@specs --no-show"
    source = "out = {'w': w * 2}"
    for spec in (P("data", None), P(None, "data"), P("data", None)):
        tree_ns.push({"specs": {"w": spec}})
        cell(tree_ns, magic, line, source)
        got = tree_ns.user_ns["out"]["w"]
        mesh = got.sharding.mesh
        if magic == "shard":  # the cell's values, laid out by the spec
            want = jax.device_put(w * 2, jax.sharding.NamedSharding(mesh, spec))
        else:  # each device's block, assembled by the spec
            want = jax.jit(jax.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P("data"), out_specs=spec))(
                jax.device_put(w, jax.sharding.NamedSharding(mesh, P("data"))))
        assert got.sharding.is_equivalent_to(want.sharding, 2), (spec, got.sharding)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    tree_ns.push({"specs": 5})
    before = snapshot(tree_ns.user_ns)
    with pytest.raises(UsageError, match=r"--out out=@specs: `specs` is 5 \(int\), not a pytree of PartitionSpecs"):
        cell(tree_ns, magic, line, source)
    assert snapshot(tree_ns.user_ns) == before


@pytest.mark.parametrize("option", ["--in", "--out"])
@pytest.mark.parametrize("leaf, named, instead", [
    (3, r"`specs\['w'\]` is 3 \(int\), not a spec", r"P\('data'\)"),
    ("data,None", r"`specs\['w'\]` is 'data,None' \(str\), not a spec", r"P\('data', None\)"),
    (("data", None), r"`specs\['w'\]` is \('data', None\) \(tuple\), not a spec", r"P\('data', None\)"),
])
def test_a_spec_tree_leaf_that_is_no_spec_is_named_with_what_to_write(tree_ns, option, leaf, named, instead):
    """Issue 40 item 8: --in and --out read a spec tree through one reader; a leaf that is no
    PartitionSpec was a raw TypeError under --out (`'int' object is not iterable`), and a string
    was read as one entry per character."""
    tree_ns.push({"t": {"w": jnp.arange(64.0).reshape(8, 8)}, "specs": {"w": leaf}})
    line = "--mesh data=8 --in t=@specs --no-show" if option == "--in" else "--mesh data=8 --out out=@specs --no-show"
    before = snapshot(tree_ns.user_ns)
    with pytest.raises(UsageError, match=rf"{option} \w+=@specs: {named}.* write `specs\['w'\]` = {instead}"):
        cell(tree_ns, "shard", line, "out = {'w': t['w'] + 1}")
    assert snapshot(tree_ns.user_ns) == before
    import jaxpar_magic  # the twin's pytree of specs, named as the twin takes it

    with pytest.raises(UsageError, match=rf"`{option[2:]}_specs\['\w+'\]\['w'\]` is"):
        jaxpar_magic.shard_cell("out = {'w': t['w'] + 1}", tree_ns.user_ns, mesh="data=8",
                                **{("in_specs" if option == "--in" else "out_specs"):
                                   {("t" if option == "--in" else "out"): {"w": leaf}}})
    assert snapshot(tree_ns.user_ns) == before


# --- Equinox: static leaves stay static --------------------------------------------------------------

EQX_STEP = """
loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
model = eqx.apply_updates(model, updates)
"""


def test_shard_trains_an_equinox_mlp_like_filter_jit(tree_ns, compiles):
    model = eqx.nn.MLP(3, 1, 16, 2, activation=jax.nn.tanh, key=jax.random.key(0))
    tx = optax.sgd(0.05)
    x = jax.random.normal(jax.random.key(1), (32, 3))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def loss_fn(m, x, y):
        return ((jax.vmap(m)(x) - y) ** 2).mean()

    tree_ns.push({"model": model, "tx": tx, "opt_state": tx.init(eqx.filter(model, eqx.is_array)), "x": x, "y": y,
                  "loss_fn": loss_fn})

    @eqx.filter_jit
    def step(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return loss, eqx.apply_updates(model, updates), opt_state

    twin, twin_state = model, tx.init(eqx.filter(model, eqx.is_array))
    counts = []
    for _ in range(3):
        cell(tree_ns, "shard", "--mesh data=8 --in x=data y=data --no-show", EQX_STEP)
        counts.append(compiles.count)
        twin_loss, twin, twin_state = step(twin, twin_state, x, y)
    trained = tree_ns.user_ns["model"]
    assert type(trained) is eqx.nn.MLP and trained.activation is jax.nn.tanh  # its static leaf intact
    np.testing.assert_allclose(tree_ns.user_ns["loss"], twin_loss, rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(eqx.filter(trained, eqx.is_array)), jax.tree.leaves(eqx.filter(twin, eqx.is_array))):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert counts[-1] == counts[1], f"compiles after each run: {counts}"


# --- Flax NNX: split on the way in, merged inside, written back ------------------------------------

class _Model(nnx.Module if nnx is not None else object):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(3, 8, rngs=rngs)
        self.l2 = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def _nnx_loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


NNX_STEP = """
loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
optimizer.update(model, grads)
"""


def _fresh_nnx():
    model = _Model(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def test_shard_trains_an_nnx_model_in_place_like_nnx_jit(tree_ns, compiles):
    x = jax.random.normal(jax.random.key(2), (16, 3))
    y = x.sum(axis=1, keepdims=True)
    model, optimizer = _fresh_nnx()
    tree_ns.push({"model": model, "optimizer": optimizer, "x": x, "y": y, "loss_fn": _nnx_loss})

    twin_model, twin_opt = _fresh_nnx()

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(_nnx_loss)(model, x, y)
        optimizer.update(model, grads)
        return loss

    counts = []
    for _ in range(3):
        cell(tree_ns, "shard", "--mesh data=8 --in x=data y=data --no-show", NNX_STEP)
        counts.append(compiles.count)
        twin_loss = step(twin_model, twin_opt, x, y)
    ns = tree_ns.user_ns
    assert ns["model"] is model and ns["optimizer"] is optimizer  # the user's very objects, updated
    assert int(optimizer.step[...]) == 3
    np.testing.assert_allclose(ns["loss"], twin_loss, rtol=1e-5)
    np.testing.assert_allclose(model.l1.kernel[...], twin_model.l1.kernel[...], rtol=1e-5, atol=1e-6)
    assert counts[-1] == counts[1], f"compiles after each run: {counts}"


def test_nnx_functional_split_merge_form(tree_ns):
    model = _Model(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x = jnp.ones((8, 3))
    tree_ns.push({"graphdef": graphdef, "state": state, "x": x})
    cell(tree_ns, "shard", "--mesh data=8 --in x=data --no-show",
         "m = nnx.merge(graphdef, state)\nout = m(x)\nstate = nnx.state(m)")
    twin = nnx.jit(lambda m, x: m(x))(nnx.merge(graphdef, state), x)
    np.testing.assert_allclose(tree_ns.user_ns["out"], twin, rtol=1e-6)
    assert type(tree_ns.user_ns["state"]) is type(state)  # an nnx.State comes back as an nnx.State


def test_pmap_refuses_an_nnx_object_changed_in_place(tree_ns):
    model, optimizer = _fresh_nnx()
    x = jnp.ones((8, 2, 3))
    tree_ns.push({"model": model, "optimizer": optimizer, "x": x, "y": jnp.ones((8, 2, 1)), "loss_fn": _nnx_loss})
    before = snapshot(tree_ns.user_ns)
    kernel = np.asarray(model.l1.kernel[...])
    with pytest.raises(UsageError, match="changes the Flax NNX object '(model|optimizer)' in place"):
        cell(tree_ns, "pmap", "--no-show --broadcast model optimizer", NNX_STEP)
    assert snapshot(tree_ns.user_ns) == before
    np.testing.assert_array_equal(model.l1.kernel[...], kernel)


# --- Flax Linen: nn.Partitioned params placed with nn.get_sharding ----------------------------------

def test_linen_partitioned_params_placed_with_get_sharding(tree_ns):
    import flax.linen as nn

    class Dense(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.with_partitioning(nn.initializers.ones, (None, "model")), (x.shape[-1], 8))
            return x @ w

    mesh = jax.make_mesh((8,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jnp.ones((4, 3))
    variables = Dense().init(jax.random.key(0), x)
    tree_ns.push({"variables": variables, "shardings": nn.get_sharding(variables, mesh), "mesh": mesh, "x": x,
                  "apply": Dense().apply})
    cell(tree_ns, "shard", "--in variables=@shardings --no-show", "y = apply(variables, x)")
    placed = tree_ns.user_ns["variables"]
    kernel = jax.tree.leaves(placed)[0]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert type(placed["params"]["w"]).__name__ == "Partitioned"  # the boxes stay
    np.testing.assert_allclose(tree_ns.user_ns["y"], Dense().apply(variables, x))


# --- %%shard_map and the plain helpers ------------------------------------------------------------

def test_shard_map_takes_a_dataclass_with_one_spec_for_every_leaf(tree_ns):
    p = Params(w=jnp.arange(16.0).reshape(8, 2), b=jnp.arange(8.0))
    tree_ns.push({"p": p})
    cell(tree_ns, "shard_map", "--mesh data=8 --in p=data --out q=data --no-show", "q = Params(w=p.w * 2, b=p.b + 1)")
    q = tree_ns.user_ns["q"]
    assert type(q) is Params
    np.testing.assert_allclose(q.w, p.w * 2)
    np.testing.assert_allclose(q.b, p.b + 1)


SHARD_MAP_STEP = """
state = {"w": state["w"] * 2,
         "norm": {"scale": lax.pmean(state["norm"]["scale"], ("data", "model")), "shift": state["norm"]["shift"] + 1},
         "steps": Params(w=state["steps"].w + 1, b=state["steps"].b * 3)}
"""


def shard_map_state(mesh):
    from jax.sharding import NamedSharding, PartitionSpec as P

    specs = {"w": P("data", "model"), "norm": {"scale": P(), "shift": P("model")}, "steps": P("data")}  # a prefix
    leaves = {"w": jnp.arange(64.0).reshape(8, 8), "norm": {"scale": jnp.arange(8.0), "shift": jnp.arange(8.0)},
              "steps": Params(w=jnp.arange(16.0).reshape(8, 2), b=jnp.arange(8.0))}
    placed = jax.tree.map(lambda v, s: jax.device_put(v, NamedSharding(mesh, s)), leaves,
                          jax.tree.broadcast(specs, leaves, is_leaf=lambda x: isinstance(x, P)),
                          is_leaf=lambda x: isinstance(x, P))
    return placed, specs


def test_shard_map_out_takes_a_pytree_of_specs_like_jax_shard_map(tree_ns):
    """`%%shard_map --out state=@state_specs` pins each output leaf's layout, as %%shard's --out does.
    Oracle: jax.jit(jax.shard_map(f, in_specs=(specs,), out_specs=specs)) on the same state, the same
    body written as a function: values and each leaf's sharding equal; in a plan, `_plan.abstract`."""
    from jax import lax

    import jaxpar_magic

    mesh = jaxpar_magic.make_mesh("data=4 model=2")
    state, specs = shard_map_state(mesh)
    tree_ns.push({"mesh": mesh, "state": state, "state_specs": specs, "jaxpar_magic": jaxpar_magic})
    cell(tree_ns, "shard_map", "--mesh mesh --in state=@state_specs --out state=@state_specs --no-show", SHARD_MAP_STEP)
    mine = tree_ns.user_ns["state"]

    def step(state):
        scope = {"state": state, "lax": lax, "Params": Params}
        exec(SHARD_MAP_STEP, scope)  # noqa: S102 - the cell's own text, as the oracle's body
        return scope["state"]

    twin = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(specs,), out_specs=specs))(state)
    assert jax.tree.structure(mine) == jax.tree.structure(twin)
    for got, want in zip(jax.tree.leaves(mine), jax.tree.leaves(twin)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want.sharding)
    tree_ns.push({"state": state})
    cell(tree_ns, "shard_map", "--plan --mesh mesh --in state=@state_specs --out state=@state_specs --no-show",
         SHARD_MAP_STEP)
    planned = tree_ns.user_ns["_plan"].abstract["state"]
    for got, want in zip(jax.tree.leaves(planned), jax.tree.leaves(twin)):
        assert got.sharding.is_equivalent_to(want.sharding, len(got.shape)), (got.sharding, want.sharding)


def test_shard_map_out_spec_tree_of_the_wrong_shape_is_a_usage_error(tree_ns):
    import jaxpar_magic

    mesh = jaxpar_magic.make_mesh("data=4 model=2")
    state, specs = shard_map_state(mesh)
    tree_ns.push({"mesh": mesh, "state": state, "state_specs": specs, "wrong": [jax.sharding.PartitionSpec()] * 2})
    before = snapshot(tree_ns.user_ns)
    with pytest.raises(UsageError, match=r"--out state: the specs' structure does not match what the cell assigns"):
        cell(tree_ns, "shard_map", "--mesh mesh --in state=@state_specs --out state=@wrong --no-show", SHARD_MAP_STEP)
    assert snapshot(tree_ns.user_ns) == before


def test_place_and_split_accept_pytrees_and_name_the_leaf(tree_ns):
    import jaxpar_magic

    p = Params(w=jnp.ones((8, 3)), b=jnp.zeros(8))
    split = jaxpar_magic.split(p)
    assert type(split) is Params and len(split.w.sharding.device_set) == 8
    with pytest.raises(UsageError, match=r"value\.w.*9 elements"):
        jaxpar_magic.split(Params(w=jnp.ones((9, 3)), b=jnp.zeros(8)))


# --- --plan and --as-code ------------------------------------------------------------------------

def test_plan_takes_nnx_eval_shape_state_with_exact_argument_bytes(tree_ns):
    abstract = nnx.eval_shape(lambda: _Model(nnx.Rngs(0)))
    state = nnx.state(abstract)
    tree_ns.push({"state": state, "x": jax.ShapeDtypeStruct((64, 3), jnp.float32)})
    source = "y = jax.nn.relu(x @ state['l1']['kernel'] + state['l1']['bias']) @ state['l2']['kernel']"
    cell(tree_ns, "shard", "--mesh data=8 --in x=data state=P() --plan --no-show", source)
    from jaxpar_magic.stages.plan.plan_cell import plan_cell

    plan = plan_cell(source, tree_ns.user_ns, magic="shard", mesh="data=8",
                     in_specs={"x": ("data",), "state": ()}, bind=False)
    per_device_x = 64 // 8 * 3 * 4
    read = [state["l1"]["kernel"], state["l1"]["bias"], state["l2"]["kernel"]]  # jit drops the unread l2 bias
    assert plan.argument_bytes == per_device_x + sum(int(np.prod(leaf.shape)) * 4 for leaf in read)
    assert isinstance(tree_ns.user_ns["y"], jax.ShapeDtypeStruct)


def test_as_code_round_trip_with_a_dataclass_input(tree_ns):
    p = Params(w=jnp.arange(24.0).reshape(8, 3), b=jnp.arange(8.0))
    tree_ns.push({"p": p})
    code = cell(tree_ns, "pmap", "--as-code", "y = p.w.sum() + p.b")
    if code is None:  # printed, not returned
        from IPython.utils.capture import capture_output

        with capture_output() as captured:
            cell(tree_ns, "pmap", "--as-code", "y = p.w.sum() + p.b")
        code = captured.stdout
    scope = {"Params": Params, "p": p}
    exec(compile(code, "<as-code>", "exec"), scope)
    np.testing.assert_allclose(scope["y"], jax.pmap(lambda p: p.w.sum() + p.b)(p))


# --- Flax stays optional -------------------------------------------------------------------------

def test_the_package_never_imports_flax_unless_the_user_did():
    result = run_python("""
        import sys
        import jax
        jax.config.update('jax_num_cpu_devices', 8)
        import jax.numpy as jnp
        import jaxpar_magic
        ns = {'p': {'w': jnp.ones((8, 2))}, 'jnp': jnp}
        jaxpar_magic.pmap_cell("y = p['w'] * 2", ns)
        jaxpar_magic.shard_cell("z = p['w'].sum()", ns, mesh='data=8', in_specs={'p': ('data',)})
        print('flax' in sys.modules, 'equinox' in sys.modules, 'optax' in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"]


# --- --collectives names what each call moves --------------------------------------------------------

def test_collective_cards_name_the_leaf_path(tree_ns):
    from IPython.utils.capture import capture_output

    from shell_helpers import shown_widgets

    tree_ns.push({"params": {"w1": jnp.ones((8, 3, 2)), "w2": jnp.ones((8, 2))}, "x": jnp.arange(8.0)})
    with capture_output() as shown:
        cell(tree_ns, "pmap", "--collectives --no-show",
             "grads = jax.tree.map(lambda p: p * 2, params)\ngrads = lax.pmean(grads, 'i')\ntotal = lax.psum(x, 'i')")
    views = [w for w in shown_widgets(shown) if type(w).__name__ == "CollectivesView"]
    cards = views[0].state["cards"]
    assert [(c["op"], c["value"]) for c in cards] == [("pmean", "grads['w1']"), ("pmean", "grads['w2']"),
                                                      ("psum", "total")]
    assert "pmean grads['w1']" in views[0].to_text() and "grads[&#x27;w1&#x27;]" in views[0].to_html()


def test_a_leaf_that_can_be_neither_traced_nor_static_is_named(tree_ns):
    tree_ns.push({"cfg": {"w": jnp.ones(8), "names": np.array(["a", "b"])}})
    before = snapshot(tree_ns.user_ns)
    for magic, line in (("pmap", "--no-show"), ("shard", "--mesh data=8 --no-show"),
                        ("shard_map", "--mesh data=8 --no-show")):
        with pytest.raises(UsageError, match=r"`cfg\['names'\]` is a NumPy array of <U1 .*line 1 of the cell"):
            cell(tree_ns, magic, line, "y = cfg['w'].sum()")
    assert snapshot(tree_ns.user_ns) == before


def test_as_code_of_a_shard_cell_with_a_dataclass_runs_alone(tree_ns):
    from IPython.utils.capture import capture_output

    p = Params(w=jnp.arange(64.0).reshape(8, 8), b=jnp.ones(8))
    tree_ns.push({"p": p, "x": jnp.ones((8, 8))})
    with capture_output() as captured:
        cell(tree_ns, "shard", "--mesh data=8 --in p=data --as-code", "y = x @ p.w + p.b")
    scope = {"Params": Params, "p": p, "x": jnp.ones((8, 8))}
    exec(compile(captured.stdout, "<as-code>", "exec"), scope)
    np.testing.assert_allclose(scope["y"], jnp.ones((8, 8)) @ p.w + p.b)
    assert scope["p"].w.sharding.spec == jax.sharding.PartitionSpec("data")


def test_as_code_writes_nnx_and_equinox_inputs_the_librarys_way(tree_ns):
    """(Round trips of these snippets: tests/test_as_code_libraries.py.)"""
    from IPython.utils.capture import capture_output

    tree_ns.push({"model": _Model(nnx.Rngs(0)), "mlp": eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0)),
                  "x": jnp.ones((8, 3)), "xs": jnp.ones((8, 2))})
    with capture_output() as captured:
        cell(tree_ns, "shard", "--mesh data=8 --as-code", "y = model(x)")
    assert "@nnx.jit" in captured.stdout
    with capture_output() as captured:
        cell(tree_ns, "pmap", "--broadcast mlp --as-code", "y = mlp(xs)")
    assert "eqx.partition(mlp, eqx.is_array)" in captured.stdout
