"""`%%shard --in` naming one leaf of a pytree by its path (`--in params=None "params['w1']=P(None,'model')"`),
and `--mesh` built inline with `%mesh`'s options (`--axis-types`, `--devices`, `--abstract`): lines that
need nothing bound first (the explorer's lines are such lines). The oracle is plain JAX: the same
NamedShardings put with `jax.device_put`, the same function under `jax.jit`, and the same layout given
as a pytree of specs (`@specs`)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from shell_helpers import snapshot

STEP = "h = jnp.tanh(x @ params['w1'])\ny = h @ params['layers'][1]['w'] + params['b']\n"


def step(x, params):
    h = jnp.tanh(x @ params["w1"])
    return h, h @ params["layers"][1]["w"] + params["b"]


@pytest.fixture
def cell(jx):
    rng = np.random.default_rng(0)
    with capture_output():
        jx.run_line_magic("mesh", "data=4 model=2 --axis-types auto --no-show")
    jx.push({"x": jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
             "params": {"w1": jnp.asarray(rng.standard_normal((32, 64)), jnp.float32),
                        "layers": [{"w": jnp.ones((64, 8))}, {"w": jnp.asarray(rng.standard_normal((64, 8)))}],
                        "b": jnp.zeros((8,))}})
    return jx


def shard(ip, line: str, source: str = STEP):
    with capture_output():
        ip.run_cell_magic("shard", line + " --no-show", source)


@pytest.mark.parametrize("words, expected", [
    # one leaf by its path, quoted as in Python; the other leaves as they are (not placed: one device)
    ("x=data,None \"params['w1']=P(None,'model')\"", {"['w1']": P(None, "model")}),
    # the shell strips the quotes: `params[w1]` reads the same
    ("x=data,None params=None params[w1]=None,model", {"['w1']": P(None, "model"), "['b']": P(None),
                                                        "['layers'][0]['w']": P(None, None),
                                                        "['layers'][1]['w']": P(None, None)}),
    # a subtree by its path, and a longer path inside it winning over it, whatever the order
    ("x=data,None \"params['layers'][1]['w']=P('model',None)\" \"params['layers']=P(None,'model')\"",
     {"['layers'][0]['w']": P(None, "model"), "['layers'][1]['w']": P("model", None)}),
    ("x=data,None params=data,None params['b']=None", {"['w1']": P("data", None), "['b']": P(None),
                                                        "['layers'][0]['w']": P("data", None),
                                                        "['layers'][1]['w']": P("data", None)}),
])
def test_a_leaf_by_its_path_is_placed_as_plain_jax_places_it(cell, words, expected):
    """The oracle: each named leaf put with jax.device_put(NamedSharding(mesh, spec)), the rest left alone,
    and jax.jit of the same step: the outputs, and every bound leaf's layout, equal."""
    mesh = cell.user_ns["mesh"]
    x, params = cell.user_ns["x"], cell.user_ns["params"]
    shard(cell, f"--in {words}")
    bound = cell.user_ns["params"]
    for path, leaf in jax.tree_util.tree_flatten_with_path(bound)[0]:
        where = jax.tree_util.keystr(path)
        if where in expected:
            assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, expected[where]), leaf.ndim), where
        else:  # not named: as it was (one device, unplaced)
            original = dict((jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_flatten_with_path(params)[0])
            assert leaf is original[where], where
    placed = jax.tree_util.tree_map_with_path(
        lambda path, leaf: jax.device_put(leaf, NamedSharding(mesh, expected[jax.tree_util.keystr(path)]))
        if jax.tree_util.keystr(path) in expected else leaf, params)
    with jax.set_mesh(mesh):
        h, y = jax.jit(step)(jax.device_put(x, NamedSharding(mesh, P("data", None))), placed)
    np.testing.assert_allclose(cell.user_ns["y"], y, rtol=1e-6)
    np.testing.assert_allclose(cell.user_ns["h"], h, rtol=1e-6)
    assert cell.user_ns["y"].sharding.is_equivalent_to(y.sharding, 2)


def test_a_plan_by_paths_equals_the_plan_by_a_tree_of_specs(cell):
    """The same layout as leaf paths and as `@specs` (one PartitionSpec per leaf): the same plan."""
    cell.push({"specs": {"w1": P(None, "model"), "layers": [{"w": P()}, {"w": P("model", None)}], "b": P()}})
    shard(cell, "--plan --in x=data,None params=@specs")
    by_tree = cell.user_ns["_plan"]
    shard(cell, "--plan --in x=data,None params=None params[w1]=None,model \"params['layers'][1]['w']=model,None\"")
    by_path = cell.user_ns["_plan"]
    assert by_path.total_bytes == by_tree.total_bytes and by_path.flops == by_tree.flops
    assert [(c.op, c.bytes, c.count) for c in by_path.collectives] == [(c.op, c.bytes, c.count)
                                                                      for c in by_tree.collectives]


@pytest.mark.parametrize("words, said", [
    ("params[w3]=data", r"^--in params\[w3\]: 'params' has no array leaf at \[w3\] \(its leaves: params\['b'\], "),
    ("x[0]=data", r"^--in x\[0\]: 'x' has no array leaf at \[0\] \('x' is one array, not a pytree; give `x=SPEC`\)"),
    ("params[w1]=data \"params['w1']=None\"", r"^--in: \"params\['w1'\]\" appears twice; give each name one spec\.$"),
    ("params[w1]=@specs", r"^--in params\[w1\]=@specs: a leaf path takes one spec; give `@specs` to the whole input"),
    ("params[w1=data", r"^--in: cannot read 'params\[w1=data'; write NAME=SPEC, .* one leaf of a pytree by its path"),
    ("params[w1]=P(None,'nope')", r"'nope'"),
    ("params[w1]=model,data,None", r"^--in params\['w1'\]: "),
])
def test_a_wrong_path_is_one_usage_error_and_changes_nothing(cell, words, said):
    before = snapshot(cell.user_ns)
    with pytest.raises(UsageError, match=said) as err:
        shard(cell, f"--in {words}")
    assert "\n" not in str(err.value) and snapshot(cell.user_ns) == before


def test_as_code_says_it_writes_one_spec_per_input(cell):
    with pytest.raises(UsageError, match=re.escape("--as-code: params=P(None) params[w1]=P(None,'model') gives one "
                                                   "spec per leaf; --as-code writes one spec per input.")):
        shard(cell, "--as-code --in x=data,None params=None params[w1]=None,model")


def test_out_takes_no_leaf_path(cell):
    with pytest.raises(UsageError, match=r"^--out: cannot read 'y\[0\]=data'"):
        shard(cell, "--in x=data,None --out y[0]=data")


# --- --mesh inline with %mesh's options ------------------------------------------------------------

@pytest.mark.parametrize("words, devices, types", [
    ("data=4,model=2 --axis-types auto", list(range(8)), (AxisType.Auto, AxisType.Auto)),
    ("data=4,model=2", list(range(8)), (AxisType.Explicit, AxisType.Explicit)),  # JAX 0.10's default
    ("data=2,model=2 --devices 4 --axis-types auto", [0, 1, 2, 3], (AxisType.Auto, AxisType.Auto)),
    ("data=2,model=2 --devices 6 4 2 0 --axis-types explicit", [6, 4, 2, 0], (AxisType.Explicit,) * 2),
])
def test_an_inline_mesh_takes_the_options_of_mesh(cell, words, devices, types):
    """The oracle: `%mesh` with the same words builds the same mesh; the cell runs on it as plain JAX would."""
    shard(cell, f"--mesh {words} --in x=data,None params=None")
    y = cell.user_ns["y"]
    mesh = y.sharding.mesh
    assert [d.id for d in mesh.devices.flat] == devices and mesh.axis_types == types
    with capture_output():
        cell.run_line_magic("mesh", words.replace(",", " ", 1).replace(",", " ") + " --name same --no-show")
    assert cell.user_ns["same"] == mesh
    assert cell.user_ns["x"].sharding == NamedSharding(mesh, P("data", None))


def test_an_inline_abstract_mesh_is_planned_not_run(cell):
    shape = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    cell.push({"xs": shape})
    with pytest.raises(UsageError, match=r"^%%shard --abstract: an AbstractMesh has no devices to run the cell on; "
                                         r"add --plan"):
        shard(cell, "--mesh data=4,model=2 --abstract --in xs=data,None", "z = xs * 2")
    with pytest.raises(UsageError, match="A plan compiles for devices"):  # XLA:CPU: it needs devices
        shard(cell, "--plan --mesh data=4,model=2 --abstract --in xs=data,None", "z = xs * 2")


@pytest.mark.parametrize("line, said", [
    ("--mesh mesh --axis-types auto", "--axis-types: it builds a mesh given inline, as %mesh does (`--mesh "
                                      "data=4,model=2 --axis-types ...`); `--mesh mesh` names a mesh built already"),
    ("--devices 4", "--devices: it builds a mesh given inline, as %mesh does (`--mesh data=4,model=2 --devices ...`); "
                    "this line has no --mesh."),
    ("--mesh mesh --abstract", "--abstract: it builds a mesh given inline, as %mesh does (`--mesh data=4,model=2 "
                               "--abstract`)"),
    ("--mesh data=4,model=2 --devices 3", "the mesh data=4,model=2 has 8 devices but --devices chose 3"),
    ("--mesh data=4,model=2 --axis-types sideways", "--axis-types: 'sideways' is not an axis type; use auto, explicit "
                                                     "or manual (one for every axis, or one per axis"),
    ("--mesh data=4,model=2 --axis-types explicit,auto,auto", "--axis-types explicit,auto,auto: 3 types for a mesh of "
                                                              "2 axes"),
])
def test_mesh_options_without_an_inline_mesh_are_usage_errors(cell, line, said):
    before = snapshot(cell.user_ns)
    with pytest.raises(UsageError, match=re.escape(said)):
        shard(cell, f"{line} --in x=data,None")
    assert snapshot(cell.user_ns) == before
