"""The collective recorder against JAX itself: card values, loop counts, unchanged results, bounded
records. Everything runs in this process's 8 simulated CPU devices (sub-meshes for fewer)."""
from __future__ import annotations

import linecache
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar_magic.cell.hlo import collectives as compiled_collectives
from jaxpar_magic.stages.record.cards import collective_cards, collectives_state
from jaxpar_magic.stages.record.previews import HEAD, HEAT
from jaxpar_magic.stages.record.sites import MAX_CARDS
from jaxpar_magic.stages.record.recorder import record_collectives

FAST = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- helpers ------------------------------------------------------------------------------------------

def make_mesh(shape, names):
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return jax.sharding.Mesh(devices, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def _per_device_program(fn, mesh, check_vma):
    k = len(mesh.axis_names)
    spec = P(*mesh.axis_names)

    def expand(tree):
        return jax.tree.map(lambda a: jnp.asarray(a).reshape((1,) * k + jnp.shape(a)), tree)

    def per_device(*blocks):
        return expand(fn(*[b.reshape(b.shape[k:]) for b in blocks]))

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=check_vma))


def run(body, mesh, *xs, check_vma=False, filename=None):
    """Run `body` per device with and without recording: (cards, recorded outputs, plain outputs, recording)."""
    recording = record_collectives(body, mesh.axis_names)
    out, records = _per_device_program(recording, mesh, check_vma)(*xs)
    plain = _per_device_program(body, mesh, check_vma)(*xs)
    cards, omitted = collective_cards(recording.sites, jax.device_get(records), mesh, filename=filename)
    return cards, jax.device_get(out), jax.device_get(plain), recording


def flat(a, total):
    return np.asarray(a).reshape((total, -1))


def tile_values(tiles):
    return [np.array([np.nan if v is None else v for v in t["values"]], dtype=np.float64) for t in tiles]


def assert_tiles_equal(tiles, per_device):
    """Every drawn tile shows the first values of that device's array."""
    total = per_device.shape[0]
    rows = flat(per_device, total)
    assert len(tiles) == min(total, 16)
    for i, values in enumerate(tile_values(tiles)):
        np.testing.assert_array_equal(values, rows[i][:HEAD].astype(np.float64))


def block_means(a, rows, cols):
    """Independent NumPy twin of the heat map: block means over floor(i * bins / length) bins."""
    m = np.asarray(a, dtype=np.float64).reshape(-1, a.shape[-1])
    r = np.arange(m.shape[0]) * rows // m.shape[0]
    c = np.arange(m.shape[1]) * cols // m.shape[1]
    sums = np.zeros((rows, cols))
    counts = np.zeros((rows, cols))
    np.add.at(sums, (r[:, None], c[None, :]), m)
    np.add.at(counts, (r[:, None], c[None, :]), 1)
    return sums / counts


def bitwise_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


# --- card values equal JAX's own results -------------------------------------------------------------

def _collective(op, groups, tiled, concat_axis, perm):
    return {
        "psum": lambda v: lax.psum(v, "i", axis_index_groups=groups),
        "pmean": lambda v: lax.pmean(v, "i", axis_index_groups=groups),
        "pmax": lambda v: lax.pmax(v, "i", axis_index_groups=groups),
        "pmin": lambda v: lax.pmin(v, "i", axis_index_groups=groups),
        "all_gather": lambda v: lax.all_gather(v, "i", axis_index_groups=groups, tiled=tiled),
        "psum_scatter": lambda v: lax.psum_scatter(v, "i", axis_index_groups=groups, tiled=tiled),
        "all_to_all": lambda v: lax.all_to_all(v, "i", 0, concat_axis, axis_index_groups=groups, tiled=tiled),
        "ppermute": lambda v: lax.ppermute(v, "i", perm),
        "pshuffle": lambda v: lax.pshuffle(v, "i", perm),
        "axis_index": lambda v: lax.axis_index("i"),
    }[op]


