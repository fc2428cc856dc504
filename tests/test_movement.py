"""The movement data of the collective cards against what JAX really moves, and the ring steps
simulated until every contribution has arrived exactly once."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar_magic.stages.record.movement import MAX_DEVICES_DRAWN, axis_index_order, estimated_bytes, groups_of, movement, steps, transfers

FAST = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PURE = settings(max_examples=60, deadline=None)


# --- the ring, simulated -----------------------------------------------------------------------------

def simulate(buffers: dict, step_list: list[dict]) -> dict:
    """Apply steps to {device: [Counter of origins per block]}; each step reads the state before it."""
    for step in step_list:
        before = {d: [Counter(b) for b in blocks] for d, blocks in buffers.items()}
        for t in step["transfers"]:
            arriving = before[t["src"]][t["src_block"]]
            if t["reduce"]:
                buffers[t["dst"]][t["dst_block"]] = buffers[t["dst"]][t["dst_block"]] + arriving
            else:
                buffers[t["dst"]][t["dst_block"]] = Counter(arriving)
    return buffers


def own_blocks(groups, n_blocks):
    """Every device starts holding its own contribution to every block."""
    return {d: [Counter({(d, b): 1}) for b in range(n_blocks)] for g in groups for d in g}


def layouts():
    """Group layouts: a partition of some device ids into equal groups, in a shuffled order."""
    return st.integers(1, 6).flatmap(lambda size: st.integers(1, 4).flatmap(
        lambda count: st.permutations(list(range(size * count))).map(
            lambda ids: [list(ids[i * size:(i + 1) * size]) for i in range(count)])))


@PURE
@given(layouts())
def test_ring_all_reduce_delivers_every_contribution_exactly_once(groups):
    n = len(groups[0])
    ring = steps("all-reduce", groups)
    assert len(ring) == 2 * (n - 1)
    done = simulate(own_blocks(groups, n), ring)
    for g in groups:
        for d in g:
            for chunk in range(n):
                assert done[d][chunk] == Counter({(s, chunk): 1 for s in g}), (g, d, chunk)


@PURE
@given(layouts())
def test_ring_reduce_scatter_leaves_block_k_complete_on_device_k(groups):
    n = len(groups[0])
    ring = steps("reduce-scatter", groups)
    assert len(ring) == n - 1
    done = simulate(own_blocks(groups, n), ring)
    for g in groups:
        for k, d in enumerate(g):
            assert done[d][k] == Counter({(s, k): 1 for s in g})


@PURE
@given(layouts())
def test_ring_all_gather_gives_every_device_every_block(groups):
    n = len(groups[0])
    ring = steps("all-gather", groups)
    assert len(ring) == n - 1
    start = {d: [Counter({(d, 0): 1}) if g.index(d) == b else Counter() for b in range(n)] for g in groups for d in g}
    done = simulate(start, ring)
    for g in groups:
        for d in g:
            assert done[d] == [Counter({(g[k], 0): 1}) for k in range(n)]


@PURE
@given(layouts())
def test_pairwise_all_to_all_is_a_transpose_of_blocks(groups):
    n = len(groups[0])
    done = simulate(own_blocks(groups, n), steps("all-to-all", groups))
    for g in groups:
        for k, d in enumerate(g):
            assert done[d] == [Counter({(g[j], k): 1}) for j in range(n)]


@PURE
@given(layouts(), st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]))
def test_each_step_sends_and_receives_at_most_once_per_device(groups, kind):
    for step in steps(kind, groups):
        senders = Counter(t["src"] for t in step["transfers"])
        receivers = Counter(t["dst"] for t in step["transfers"])
        assert max(senders.values(), default=1) == 1 and max(receivers.values(), default=1) == 1


@PURE
@given(layouts(), st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]),
       st.integers(1, 64))
def test_estimated_bytes_are_the_steps_traffic(groups, kind, chunk):
    """The estimate (from the formulas) equals what the drawn steps move, block by block."""
    n = len(groups[0])
    ids = [d for g in groups for d in g]
    in_bytes = out_bytes = chunk * n  # one block of `chunk` bytes per ring position
    if kind == "all-gather":
        in_bytes = chunk
    if kind == "reduce-scatter":
        out_bytes = chunk
    estimate = estimated_bytes(kind, groups, ids, in_bytes, out_bytes)
    moved_out = Counter(t["src"] for s in steps(kind, groups) for t in s["transfers"])
    moved_in = Counter(t["dst"] for s in steps(kind, groups) for t in s["transfers"])
    assert estimate["sent"] == [moved_out[d] * chunk for d in ids]
    assert estimate["received"] == [moved_in[d] * chunk for d in ids]
    assert estimate["estimate"] is True


def test_permute_bytes_count_each_send_and_no_self_send():
    groups = [[0, 1, 2, 3]]
    perm = [(0, 1), (1, 0), (2, 2)]
    estimate = estimated_bytes("permute", groups, [0, 1, 2, 3], 16, 16, perm)
    assert estimate["sent"] == [16, 16, 0, 0]
    assert estimate["received"] == [16, 16, 0, 0]
    assert steps("permute", groups, perm)[0]["transfers"] == transfers("permute", groups, perm)


def test_drawing_is_capped_to_the_drawn_devices():
    ids = list(range(40))
    groups = [ids[:20], ids[20:]]
    drawn = ids[:MAX_DEVICES_DRAWN]
    mv = movement("all-gather", groups, drawn=drawn)
    assert mv["blocks"] == 20
    assert mv["transfers"] and all(t["src"] in drawn and t["dst"] in drawn for t in mv["transfers"])
    assert mv["steps"] == []  # no group is drawn whole
    small = movement("all-reduce", [ids[:4], ids[4:8]], drawn=drawn)
    assert len(small["steps"]) == 6 and small["blocks"] == 1


def test_groups_cover_every_device_once():
    mesh_axes = [("a", 2), ("b", 3), ("c", 2)]
    ids = [10 + i for i in range(12)]
    for r in range(1, 4):
        for axes in itertools.permutations(["a", "b", "c"], r):
            groups = groups_of(mesh_axes, ids, axes)
            assert sorted(d for g in groups for d in g) == ids
            assert {len(g) for g in groups} == {math.prod(s for n, s in mesh_axes if n in axes)}


# --- against JAX --------------------------------------------------------------------------------------

def make_mesh(shape, names):
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def run_per_device(mesh, body, x):
    """`body` on every device of `mesh`; x and the result carry one leading axis per mesh axis."""
    k = len(mesh.axis_names)
    spec = P(*mesh.axis_names)

    def per_device(block):
        out = body(block.reshape(block.shape[k:]))
        return out.reshape((1,) * k + out.shape)

    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    return np.asarray(f(x))


def block(a, axis, k, n, tiled):
    return np.split(a, n, axis)[k] if tiled else np.take(a, k, axis)


@st.composite
def cases(draw):
    """A mesh, a collective over some of its axes (in some order), maybe with sub-groups."""
    shape = draw(st.sampled_from([(1,), (2,), (3,), (4,), (5,), (8,), (2, 2), (2, 4), (4, 2), (2, 2, 2)]))
    names = ("a", "b", "c")[:len(shape)]
    axes = tuple(draw(st.permutations(names))[:draw(st.integers(1, len(names)))])
    n = math.prod(s for name, s in zip(names, shape) if name in axes)
    op = draw(st.sampled_from(["psum", "pmax", "all_gather", "psum_scatter", "all_to_all", "ppermute"]))
    groups = None
    if op != "ppermute" and n % 2 == 0 and n > 2 and draw(st.booleans()):
        order = draw(st.permutations(list(range(n))))
        groups = [sorted(order[:n // 2]), sorted(order[n // 2:])]
    size = len(groups[0]) if groups else n
    tiled = draw(st.booleans())
    perm = None
    if op == "ppermute":
        targets = draw(st.permutations(list(range(n))))
        keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        perm = [(s, d) for s, (d, kept) in enumerate(zip(targets, keep)) if kept]
    return shape, names, axes, op, groups, size, tiled, perm


def collective(op, axes, groups, size, tiled, perm):
    if op == "psum":
        return lambda v: lax.psum(v, axes, axis_index_groups=groups)
    if op == "pmax":
        return lambda v: lax.pmax(v, axes, axis_index_groups=groups)
    if op == "all_gather":
        return lambda v: lax.all_gather(v, axes, axis_index_groups=groups, tiled=tiled, axis=1)
    if op == "psum_scatter":
        return lambda v: lax.psum_scatter(v, axes, axis_index_groups=groups, tiled=tiled, scatter_dimension=0)
    if op == "all_to_all":
        return lambda v: lax.all_to_all(v, axes, 0, 1, axis_index_groups=groups, tiled=tiled)
    return lambda v: lax.ppermute(v, axes, perm)


KIND = {"psum": "all-reduce", "pmax": "all-reduce", "all_gather": "all-gather", "psum_scatter": "reduce-scatter",
        "all_to_all": "all-to-all", "ppermute": "permute"}
PRIMITIVE = {"psum": "psum", "pmax": "pmax", "all_gather": "all_gather", "psum_scatter": "reduce_scatter",
             "all_to_all": "all_to_all", "ppermute": "ppermute"}


def check_movement_against_jax(case):
    shape, names, axes, op, groups, size, tiled, perm = case
    mesh = make_mesh(shape, names)
    ids = [d.id for d in mesh.devices.flat]
    total = len(ids)
    rows = size if op in ("psum_scatter", "all_to_all") else 2
    per_device = (rows, 3)
    # Every element names its device and position: device d holds d * 1000 + position.
    x = (np.arange(total)[:, None, None] * 1000 + np.arange(math.prod(per_device)).reshape(per_device)).astype(
        np.float32)
    out = run_per_device(mesh, collective(op, axes, groups, size, tiled, perm), x.reshape(shape + per_device))
    out = out.reshape((total,) + out.shape[len(shape):])
    src_of = {d: x[i] for i, d in enumerate(ids)}
    out_of = {d: out[i] for i, d in enumerate(ids)}
    order = axis_index_order(axes, names, PRIMITIVE[op])
    found_groups = groups_of(list(zip(names, shape)), ids, order, groups)
    moves = transfers(KIND[op], found_groups, perm or ())
    if op == "ppermute":
        receivers = {t["dst"] for t in moves}
        for t in moves:
            np.testing.assert_array_equal(out_of[t["dst"]], src_of[t["src"]])
        for d in ids:
            if d not in receivers:
                np.testing.assert_array_equal(out_of[d], np.zeros(per_device, np.float32))
        return
    landing: dict = {}
    for t in moves:
        landing.setdefault((t["dst"], t["dst_block"]), []).append((t["src"], t["src_block"]))
    for d in ids:
        if op in ("psum", "pmax"):
            combine = np.sum if op == "psum" else np.max
            np.testing.assert_array_equal(out_of[d], combine([src_of[s] for s, _ in landing[(d, 0)]], axis=0))
        elif op == "all_gather":
            for k in range(size):
                (s, sb), = landing[(d, k)]
                np.testing.assert_array_equal(block(out_of[d], 1, k, size, tiled), src_of[s])
        elif op == "psum_scatter":
            expected = np.sum([block(src_of[s], 0, sb, size, tiled) for s, sb in landing[(d, 0)]], axis=0)
            np.testing.assert_array_equal(out_of[d], expected)
        elif op == "all_to_all":
            for j in range(size):
                (s, sb), = landing[(d, j)]
                np.testing.assert_array_equal(block(out_of[d], 1, j, size, tiled), block(src_of[s], 0, sb, size, tiled))


@FAST
@given(cases())
def test_transfers_match_what_jax_moves(case):
    check_movement_against_jax(case)


@pytest.mark.slow
@SLOW
@given(cases())
def test_transfers_match_what_jax_moves_many(case):
    check_movement_against_jax(case)


@pytest.mark.parametrize("case", [
    ((2, 4), ("a", "b"), ("b", "a"), "all_gather", None, 8, False, None),
    ((2, 4), ("a", "b"), ("b", "a"), "ppermute", None, 8, False, [(0, 1), (1, 0), (2, 5), (5, 2)]),
    ((2, 4), ("a", "b"), ("b", "a"), "psum_scatter", [[0, 1, 2, 3], [4, 5, 6, 7]], 4, True, None),
    ((2, 4), ("a", "b"), ("a",), "all_to_all", None, 2, True, None),
    ((8,), ("i",), ("i",), "psum", [[0, 2, 4, 6], [1, 3, 5, 7]], 4, False, None),
])
def test_axis_orders_and_groups_match_jax(case):
    """Named cases: the axis order JAX uses per primitive (ppermute takes the mesh's), sub-groups."""
    check_movement_against_jax(case)
