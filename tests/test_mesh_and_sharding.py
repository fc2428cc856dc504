"""`%mesh` and `%sharding`: building meshes over the 8 simulated devices, and showing where every
piece of an array lives (real arrays, %%pmap outputs, abstract plans for 4,096 devices).

The views are checked through their state (what the widget is drawn from): `summaries.mesh_state`
and `summaries.sharding_state`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxpar_magic
from shell_helpers import N_DEVICES, pmap, shown_widgets, snapshot
from jaxpar_magic.views.summaries import expand_sharding_tiles, mesh_state, sharding_state
from jaxpar_magic.views import sharding as sharding_view


def shown(captured, kind: str) -> list[dict]:
    """States of the views of one kind ('MeshView', 'ShardingView', ...) a cell displayed."""
    return [w.state for w in shown_widgets(captured) if type(w).__name__ == kind]


def mesh_magic(ip, line: str) -> list[dict]:
    with capture_output() as captured:
        assert ip.run_line_magic("mesh", line) is None
    return shown(captured, "MeshView")


def sharding_magic(ip, line: str) -> list[dict]:
    with capture_output() as captured:
        assert ip.run_line_magic("sharding", line) is None
    return shown(captured, "ShardingView")


def state_json(state: dict) -> str:
    return json.dumps(state, separators=(",", ":"))


# --- %mesh: building and binding -----------------------------------------------------------------

def test_mesh_1d_binds_mesh_and_shows_it(ip):
    (state,) = mesh_magic(ip, "data=8")
    mesh = ip.user_ns["mesh"]
    assert isinstance(mesh, jax.sharding.Mesh)
    assert dict(mesh.shape) == {"data": 8}
    assert state["name"] == "mesh"
    assert state["axes"] == [{"name": "data", "size": 8}]
    assert state["device_ids"] == [d.id for d in jax.devices()]
    assert state["abstract"] is False
    assert state["kinds"] == ["cpu"]


def test_mesh_2d_lays_devices_out_row_major(ip):
    (state,) = mesh_magic(ip, "data=4 model=2")
    mesh = ip.user_ns["mesh"]
    assert mesh.axis_names == ("data", "model")
    assert mesh.devices.shape == (4, 2)
    assert state["axes"] == [{"name": "data", "size": 4}, {"name": "model", "size": 2}]
    assert state["device_ids"] == [int(d.id) for d in mesh.devices.flat]
    # Row-major: the device at (data=1, model=0) is the third in the list.
    assert state["device_ids"][1 * 2 + 0] == mesh.devices[1, 0].id


def test_mesh_3d(ip):
    (state,) = mesh_magic(ip, "x=2 y=2 z=2 --name cube")
    cube = ip.user_ns["cube"]
    assert "mesh" not in ip.user_ns  # --name binds that name only
    assert cube.devices.shape == (2, 2, 2)
    assert state["name"] == "cube"
    assert [a["name"] for a in state["axes"]] == ["x", "y", "z"]
    assert sorted(state["device_ids"]) == list(range(N_DEVICES))


def test_mesh_with_commas_is_the_same_mesh(ip):
    mesh_magic(ip, "data=4,model=2 --name a")
    mesh_magic(ip, "data=4 model=2 --name b")
    assert ip.user_ns["a"] == ip.user_ns["b"]


def test_mesh_no_show_binds_without_a_view(ip):
    with capture_output() as captured:
        ip.run_line_magic("mesh", "data=8 --no-show")
    assert captured.outputs == [] and captured.stdout == ""
    assert dict(ip.user_ns["mesh"].shape) == {"data": 8}


def test_mesh_devices_in_the_order_given(ip):
    order = [7, 6, 5, 4, 3, 2, 1, 0]
    (state,) = mesh_magic(ip, "data=8 --devices " + " ".join(map(str, order)))
    assert [d.id for d in ip.user_ns["mesh"].devices.flat] == order
    assert state["device_ids"] == order


def test_mesh_on_a_subset_of_devices(ip):
    (state,) = mesh_magic(ip, "data=2 model=2 --devices 4")
    assert state["device_ids"] == [0, 1, 2, 3]


def test_mesh_axis_types_default_to_what_jax_make_mesh_gives(ip):
    """%mesh data=4 model=2 is jax.make_mesh((4, 2), ('data', 'model')): Explicit axes on JAX 0.10."""
    (state,) = mesh_magic(ip, "data=4 model=2")
    plain = jax.make_mesh((4, 2), ("data", "model"))
    assert ip.user_ns["mesh"] == plain
    assert plain.axis_types == (AxisType.Explicit, AxisType.Explicit)  # what this version of JAX does
    assert state["axis_types"] == ["Explicit", "Explicit"]


def test_mesh_axis_types_auto_on_request(ip):
    (state,) = mesh_magic(ip, "data=4 model=2 --axis-types auto")
    assert ip.user_ns["mesh"].axis_types == (AxisType.Auto, AxisType.Auto)
    assert state["axis_types"] == ["Auto", "Auto"]


def test_the_mesh_view_and_text_say_the_axis_types(ip):
    from jaxpar_magic.views.mesh import to_html, to_text

    (state,) = mesh_magic(ip, "data=4 model=2")
    assert "Explicit axes" in to_text(state) and "Explicit axes" in to_html(state)
    (state,) = mesh_magic(ip, "data=4 model=2 --axis-types auto")
    assert "Auto axes" in to_text(state) and "Auto axes" in to_html(state)
    mixed = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    state = jaxpar_magic.show_mesh(mixed).state
    assert "data: Explicit, model: Auto" in to_text(state)


def test_mesh_axis_types_explicit(ip):
    (state,) = mesh_magic(ip, "data=4 model=2 --axis-types explicit")
    assert ip.user_ns["mesh"].axis_types == (AxisType.Explicit, AxisType.Explicit)
    assert state["axis_types"] == ["Explicit", "Explicit"]


def test_mesh_axis_types_one_per_axis_equal_jax_make_mesh(ip):
    """`--axis-types explicit,auto`: JAX's meshes may mix axis types, so a line can spell one per axis."""
    (state,) = mesh_magic(ip, "data=4 model=2 --axis-types explicit,auto")
    plain = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    assert ip.user_ns["mesh"] == plain and state["axis_types"] == ["Explicit", "Auto"]
    for wrong, said in (("explicit,auto,auto", "3 types for a mesh of 2 axes"), ("explicit,sideways", "'sideways'")):
        with pytest.raises(UsageError, match=said):
            ip.run_line_magic("mesh", f"data=4 model=2 --axis-types {wrong} --name other")
        assert "other" not in ip.user_ns