@st.composite
def single_axis_cases(draw):
    n = draw(st.integers(1, 8))
    op = draw(st.sampled_from(["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all",
                               "ppermute", "pshuffle", "axis_index"]))
    groups = None
    if op not in ("ppermute", "pshuffle", "axis_index") and n >= 4 and n % 2 == 0 and draw(st.booleans()):
        order = draw(st.permutations(list(range(n))))
        groups = [sorted(order[:n // 2]), sorted(order[n // 2:])]
    size = len(groups[0]) if groups else n
    tiled = draw(st.booleans())
    rest = tuple(draw(st.lists(st.integers(1, 20), max_size=2)))
    if op in ("psum_scatter", "all_to_all"):
        shape = ((size * draw(st.integers(1, 3)) if tiled else size),) + rest
    elif op == "all_gather" and tiled:
        shape = (draw(st.integers(1, 5)),) + rest
    else:
        shape = tuple(draw(st.lists(st.integers(1, 24), max_size=3)))
    concat_axis = draw(st.integers(0, max(0, len(shape) - 1)))
    perm = None
    if op == "ppermute":
        targets = draw(st.permutations(list(range(n))))
        perm = [(s, d) for s, d in enumerate(targets) if draw(st.booleans())]
    elif op == "pshuffle":
        perm = draw(st.permutations(list(range(n))))
    seed = draw(st.integers(0, 2**16))
    return n, op, groups, tiled, shape, concat_axis, perm, seed


def check_card_values_against_pmap(case):
    n, op, groups, tiled, shape, concat_axis, perm, seed = case
    x = np.random.default_rng(seed).integers(-50, 50, size=(n,) + shape).astype(np.float32)
    body = _collective(op, groups, tiled, concat_axis, perm)
    expected = np.asarray(jax.pmap(body, axis_name="i", devices=jax.devices()[:n])(x))
    cards, out, plain, recording = run(body, make_mesh((n,), ("i",)), x)
    bitwise_equal(out, plain)
    np.testing.assert_array_equal(out, expected)
    (card,) = cards
    assert card["op"] == op and card["recorded"] and card["count"] == 1
    assert card["groups"] == (groups if groups else [list(range(n))])
    (it,) = card["iterations"]
    assert it["label"] == "only"
    if op == "axis_index":
        assert it["before"] == [] and card["in_shape"] is None
    else:
        assert_tiles_equal(it["before"], x)
        assert all(t["shape"] == list(shape) for t in it["before"])
    assert_tiles_equal(it["after"], expected)
    if op == "all_to_all":  # the axes the call named, not the primitive's
        assert (card["params"]["split_axis"], card["params"]["concat_axis"]) == (0, concat_axis)
    for tile, value in zip(it["after"], expected):
        assert tile["shape"] == list(value.shape)
        if value.ndim >= 2 and value.size:
            heat = tile["heat"]
            rows, cols = value.size // value.shape[-1], value.shape[-1]
            assert (heat["rows"], heat["cols"]) == (min(HEAT, rows), min(HEAT, cols))
            want = block_means(value, heat["rows"], heat["cols"])
            np.testing.assert_allclose(np.array(heat["values"]).reshape(want.shape), want, rtol=1e-5, atol=1e-4)
            assert heat["min"] == pytest.approx(want.min(), rel=1e-5, abs=1e-4)
        else:
            assert tile["heat"] is None


@FAST
@given(single_axis_cases())
def test_card_values_equal_pmap(case):
    check_card_values_against_pmap(case)


@pytest.mark.slow
@SLOW
@given(single_axis_cases())
def test_card_values_equal_pmap_many(case):
    check_card_values_against_pmap(case)


@pytest.mark.parametrize("op, tiled", [
    ("psum", False), ("pmean", False), ("pmax", False), ("pmin", False), ("ppermute", False), ("pshuffle", False),
    ("axis_index", False), ("all_gather", False), ("all_gather", True), ("psum_scatter", False),
    ("psum_scatter", True), ("all_to_all", False), ("all_to_all", True),
])
def test_every_supported_collective_on_eight_devices(op, tiled):
    perm = [(i, (i + 3) % 8) for i in range(8)] if op == "ppermute" else list(range(7, -1, -1))
    shape = (8, 3) if op in ("psum_scatter", "all_to_all") else (2, 3)
    check_card_values_against_pmap((8, op, None, tiled, shape, 1, perm, 7))


@pytest.mark.parametrize("dtype", ["int32", "bool", "bfloat16", "float16", "uint8"])
def test_dtypes_other_than_float32(dtype):
    mesh = make_mesh((4,), ("i",))
    x = (np.arange(4 * 20 * 3).reshape(4, 20, 3) % 5).astype(jnp.dtype(dtype))
    cards, out, plain, _ = run(lambda v: lax.all_gather(v, "i", tiled=True), mesh, x)
    bitwise_equal(out, plain)
    (card,) = cards
    assert card["in_shape"] == {"int32": "s32", "bool": "pred", "bfloat16": "bf16", "float16": "f16",
                                "uint8": "u8"}[dtype] + "[20,3]"
    for tile, value in zip(card["iterations"][0]["after"], out.astype(np.float64)):
        np.testing.assert_array_equal(tile["values"], value.reshape(-1)[:HEAD])
        want = block_means(value, 16, 3)
        np.testing.assert_allclose(np.array(tile["heat"]["values"]).reshape(16, 3), want, rtol=1e-6)


@pytest.mark.parametrize("length", [1, 15, 17, 1000, 2**27 + 3, 3 * 10**9 + 7])
def test_heat_bins_cover_every_row_once(length):
    from jaxpar_magic.stages.record.previews import bin_counts

    bins = min(HEAT, length)
    counts = bin_counts(length, bins)
    assert sum(counts) == length and len(counts) == bins and min(counts) >= 1


@pytest.mark.parametrize("axes, groups", [
    ("a", None), ("b", None), (("a", "b"), None), (("b", "a"), None), (("b", "a"), [[0, 1, 2, 3], [4, 5, 6, 7]]),
])
def test_multi_axis_mesh_cards_equal_shard_map(axes, groups):
    mesh = make_mesh((2, 4), ("a", "b"))
    x = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3) ** 2

    def body(v):
        return {"sum": lax.psum(v, axes, axis_index_groups=groups),
                "all": lax.all_gather(v, axes, axis_index_groups=groups),
                "perm": lax.ppermute(v, axes, [(0, 1), (1, 0)])}

    cards, out, plain, _ = run(body, mesh, x)
    for name in out:
        bitwise_equal(out[name], plain[name])
    for card, name in zip(cards, ["sum", "all", "perm"]):
        assert card["axes"] == list(axes if isinstance(axes, tuple) else (axes,))
        (it,) = card["iterations"]
        assert_tiles_equal(it["before"], x.reshape(8, 3))
        assert_tiles_equal(it["after"], out[name].reshape((8,) + out[name].shape[2:]))
        assert sorted(d for g in card["groups"] for d in g) == list(range(8))
    # The drawing's groups are the ones JAX reduced over: equal sums within a group.
    sums = out["sum"].reshape(8, 3)
    for group in cards[0]["groups"]:
        np.testing.assert_array_equal(sums[group], np.broadcast_to(x.reshape(8, 3)[group].sum(0), (len(group), 3)))


def test_check_vma_true_psum_invariant_and_pvary():
    mesh = make_mesh((8,), ("i",))
    x = np.arange(32, dtype=np.float32).reshape(8, 4)

    def body(v):
        total = lax.psum(v, "i")  # psum_invariant under check_vma
        table = lax.psum_scatter(jnp.ones((8, 2)) * total[0], "i")  # jnp.ones is pvary'd first
        return {"total": total, "table": table, "mean": lax.pmean(v, "i")}

    cards, out, plain, recording = run(body, mesh, x, check_vma=True)
    for name in out:
        bitwise_equal(out[name], plain[name])
    assert [s.primitive for s in recording.sites] == ["psum_invariant", "reduce_scatter", "psum_invariant"]
    assert [c["op"] for c in cards] == ["psum", "psum_scatter", "pmean"]
    assert_tiles_equal(cards[0]["iterations"][0]["after"], out["total"])
    assert_tiles_equal(cards[1]["iterations"][0]["after"], out["table"])
    assert_tiles_equal(cards[2]["iterations"][0]["after"], out["mean"])


def test_axis_index_groups_under_check_vma():
    """JAX 0.10 runs axis_index_groups in shard_map only without check_vma for psum; the recorder
    raises JAX's own error there (no card can be silently wrong) and records pmax's groups."""
    mesh = make_mesh((8,), ("i",))
    x = np.arange(8, dtype=np.float32).reshape(8, 1)
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(NotImplementedError):
        _per_device_program(lambda v: lax.psum(v, "i", axis_index_groups=groups), mesh, True)(x)
    recording = record_collectives(lambda v: lax.psum(v, "i", axis_index_groups=groups), ("i",))
    with pytest.raises(NotImplementedError):
        _per_device_program(recording, mesh, True)(x)
    cards, out, plain, _ = run(lambda v: lax.pmax(v, "i", axis_index_groups=groups), mesh, x, check_vma=True)
    bitwise_equal(out, plain)
    assert cards[0]["groups"] == groups
    assert_tiles_equal(cards[0]["iterations"][0]["after"], out)


# --- loops, branches and calls ---------------------------------------------------------------------------

def test_psum_in_fori_loop_counts_and_shows_first_and_last_iteration():
    mesh = make_mesh((4,), ("i",))
    x = np.arange(12, dtype=np.int32).reshape(4, 3)

    def body(v):
        return lax.fori_loop(0, 5, lambda i, c: lax.psum(c, "i") % 1000 + i, v)

    cards, out, plain, recording = run(body, mesh, x)
    bitwise_equal(out, plain)
    carries = [x]  # the loop by hand, in NumPy
    for i in range(5):
        carries.append(np.broadcast_to(carries[-1].sum(0) % 1000 + i, x.shape))
    np.testing.assert_array_equal(out, carries[-1])
    (card,) = cards
    assert card["count"] == 5
    assert recording.sites[0].loops == ("fori_loop",)
    first, last = card["iterations"]
    assert (first["label"], last["label"]) == ("first", "last")
    assert_tiles_equal(first["before"], carries[0])
    assert_tiles_equal(first["after"], np.broadcast_to(carries[0].sum(0), x.shape))
    assert_tiles_equal(last["before"], carries[4])
    assert_tiles_equal(last["after"], np.broadcast_to(carries[4].sum(0), x.shape))


def test_while_loop_with_a_dynamic_trip_count_and_nested_loops():
    mesh = make_mesh((2,), ("i",))
    x = np.array([[1], [2]], dtype=np.int32)
    limit = np.array([[6], [6]], dtype=np.int32)

    def body(v, n):
        looped, steps = lax.while_loop(lambda c: c[1] < n[0], lambda c: (lax.psum(c[0], "i") % 97, c[1] + 1),
                                       (v, jnp.int32(0)))
        nested = lax.fori_loop(0, 3, lambda i, c: lax.fori_loop(0, 4, lambda j, d: lax.pmax(d, "i") + 1, c), v)
        scanned, ys = lax.scan(lambda c, y: (lax.psum(c, "i") - y, c), v, jnp.arange(5))
        return {"looped": looped, "steps": steps, "nested": nested, "scanned": scanned, "ys": ys}

    cards, out, plain, recording = run(body, mesh, x, limit)
    for name in out:
        bitwise_equal(out[name], plain[name])
    assert [c["count"] for c in cards] == [6, 12, 5]
    assert int(out["steps"].reshape(-1)[0]) == 6
    assert recording.sites[0].loops == ("while_loop",)
    assert recording.sites[1].loops == ("fori_loop", "fori_loop")
    assert recording.sites[2].loops == ("scan",)
    last = cards[2]["iterations"][1]
    assert_tiles_equal(last["before"], out["ys"][:, -1])  # the scan's last carry in, which ys keeps


def test_cond_records_the_branch_that_ran():
    mesh = make_mesh((4,), ("i",))
    x = np.arange(4, dtype=np.int32).reshape(4, 1) + 1

    def body(v, flag):
        taken = lax.cond(flag[0] > 0, lambda u: lax.psum(u, "i"), lambda u: lax.pmax(u, "i") * 2, v)
        alternating = lax.fori_loop(0, 5, lambda i, c: lax.cond(i % 2 == 0, lambda u: lax.psum(u, "i") % 50,
                                                                lambda u: u + 1, c), v)
        return {"taken": taken, "alternating": alternating}

    cards, out, plain, recording = run(body, mesh, x, np.ones((4, 1), np.int32))
    for name in out:
        bitwise_equal(out[name], plain[name])
    assert [(c["op"], c["count"]) for c in cards] == [("psum", 1), ("psum", 3)]  # pmax's branch never ran
    assert len(recording.sites) == 3
    assert_tiles_equal(cards[0]["iterations"][0]["after"], np.broadcast_to(x.sum(), (4, 1)))


def test_jit_custom_rules_and_checkpoint_are_entered():
    mesh = make_mesh((4,), ("i",))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    helper = jax.jit(lambda v: lax.psum(v, "i"))

    @jax.custom_jvp
    def smooth(v):
        return lax.pmax(v, "i")

    smooth.defjvp(lambda p, t: (smooth(*p), t[0]))

    @jax.custom_vjp
    def clipped(v):
        return lax.pmin(v, "i")

    clipped.defvjp(lambda v: (clipped(v), None), lambda r, g: (g,))

    def body(v):
        return {"once": helper(v), "twice": helper(v * 2), "jvp": smooth(v), "vjp": clipped(v),
                "remat": jax.checkpoint(lambda u: lax.all_gather(u, "i"))(v)}

    cards, out, plain, _ = run(body, mesh, x)
    for name in out:
        bitwise_equal(out[name], plain[name])
    assert [c["op"] for c in cards] == ["psum", "psum", "pmax", "pmin", "all_gather"]
    for card, name in zip(cards, ["once", "twice", "jvp", "vjp", "remat"]):
        assert card["recorded"]
        assert_tiles_equal(card["iterations"][0]["after"], out[name])
    assert_tiles_equal(cards[1]["iterations"][0]["before"], x * 2)  # one jitted helper, two calls, two cards


def test_integer_pmean_shows_the_mean():
    mesh = make_mesh((4,), ("i",))
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    cards, out, plain, _ = run(lambda v: lax.pmean(v, "i"), mesh, x)
    bitwise_equal(out, plain)
    (card,) = cards
    assert card["op"] == "pmean" and card["in_shape"] == "s32[3]" and card["out_shape"] == "f32[3]"
    assert_tiles_equal(card["iterations"][0]["after"], np.asarray(jax.pmap(lambda v: lax.pmean(v, "i"), "i",
                                                                           devices=jax.devices()[:4])(x)))


# --- what is not recorded ----------------------------------------------------------------------------------

def _custom_allreduce():
    """A collective primitive the recorder has never heard of (lowered as a psum)."""
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive("teaching_allreduce")
    prim.def_abstract_eval(lambda x, *, axis_name: x)
    mlir.register_lowering(prim, mlir.lower_fun(lambda x, *, axis_name: lax.psum(x, axis_name),
                                                multiple_results=False))
    return prim


def test_unknown_collective_runs_and_says_it_was_not_recorded():
    prim = _custom_allreduce()
    mesh = make_mesh((4,), ("i",))
    x = np.arange(8, dtype=np.float32).reshape(4, 2)

    def body(v):
        once = prim.bind(v, axis_name="i")
        looped = lax.fori_loop(0, 3, lambda i, c: prim.bind(c, axis_name="i") / 4, v)
        return {"once": once, "looped": looped, "after": lax.psum(once, "i")}

    cards, out, plain, _ = run(body, mesh, x)
    for name in out:
        bitwise_equal(out[name], plain[name])
    np.testing.assert_array_equal(out["once"], np.broadcast_to(x.sum(0), x.shape))
    assert [(c["op"], c["recorded"], c["count"]) for c in cards] == [
        ("teaching_allreduce", False, 1), ("teaching_allreduce", False, 3), ("psum", True, 1)]
    assert "does not support" in cards[0]["why_not"] and cards[0]["iterations"] == []
    assert cards[0]["movement"]["kind"] == "none"


def test_collective_in_a_while_condition_is_not_recorded():
    mesh = make_mesh((2,), ("i",))
    x = np.array([[1.0], [2.0]], np.float32)

    def body(v):
        return lax.while_loop(lambda c: lax.psum(c[0], "i") < 50, lambda c: c * 2, v)

    cards, out, plain, _ = run(body, mesh, x)
    bitwise_equal(out, plain)
    (card,) = cards
    assert card["recorded"] is False and card["count"] is None and "condition" in card["why_not"]


def test_collective_inside_a_nested_shard_map_is_not_recorded():
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"),
                             axis_types=(jax.sharding.AxisType.Explicit,) * 2)

    def body(v):
        inner = jax.shard_map(lambda u: lax.psum(u, "b"), in_specs=P("b"), out_specs=P(), axis_names={"b"},
                              check_vma=False)
        return inner(lax.psum(v, "a"))

    recording = record_collectives(body, ("a",))

    def program(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("a"), out_specs=P("a"), axis_names={"a"},
                                     check_vma=False))

    x = np.arange(16, dtype=np.float32)
    with jax.set_mesh(mesh):
        out, records = program(lambda v: (lambda o, r: (o, jax.tree.map(lambda a: a[None], r)))(*recording(v)))(x)
        plain = program(body)(x)
    bitwise_equal(out, plain)
    outer_mesh = make_mesh((2,), ("a",))  # the cards of the calls over 'a'
    records = [jax.tree.map(lambda a: np.asarray(a).reshape((2, -1) + a.shape[1:])[:, 0], r) for r in records]
    cards, _ = collective_cards(recording.sites, records, outer_mesh)
    assert [(c["axes"], c["recorded"], c["count"]) for c in cards] == [(["a"], True, 1), (["b"], False, None)]
    assert "shard_map" in cards[1]["why_not"]


