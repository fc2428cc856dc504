"""Collectives and work inside loops (cell/hlo.py, cell/loops.py, cell/work.py): every collective
instruction listed once, each with its calls per step; FLOPs of every trip.

Oracles: the compiled program's own text (the loops' bounds, read here by hand), and the same loop
written as a Python for-loop, whose straight-line program XLA's cost analysis counts whole.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxpar_magic.cell.hlo import collectives
from jaxpar_magic.cell.loops import Program, trip_count
from jaxpar_magic.cell.work import loop_work
from jaxpar_magic.engines.shard import make_mesh
from jaxpar_magic.stages.plan.plan_program import LOOP_CAVEAT, compile_plan

L, D, F = 8, 128, 512


def block(h, p):
    return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"], None


def fsdp_block(h, rows):
    whole = jax.tree.map(lambda r: lax.all_gather(r, "data", axis=0, tiled=True), rows)
    return block(h, whole)


def zero3_text() -> str:
    """The memory chapter's ZeRO-3 gradient: FSDP over a scan of 8 checkpointed blocks, on XLA:CPU."""
    mesh = make_mesh("data=8")

    def grads(params, x):
        return jax.grad(lambda p: jnp.mean(lax.scan(jax.checkpoint(fsdp_block), x, p)[0] ** 2))(params)

    def spec(shape, *axes):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P(*axes)))

    fn = jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=(P(None, "data"), P("data")), out_specs=P(None, "data")))
    params = {"w1": spec((L, D, F), None, "data"), "w2": spec((L, F, D), None, "data")}
    return fn.lower(params, spec((512, D), "data")).compile().as_text()


@pytest.fixture(scope="module")
def zero3():
    return zero3_text()


def test_every_collective_instruction_is_listed_once_with_its_calls(zero3):
    # XLA:CPU gives all six channel_id=1, and the forward and backward gathers have the same shapes:
    # folding by op, channel and shape listed 2 gathers.
    lines = [line for line in zero3.splitlines() if re.search(r"= \S+ (all-gather|reduce-scatter)\(", line)]
    found = collectives(zero3)
    assert len(found) == len(lines) == 6
    assert sorted(c.op for c in found) == ["all-gather"] * 4 + ["reduce-scatter"] * 2
    assert {c.count for c in found} == {8}
    assert sorted(c.shape for c in found if c.op == "all-gather") == ["f32[128,512]"] * 2 + ["f32[512,128]"] * 2


def test_a_loop_without_xlas_trip_count_is_read_from_its_condition(zero3):
    # XLA:TPU leaves known_trip_count out; the condition's bound, the start and the step remain.
    bare = re.sub(r',?"known_trip_count":\{"n":"\d+"\}', "", zero3)
    assert "known_trip_count" not in bare
    program = Program(bare)
    loops = [i for i in program.read if i.op == "while"]
    assert len(loops) == 2 and [trip_count(i, program) for i in loops] == [8, 8]
    assert {c.count for c in collectives(bare)} == {8}


def compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def test_fori_loop_bounds_and_nested_loops_multiply():
    x = jax.ShapeDtypeStruct((16,), jnp.float32)

    def nested(v):
        inner = lambda i, h: jnp.sin(h) + i  # noqa: E731
        return lax.fori_loop(3, 10, lambda j, h: lax.fori_loop(0, 5, inner, h), v)

    text = re.sub(r',?"known_trip_count":\{"n":"\d+"\}', "", compiled(nested, x).as_text())
    program = Program(text)
    assert sorted(trip_count(i, program) for i in program.read if i.op == "while") == [5, 7]
    sines = [i for i in program.read if i.op == "sine"]
    from jaxpar_magic.cell.loops import calls

    assert sines and {calls(program)[i.computation] for i in sines} == {35}


def test_a_loop_on_a_computed_condition_is_unknown():
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    program = Program(compiled(lambda v: lax.while_loop(lambda h: jnp.sum(h) < 100.0, lambda h: h * 2 + 1, v), x).as_text())
    (loop,) = [i for i in program.read if i.op == "while"]
    assert trip_count(loop, program) is None
    assert loop_work(program=program, text=" while(").unknown


def layer(h, w):
    return jnp.tanh(h @ w), None


def scan_loss(w, x):
    return jnp.sum(lax.scan(layer, x, w)[0] ** 2)