def test_the_seeds_vmap_dot_runs_on_the_default_mesh(jx):
    """Unannotated code partitions on the default (Explicit) mesh: the seed's listing, unchanged."""
    mesh_magic(jx, "data=8")
    jx.run_cell("def dot(v1, v2):\n    return jnp.vdot(v1, v2)\n")
    v = jnp.arange(16 * 3, dtype=jnp.float32).reshape(16, 3)
    mesh = jx.user_ns["mesh"]
    placed = jax.device_put(v, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        d = jax.jit(jax.vmap(jx.user_ns["dot"]))(placed, placed)
    np.testing.assert_allclose(np.asarray(d), np.sum(np.asarray(v) ** 2, axis=1))
    assert d.sharding.spec == P("data")


def test_mesh_name_shows_an_existing_mesh(ip):
    mesh_magic(ip, "data=4 model=2 --name grid --no-show")
    before = snapshot(ip.user_ns)
    (state,) = mesh_magic(ip, "grid")
    assert state["name"] == "grid"
    assert state["axes"] == [{"name": "data", "size": 4}, {"name": "model", "size": 2}]
    assert snapshot(ip.user_ns) == before  # showing binds nothing


def test_bare_mesh_shows_the_mesh_called_mesh(ip):
    mesh_magic(ip, "data=8 --no-show")
    (state,) = mesh_magic(ip, "")
    assert state["name"] == "mesh"


def test_mesh_twin_is_the_same_mesh(ip):
    mesh_magic(ip, "data=4 model=2 --no-show")
    twin = jaxpar_magic.make_mesh("data=4,model=2")
    assert twin == ip.user_ns["mesh"]
    assert jaxpar_magic.show_mesh(twin, "mesh").state == mesh_state(ip.user_ns["mesh"], "mesh")


# --- %mesh: mistakes -----------------------------------------------------------------------------

def mesh_error(ip, line: str) -> str:
    before = snapshot(ip.user_ns)
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("mesh", line)
    assert snapshot(ip.user_ns) == before
    return str(err.value)


def test_mesh_smaller_than_the_devices_names_both_numbers(ip):
    # jax.make_mesh((4,), ...) on 8 devices quietly uses the first four; we refuse.
    message = mesh_error(ip, "data=4")
    assert "4 devices" in message and "has 8" in message
    assert "--devices 4" in message


def test_mesh_larger_than_the_devices_names_both_numbers(ip):
    message = mesh_error(ip, "data=4 model=4")
    assert "16 devices" in message and "has 8" in message


def test_mesh_device_count_disagreeing_with_devices(ip):
    message = mesh_error(ip, "data=4 --devices 0 1 2")
    assert "4 devices" in message and "chose 3" in message


def test_mesh_duplicate_device_ids(ip):
    message = mesh_error(ip, "data=4 --devices 0 1 1 3")
    assert "listed twice" in message


def test_mesh_unknown_device_id(ip):
    assert "no device with id 9" in mesh_error(ip, "data=2 --devices 0 9")


@pytest.mark.parametrize("line", ["data=0", "data=-2", "data=x", "data=4 model", "data=2 data=4"])
def test_mesh_bad_syntax(ip, line):
    message = mesh_error(ip, line)
    assert "%mesh" in message and ("NAME=SIZE" in message or "appears twice" in message)


def test_mesh_a_word_without_size_is_not_taken_for_a_shape(ip):
    # `data4` could be a typo of data=4 or the name of a mesh to show; either way it is an error that
    # says how to build one.
    message = mesh_error(ip, "data4")
    assert "'data4'" in message and "%mesh data=4 model=2" in message


def test_mesh_unknown_axis_type(ip):
    with pytest.raises(UsageError):
        ip.run_line_magic("mesh", "data=8 --axis-types sideways")


def test_showing_a_name_that_is_not_a_mesh(ip):
    ip.user_ns["notamesh"] = 3
    assert "no mesh called 'notamesh'" in mesh_error(ip, "notamesh")


# --- abstract meshes ----------------------------------------------------------------------------

# A 16x16x16 pod's mesh state lists 4,096 positions; each id is at most 4 digits plus a comma in
# compact JSON (5 bytes), so the ids take at most 20,480 bytes; names, sizes and flags add well
# under 1 KiB. Twice the ids would mean something per-device crept in besides the id.
POD_STATE_BOUND = 4096 * 5 + 1024


def test_abstract_4096_device_mesh(ip):
    (state,) = mesh_magic(ip, "--abstract --name pod x=16 y=16 z=16")
    pod = ip.user_ns["pod"]
    assert isinstance(pod, jax.sharding.AbstractMesh)
    assert dict(pod.shape) == {"x": 16, "y": 16, "z": 16}
    assert state["abstract"] is True
    assert len(state["device_ids"]) == 4096
    assert state["device_ids"] == list(range(4096))
    assert state["kinds"] == []
    assert len(state_json(state)) <= POD_STATE_BOUND
    # More positions than this process has devices: only possible because nothing is allocated.
    assert len(jax.devices()) == N_DEVICES


def test_an_abstract_mesh_too_large_to_draw_is_a_usage_error(ip):
    """A view lists every position of a mesh: 10**21 positions raised Python's OverflowError from
    `range` (hypothesis found it in test_fuzz_lines), and 10**9 would have built a 10**9-long list.
    The largest allowed size still works; one more position is refused, with the namespace as it was."""
    before = snapshot(ip.user_ns)
    for line in ("--abstract --name huge x=999999999999999999999", "--abstract --name huge x=65537"):
        with pytest.raises(UsageError, match=r"positions; an abstract mesh here has at most 65,536"):
            ip.run_line_magic("mesh", line)
        assert snapshot(ip.user_ns) == before
    mesh_magic(ip, "--abstract --name big x=256 y=256 --no-show")
    assert dict(ip.user_ns["big"].shape) == {"x": 256, "y": 256}


def test_abstract_mesh_ignores_the_device_count(ip):
    mesh_magic(ip, "--abstract --name tiny x=2 --no-show")
    assert isinstance(ip.user_ns["tiny"], jax.sharding.AbstractMesh)


# --- %sharding ----------------------------------------------------------------------------------

@pytest.fixture
def grid(jx):
    """A data=4 x model=2 mesh bound as `mesh`."""
    mesh_magic(jx, "data=4 model=2 --no-show")
    return jx.user_ns["mesh"]


def put(mesh, shape, spec):
    x = jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape)
    return jax.device_put(x, NamedSharding(mesh, spec))