def test_prng_keys_are_counted_not_recorded():
    mesh = make_mesh((2,), ("i",))

    def body(v):
        keys = lax.ppermute(jax.random.split(jax.random.key(0), 3), "i", [(0, 1), (1, 0)])
        return lax.psum(v, "i") + jax.random.normal(keys[1], v.shape)

    cards, out, plain, _ = run(body, mesh, np.ones((2, 3), np.float32))
    bitwise_equal(out, plain)
    assert [(c["op"], c["recorded"], c["count"]) for c in cards] == [("ppermute", False, 1), ("psum", True, 1)]
    assert "PRNG key" in cards[0]["why_not"]


def test_cards_draw_at_most_sixteen_devices():
    """The host side on a (stand-in) mesh of 32 devices: tiles, bytes and transfers stop at 16."""
    from types import SimpleNamespace

    mesh = make_mesh((8,), ("i",))
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    recording = record_collectives(lambda v: lax.psum(v, "i"), ("i",))
    _, records = _per_device_program(recording, mesh, False)(x)
    big = [jax.tree.map(lambda a: np.concatenate([np.asarray(a)] * 4), r) for r in jax.device_get(records)]
    devices = np.array([SimpleNamespace(id=100 + i) for i in range(32)], dtype=object)
    state = collectives_state("32 devices", recording.sites, big, SimpleNamespace(devices=devices, axis_names=("i",)),
                              device_process=[i // 8 for i in range(32)])
    (card,) = state["cards"]
    assert card["devices_omitted"] == 16 and card["groups"] == [list(range(100, 132))]
    assert [t["device"] for t in card["iterations"][0]["after"]] == list(range(100, 116))
    assert card["bytes"]["sent"] == [round(2 * 31 * 12 / 32)] * 16  # 2 (n - 1) / n of f32[3]
    assert card["movement"]["steps"] == []  # the ring is not drawn whole
    assert all(100 <= t["src"] < 116 and 100 <= t["dst"] < 116 for t in card["movement"]["transfers"])
    assert state["device_process"][31] == 3


def test_more_calls_than_cards_are_counted_as_omitted():
    mesh = make_mesh((2,), ("i",))
    x = np.ones((2, 1), np.float32)

    def body(v):
        for _ in range(MAX_CARDS + 6):
            v = lax.psum(v, "i") / 2
        return v

    recording = record_collectives(body, ("i",))
    out, records = _per_device_program(recording, mesh, False)(x)
    assert len(records) == MAX_CARDS
    cards, omitted = collective_cards(recording.sites, jax.device_get(records), mesh)
    assert len(cards) == MAX_CARDS and omitted == 6
    bitwise_equal(out, _per_device_program(body, mesh, False)(x))


# --- the recording changes nothing it should not ------------------------------------------------------------

def _composite(v):
    """Everything at once: floats whose rounding would show any change in the program."""
    helper = jax.jit(lambda u: jnp.tanh(lax.psum(u, "i")) * 1.1)
    w = jnp.sin(v) @ jnp.cos(v).T
    w = lax.pmean(w, "i") + helper(w)
    w = lax.fori_loop(0, 3, lambda i, c: c * 0.7 + lax.psum(c, "i") * 1e-3, w)
    w = jax.checkpoint(lambda u: jnp.exp(-lax.all_gather(u, "i", tiled=True)[:u.shape[0]]))(w)
    w = lax.cond(lax.pmax(w.sum(), "i") > 0, lambda u: lax.ppermute(u, "i", [(0, 1), (1, 0), (2, 3), (3, 2)]),
                 lambda u: u, w)
    return {"w": w, "scatter": lax.psum_scatter(jnp.sqrt(jnp.abs(w)), "i", tiled=True)}


@pytest.mark.parametrize("check_vma", [False, True])
def test_recorded_outputs_equal_unrecorded_bit_for_bit(check_vma):
    mesh = make_mesh((4,), ("i",))
    x = np.random.default_rng(3).normal(size=(4, 8, 5)).astype(np.float32)
    cards, out, plain, _ = run(_composite, mesh, x, check_vma=check_vma)
    for name in out:
        bitwise_equal(out[name], plain[name])
    assert [c["op"] for c in cards] == ["pmean", "psum", "psum", "all_gather", "pmax", "ppermute", "psum_scatter"]


def test_untraced_arguments_and_outputs_pass_through_unchanged():
    mesh = make_mesh((2,), ("i",))
    table = np.arange(3.0)
    marker = object()
    seen = {}

    def fn(v, scale, lookup):
        seen.update(scale=scale, lookup=lookup)
        return {"value": lax.psum(v, "i") * scale, "marker": marker, "count": 3}

    recording = record_collectives(fn, ("i",))

    def per_device(block):
        out, records = recording(block[0], 2, table)
        assert out["marker"] is marker and out["count"] == 3
        return out["value"][None], jax.tree.map(lambda a: a[None], records)

    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    value, _ = f(np.ones((2, 3), np.float32))
    assert seen["scale"] == 2 and seen["lookup"] is table
    np.testing.assert_array_equal(value, np.full((2, 3), 4.0))


def test_payload_stays_bounded_at_a_hundred_million_elements():
    """Record sizes do not grow with the arrays (abstract inputs: nothing is allocated)."""
    mesh = make_mesh((8,), ("i",))

    def body(v, m):
        g = lax.fori_loop(0, 2, lambda i, c: lax.psum(c, "i"), v)
        return {"g": g, "m": lax.pmax(m, "i"), "s": lax.psum_scatter(m, "i", tiled=True),
                "a": lax.all_gather(v, "i", tiled=True)}

    def record_bytes(n, side):
        recording = record_collectives(body, ("i",))
        f = _per_device_program(lambda v, m: recording(v, m)[1], mesh, False)
        shapes = jax.eval_shape(f, jax.ShapeDtypeStruct((8, n), jnp.float32),
                                jax.ShapeDtypeStruct((8, side, side), jnp.float32))
        leaves = jax.tree.leaves(shapes)
        return sum(math.prod(s.shape[1:]) * s.dtype.itemsize for s in leaves), len(recording.sites)

    small, sites = record_bytes(1_000, 128)
    huge, _ = record_bytes(100_000_000, 10_000)
    assert small == huge
    assert huge / sites <= 8 * 1024  # a few KiB per device and call, loops' first and last included


# --- where the call was written, and the compiled program ----------------------------------------------------

def test_cards_name_the_cells_line_and_the_compiled_bytes():
    source = "def body(v):\n    y = v * 2\n    total = lax.psum(y, 'i')\n    return total\n"
    filename = "<recorder-test-cell>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {"lax": lax}
    exec(compile(source, filename, "exec"), scope)
    mesh = make_mesh((4,), ("i",))
    x = np.ones((4, 4), np.float32)
    recording = record_collectives(scope["body"], ("i",))
    program = _per_device_program(recording, mesh, False)
    out, records = program(x)
    compiled = compiled_collectives(program.lower(x).compile().as_text(), [d.id for d in mesh.devices.flat], filename)
    state = collectives_state("collectives of %%pmap -a i", recording.sites, jax.device_get(records), mesh,
                              filename=filename, line_text=lambda n: source.splitlines()[n - 1].strip(),
                              compiled=compiled)
    (card,) = state["cards"]
    assert (card["line"], card["source"]) == (3, "total = lax.psum(y, 'i')")
    assert card["bytes"]["compiled"] == 16  # the compiled all-reduce of f32[4], found by its line
    assert card["bytes"]["sent"] == [24] * 4  # 2 (n - 1) / n of 16 bytes
    assert state["device_ids"] == [0, 1, 2, 3] and state["axes"] == [{"name": "i", "size": 4}]
    assert state["omitted_cards"] == 0 and state["device_process"] is None