def unrolled_loss(w, x):
    h = x
    for i in range(w.shape[0]):
        h = layer(h, w[i])[0]
    return jnp.sum(h ** 2)


def fori_loss(w, x):
    return jnp.sum(lax.fori_loop(0, w.shape[0], lambda i, h: layer(h, w[i])[0], x) ** 2)


def nested_loss(w, x):
    return jnp.sum(lax.scan(lambda h, _: (lax.scan(layer, h, w)[0], None), x, None, length=3)[0] ** 2)


def nested_unrolled(w, x):
    h = x
    for _ in range(3):
        for i in range(w.shape[0]):
            h = layer(h, w[i])[0]
    return jnp.sum(h ** 2)


def flops_of(fn, *args) -> float:
    made = compiled(fn, *args)
    return made.cost_analysis()["flops"] + loop_work(made.as_text()).flops


@pytest.mark.parametrize("looped, unrolled, trips", [
    (scan_loss, unrolled_loss, 8), (fori_loss, unrolled_loss, 8), (nested_loss, nested_unrolled, 24),
], ids=["scan", "fori_loop", "nested scans"])
def test_flops_of_a_loop_are_those_of_the_loop_unrolled(looped, unrolled, trips):
    w, x = jax.ShapeDtypeStruct((8, 64, 64), jnp.float32), jax.ShapeDtypeStruct((32, 64), jnp.float32)
    once = compiled(looped, w, x).cost_analysis()["flops"]
    want = compiled(unrolled, w, x).cost_analysis()["flops"]
    assert once < want / 4  # XLA's own figure: one trip
    # The same, up to the loop's own scalars (its counter's add and compare, the index arithmetic of
    # w[i]): at most 8 FLOPs a trip, against 262,144 in each trip's matmul.
    assert abs(flops_of(looped, w, x) - want) <= 8 * trips


def test_a_gradient_through_a_scan_counts_every_layer():
    w, x = jax.ShapeDtypeStruct((8, 64, 64), jnp.float32), jax.ShapeDtypeStruct((32, 64), jnp.float32)
    want = compiled(jax.grad(unrolled_loss), w, x).cost_analysis()["flops"]
    # The scan's backward pass also writes each layer's gradient into the stacked one: 0.5 % more.
    assert flops_of(jax.grad(scan_loss), w, x) == pytest.approx(want, rel=0.01)


def test_the_plan_counts_every_trip_and_says_so():
    mesh = make_mesh("d=8")
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P()))  # noqa: E731
    args = (spec(8, 64, 64), spec(32, 64))
    looped, unrolled = compile_plan(scan_loss, args, mesh), compile_plan(unrolled_loss, args, mesh)
    assert abs(looped.flops - unrolled.flops) <= 8 * 8
    assert looped.bytes_accessed > unrolled.bytes_accessed / 2
    assert LOOP_CAVEAT in looped.caveats and "adds every other trip" in LOOP_CAVEAT


def test_an_all_reduce_the_compiler_left_whole_stays_one_on_xla_tpu():
    """XLA:CPU's program sums the whole gradient and slices it: an XLA:CPU plan shows the target's
    reduce-scatter (marked as rewritten); XLA:TPU's program, read with own_only, keeps what XLA:TPU
    made: only all-reduces inside its own `all-reduce-scatter` fusions become reduce-scatters (those,
    tests/test_tpu_plans.py's FSDP step shows)."""
    from jaxpar_magic.cell.scatter import reduce_scatters

    mesh = make_mesh("data=8")

    def mine(g):
        whole = lax.psum(g, "data")
        return lax.dynamic_slice_in_dim(whole, lax.axis_index("data") * 16, 16)

    fn = jax.jit(jax.shard_map(mine, mesh=mesh, in_specs=P(), out_specs=P("data"), check_vma=False))
    text = fn.lower(jax.ShapeDtypeStruct((128, 64), jnp.float32)).compile().as_text()
    found = collectives(text)
    assert [c.op for c in found] == ["all-reduce"]
    (target,) = reduce_scatters(text, found)
    assert target.op == "reduce-scatter" and target.sliced_from == "all-reduce" and target.shape == "f32[16,64]"
    (own,) = reduce_scatters(text, found, own_only=True)
    assert own.op == "all-reduce" and own.shape == "f32[128,64]"