def test_sharding_1d(jx, grid):
    jx.user_ns["v"] = put(grid, (16,), P(("data", "model")))
    (state,) = sharding_magic(jx, "v")
    assert state["name"] == "v" and state["shape"] == [16] and state["dtype"] == "float32"
    assert state["spec"] == [["data", "model"]]
    assert state["grid"] == [8]
    tiles = expand_sharding_tiles(state)
    assert [t["index"] for t in tiles] == [[[2 * i, 2 * i + 2]] for i in range(8)]
    assert all(len(t["devices"]) == 1 for t in tiles)
    assert state["replicated_over"] == []
    assert state["total_devices"] == 8 and state["nbytes"] == 64 and state["abstract"] is False


def test_sharding_2d(jx, grid):
    jx.user_ns["w"] = put(grid, (8, 6), P("data", "model"))
    (state,) = sharding_magic(jx, "w")
    assert state["grid"] == [4, 2]
    assert state["mesh_axes"] == [{"name": "data", "size": 4}, {"name": "model", "size": 2}]
    tiles = expand_sharding_tiles(state)
    assert {tuple(t["shard_shape"]) for t in tiles} == {(2, 3)}
    by_block = {tuple(t["block"]): t["devices"] for t in tiles}
    assert by_block[(1, 0)] == [grid.devices[1, 0].id] and by_block[(3, 1)] == [grid.devices[3, 1].id]


def test_sharding_3d(jx):
    mesh_magic(jx, "x=2 y=2 z=2 --no-show")
    jx.user_ns["t"] = put(jx.user_ns["mesh"], (4, 6, 8), P("x", "y", "z"))
    (state,) = sharding_magic(jx, "t")
    assert state["grid"] == [2, 2, 2]
    tiles = expand_sharding_tiles(state)
    assert len(tiles) == 8
    assert {tuple(t["shard_shape"]) for t in tiles} == {(2, 3, 4)}


def test_sharding_replicated_lists_every_device(jx, grid):
    jx.user_ns["r"] = put(grid, (4, 4), P())
    (state,) = sharding_magic(jx, "r")
    (tile,) = expand_sharding_tiles(state)
    assert sorted(tile["devices"]) == list(range(8))
    assert tile["index"] == [[0, 4], [0, 4]]
    assert state["replicated_over"] == ["data", "model"]
    assert state["grid"] == [1, 1]


def test_sharding_partially_replicated_over_an_unused_axis(jx, grid):
    jx.user_ns["p"] = put(grid, (8, 4), P("data", None))
    (state,) = sharding_magic(jx, "p")
    assert state["replicated_over"] == ["model"]
    assert state["grid"] == [4, 1]
    for tile in expand_sharding_tiles(state):
        row = tile["block"][0]
        assert tile["devices"] == [int(d.id) for d in grid.devices[row]]  # both model positions


def test_sharding_of_several_arrays_in_one_line(jx, grid):
    jx.user_ns["a"] = put(grid, (8,), P("data"))
    jx.user_ns["b"] = put(grid, (8,), P())
    states = sharding_magic(jx, "a b")
    assert [s["name"] for s in states] == ["a", "b"]


def test_sharding_of_pmap_outputs(jx):
    jx.user_ns["x"] = jnp.arange(16.0).reshape(8, 2)
    with capture_output():
        pmap(jx, "--no-show", "y = x * 2\n")
    (state,) = sharding_magic(jx, "y")
    assert state["shape"] == [8, 2]
    assert state["grid"] == [8, 1]
    tiles = expand_sharding_tiles(state)
    assert [t["devices"] for t in tiles] == [[i] for i in range(8)]
    assert [t["index"][0] for t in tiles] == [[i, i + 1] for i in range(8)]


def test_sharding_of_a_plain_jax_array_is_one_device(jx):
    jx.user_ns["z"] = jnp.ones((3, 5))
    (state,) = sharding_magic(jx, "z")
    (tile,) = expand_sharding_tiles(state)
    assert tile["devices"] == [jx.user_ns["z"].devices().pop().id]
    assert tile["shard_shape"] == [3, 5]
    assert state["total_devices"] == 1 and state["spec"] == [] and state["abstract"] is False


def test_sharding_of_a_numpy_array_is_not_abstract(jx):
    # A NumPy array lives in host memory: it has data, unlike a ShapeDtypeStruct.
    jx.user_ns["h"] = np.ones((3, 4))
    (state,) = sharding_magic(jx, "h")
    assert state["total_devices"] == 0
    assert state["nbytes"] == 96
    assert state["abstract"] is False


def test_sharding_twin(jx, grid):
    w = put(grid, (8, 6), P("data", "model"))
    assert jaxpar_magic.show_sharding(w, "w").state == sharding_state("w", w)


def test_sharding_undefined_name(jx):
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError, match="'nothing' is not defined"):
        jx.run_line_magic("sharding", "nothing")
    assert snapshot(jx.user_ns) == before


def test_sharding_non_array(jx):
    jx.user_ns["n"] = 3
    jx.user_ns["ok"] = jnp.ones(2)
    with capture_output() as captured, pytest.raises(UsageError, match=r"'n' is a int.*shows arrays"):
        jx.run_line_magic("sharding", "ok n")
    assert captured.outputs == []  # checked before anything is shown


# --- abstract plans ---------------------------------------------------------------------------

def test_plan_a_terabyte_array_on_4096_abstract_devices(jx):
    mesh_magic(jx, "--abstract --name pod x=16 y=16 z=16 --no-show")
    pod = jx.user_ns["pod"]
    big = jaxpar_magic.plan((2**20, 2**20), jnp.float32, pod, P(("x", "y"), "z"))
    assert isinstance(big, jax.ShapeDtypeStruct) and not isinstance(big, jax.Array)
    jx.user_ns["big"] = big
    (state,) = sharding_magic(jx, "big")
    assert state["abstract"] is True
    assert state["total_devices"] == 4096
    tiles = expand_sharding_tiles(state)
    assert len(tiles) == 4096
    assert state["grid"] == [256, 16]
    assert {tuple(t["shard_shape"]) for t in tiles} == {(2**12, 2**16)}
    assert sorted(d for t in tiles for d in t["devices"]) == list(range(4096))
    assert state["nbytes"] == 2**40 * 4  # what it would take; nothing was allocated


def test_plan_checks_the_spec(jx):
    pod = jaxpar_magic.make_mesh("x=16,y=16,z=16", abstract=True)
    with pytest.raises(UsageError, match="does not divide"):
        jaxpar_magic.plan((100, 64), jnp.float32, pod, ("x",))
    with pytest.raises(UsageError, match="'w' is not an axis"):
        jaxpar_magic.plan((64,), jnp.float32, pod, ("w",))


# How big the state of a plan is, by number of shards and number of elements. The state must grow
# with the shards (one tile each) and not at all with the elements: a 10^12-element array's state is
# the 10^3-element one with longer numbers.
DIGITS = re.compile(r"\d+")


def plan_state(mesh, shape, spec) -> str:
    return state_json(sharding_state("a", jaxpar_magic.plan(shape, jnp.float32, mesh, spec)))


def test_state_size_depends_on_shards_not_elements(jx):
    eight = jaxpar_magic.make_mesh("data=8")
    pod = jaxpar_magic.make_mesh("x=16,y=16,z=16", abstract=True)
    cases = {
        (8, "small"): plan_state(eight, (8, 125), ("data",)),  # 10^3 elements
        (8, "huge"): plan_state(eight, (10**6, 10**6), ("data",)),  # 10^12 elements
        (4096, "small"): plan_state(pod, (16, 256), ("x", ("y", "z"))),  # 4,096 elements
        (4096, "huge"): plan_state(pod, (2**4 * 5**6, 2**8 * 5**6), ("x", ("y", "z"))),  # 10^12 elements
    }
    for shards in (8, 4096):
        small, huge = cases[shards, "small"], cases[shards, "huge"]
        # Same structure, same number of fields: only the numbers' digits differ.
        assert DIGITS.sub("#", small) == DIGITS.sub("#", huge)
        numbers = len(DIGITS.findall(small))
        assert len(huge) - len(small) <= numbers * 12  # at most 12 more digits per number
    # Per shard: one block of a 2-D array with 1 device (its id in `blocks`, its share of the cut
    # points in `bounds`) stays under 128 bytes of compact JSON, even with 13-digit element counts;
    # the rest (axes, spec, flags) is under 1 KiB.
    for shards in (8, 4096):
        assert len(cases[shards, "huge"]) <= shards * 128 + 1024
    assert len(cases[4096, "small"]) > 100 * len(cases[8, "small"]) / 8  # it does grow with shards


# 4,096 shards in one state. What it costs, bounded from its form: `blocks` is 4,096 device ids of
# at most 4 digits (ids < 4,096) plus a comma each, under 5 * 4,096 = 20,480 bytes; `bounds` is
# sum(grid) + ndim cut points of at most 7 digits (2**20 = 1,048,576) plus a comma, under 8 bytes
# each (64 + 64 + 2 or 256 + 16 + 2 of them: under 2,200 bytes); names, axes, spec and flags under
# 1 KiB. So under 24 KB; 40,000 bytes leaves room for 5-digit ids. Before the compact form each
# block carried its index, shard shape and device list: about 420 KB for these two states.
STATE_LIMIT_4096 = 40_000


@pytest.mark.parametrize("mesh_line, spec, grid", [
    ("x=64,y=64", ("x", "y"), [64, 64]),
    ("x=16,y=16,z=16", (("x", "y"), "z"), [256, 16]),
])
def test_state_of_4096_shards_is_compact_and_loses_nothing(jx, mesh_line, spec, grid):
    from jaxpar_magic.cell.layout import named_tiles

    mesh = jaxpar_magic.make_mesh(mesh_line, abstract=True)
    shape = (2**20, 2**20)
    state = sharding_state("a", jaxpar_magic.plan(shape, jnp.float32, mesh, spec))
    size = len(state_json(state))
    assert state["grid"] == grid
    assert size < STATE_LIMIT_4096, size
    cut_points = sum(grid) + len(grid)
    assert size <= 5 * 4096 + 8 * cut_points + 1024, size
    # Lossless: decoding gives back every block's index, shard shape and devices.
    names = tuple(str(n) for n in mesh.axis_names)
    sizes = tuple(int(n) for n in mesh.shape.values())
    expected = [
        {"block": list(t.block), "index": [list(i) for i in t.index], "shard_shape": list(t.shard_shape),
         "devices": list(t.devices)}
        for t in named_tiles(shape, names, sizes, list(range(4096)), spec)
    ]
    assert expand_sharding_tiles(state) == expected
    assert state["bounds"][1] == [k * (2**20 // grid[1]) for k in range(grid[1] + 1)]
    assert state["blocks"] == list(range(4096))  # one device each: bare ids, row-major


def test_state_lists_replicas_and_caps_blocks(jx):
    pod = jaxpar_magic.make_mesh("x=64,y=64", abstract=True)
    rows = sharding_state("a", jaxpar_magic.plan((2**20, 8), jnp.float32, pod, ("x",)))
    assert rows["grid"] == [64, 1] and len(rows["blocks"]) == 64
    assert rows["blocks"][1] == list(range(64, 128))  # block 1: the 64 devices of x=1, every y
    everywhere = sharding_state("a", jaxpar_magic.plan((64, 64), jnp.float32, pod, ()))
    assert everywhere["blocks"] == [list(range(4096))] and everywhere["bounds"] == [[0, 64], [0, 64]]
    assert len(state_json(everywhere)) < STATE_LIMIT_4096


@dataclass(frozen=True)
class _Device:
    id: int


class _IndexMapSharding:
    """A stand-in for a sharding that only describes itself through devices_indices_map."""

    def __init__(self, index_map):
        self.index_map = {_Device(d): index for d, index in index_map.items()}
        self.device_set = set(self.index_map)

    def devices_indices_map(self, shape):
        return self.index_map


def test_state_of_a_layout_with_holes_and_of_an_irregular_one():
    s = slice
    # Two blocks on the diagonal of a 2x2 grid: the other two are on no device, and say so.
    holes = SimpleNamespace(shape=(4, 4), dtype=np.float32, sharding=_IndexMapSharding(
        {0: (s(0, 2), s(0, 2)), 1: (s(2, 4), s(2, 4))}))
    state = sharding_state("h", holes)
    assert state["grid"] == [2, 2] and state["bounds"] == [[0, 2, 4], [0, 2, 4]]
    assert state["blocks"] == [0, [], [], 1]
    assert [t["devices"] for t in expand_sharding_tiles(state)] == [[0], [], [], [1]]
    text = sharding_view.to_text(state)
    assert "block (0, 1) [0:2, 2:4] float32[2, 2] → no device" in text
    assert "4 distinct blocks on 2 devices" in text and "no device" in sharding_view.to_html(state)
    # Rows cut at different columns are no grid: an error, not a wrong picture. JAX's own shardings
    # (HloSharding tile assignments) always cut each dimension at the same points.
    irregular = SimpleNamespace(shape=(4, 4), dtype=np.float32, sharding=_IndexMapSharding(
        {0: (s(0, 2), s(0, 4)), 1: (s(2, 4), s(0, 1)), 2: (s(2, 4), s(1, 4))}))
    with pytest.raises(ValueError, match="not a grid of blocks"):
        sharding_state("i", irregular)


def test_expand_rejects_a_state_that_does_not_add_up():
    good = {"shape": [4], "grid": [2], "bounds": [[0, 2, 4]], "blocks": [0, [1, 2]]}
    assert expand_sharding_tiles(good) == [
        {"block": [0], "index": [[0, 2]], "shard_shape": [2], "devices": [0]},
        {"block": [1], "index": [[2, 4]], "shard_shape": [2], "devices": [1, 2]},
    ]
    with pytest.raises(ValueError, match="do not match grid"):
        expand_sharding_tiles({**good, "bounds": [[0, 4]]})
    with pytest.raises(ValueError, match="3 blocks for a grid of 2"):
        expand_sharding_tiles({**good, "blocks": [0, 1, 2]})


def test_static_html_of_a_4096_shard_3d_plan_stays_light():
    # 16 facets of 16x16 blocks: as <div>s this was ~800 KB in every exported notebook; the static
    # form draws one pixel per block past sharding_view.HTML_BLOCK_LIMIT blocks in all.
    pod = jax.sharding.AbstractMesh((16, 16, 16), ("x", "y", "z"), axis_types=(AxisType.Auto,) * 3)
    plan = jaxpar_magic.plan((4096, 4096, 4096), jnp.float32, pod, ("x", "y", "z"))
    html = sharding_view.to_html(sharding_state("plan", plan))
    assert len(html) < 64 * 1024
    assert html.count("<img") == 16  # one picture per facet, every block in it


def test_a_layout_on_no_device_says_where_it_is_instead_of_0_devices(jx):
    """%sharding of a ShapeDtypeStruct without a sharding, and of host data (issue 33 item 17): no
    "on 0 devices"."""
    jx.push({"sd": jax.ShapeDtypeStruct((8, 4), jnp.float32), "host": np.ones((8, 4))})
    for name, says in (("sd", "1 distinct block, not laid out on devices"),
                       ("host", "1 distinct block in host memory, on no device")):
        with capture_output() as shown:
            jx.run_line_magic("sharding", name)
        text = shown.outputs[0].data["text/plain"]
        assert says in text and "0 devices" not in text, text
