"""What XLA:TPU decided, as the plan says it (issue 42), against XLA:TPU's own program: a collective its
schedule does not overlap with compute (and the estimate that adds it; test_tpu_census.py's ZeRO-3 step has
both kinds), the calls per trip of a loop it cannot bound, and the outputs a multi-output fusion writes. Each compiles one small program for
compile-only devices of a v5e 2x4 slice; they need the optional libtpu (tpu_support.py)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh, plan
from jaxpar_magic.stages.plan.plan import EXPOSED_CAVEAT
from jaxpar_magic.stages.plan.plan_program import compile_plan
from jaxpar_magic.views import plan as plan_view
from test_plan_differential import asynchronous
from test_plan_why import UNBOUNDED
from tpu_support import require_libtpu


@pytest.fixture(scope="module", autouse=True)
def libtpu():
    require_libtpu()


POD = AbstractMesh((8,), ("data",))


def spec(shape, *axes, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(POD, P(*axes)))


def test_a_synchronous_all_reduce_is_exposed_and_the_estimate_adds_it():
    # A data-parallel step: XLA:TPU runs the gradient's all-reduce synchronously (no -start/-done, no async
    # collective fusion), so the "estimate" that overlapped it was unreachable.
    def step(w, x):
        return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2))(w)

    planned = compile_plan(step, (spec((2048, 2048)), spec((8 * 256, 2048), "data")), POD, hardware="tpu-v5e",
                           topology="2x4")
    text = planned.compiled.as_text()
    assert not asynchronous(text) and re.search(r"= \S+ all-reduce\(", text)
    (c,) = planned.collectives
    assert c.op == "all-reduce" and c.overlapped is False
    r = planned.roofline
    assert r.exposed_s == pytest.approx(c.seconds) and c.seconds > 0
    assert r.estimate_s == pytest.approx(max(r.compute_s, r.memory_s) + c.seconds) == pytest.approx(r.serial_s)
    assert EXPOSED_CAVEAT in planned.caveats
    text = " ".join(plan_view.to_text(planned.state("dp")).split())
    assert "(ici-bound, exposed)" in text or "(latency-bound, exposed)" in text
    assert "of synchronous ones (exposed) add to it" in text


def test_a_loop_xla_tpu_cannot_bound_gives_calls_per_trip_and_the_conditions_bound():
    mesh = make_mesh("data=8", axis_types="auto")
    ns = {"jax": jax, "jnp": jnp, "lax": lax, "x": plan((64, 256), "float32", mesh, ("data", None)),
          "w": plan((256, 256), "float32", mesh, ())}
    planned = jaxpar_magic.plan_cell(UNBOUNDED, ns, mesh=mesh, magic="shard_map", in_specs={"x": P("data")},
                                     out_specs={"y": P("data")}, check_vma=False, bind=False, hardware="tpu-v5e",
                                     topology="2x4")
    text = planned.compiled.as_text()
    assert planned.compiler == "XLA:TPU" and "known_trip_count" not in text  # XLA:TPU reads no count
    bounds = {int(n) for n in re.findall(r"= s32\[\]\S* constant\((\d+)\)", text)}
    assert {5, 1000} <= bounds  # the inner loop's bound, and the outer condition's counter bound
    (c,) = planned.collectives
    assert (c.count, c.per_trip, c.at_most) == (None, 5, 5000)
    assert "5 times per trip of a loop XLA cannot bound" in c.groups_text


def test_what_a_multi_output_fusion_returns_is_an_output_at_the_peak():
    # An Adam update: XLA:TPU writes new parameters and both moments in one fusion per weight, and returns
    # them (the ROOT's get-tuple-elements of it). They were listed as "temporary from div".
    def adam(p, m, v, g):
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        return jax.tree.map(lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v), m, v

    tree = lambda: {"w1": spec((2048, 2048), "data"), "w2": spec((2048, 2048), None, "data")}  # noqa: E731
    planned = compile_plan(adam, (tree(), tree(), tree(), tree()), POD, hardware="tpu-v5e", topology="2x4")
    text = planned.compiled.as_text()
    entry = text[text.index("\nENTRY "):]
    root = next(line for line in entry.splitlines() if line.lstrip().startswith("ROOT"))
    returned = re.findall(r"%([\w.\-]+)", root.split(" tuple(", 1)[1])
    defined = {m.group(1): m.group(2) for m in re.finditer(r"%([\w.\-]+) = \S+ get-tuple-element\(%([\w.\-]+)\)", entry)}
    writers = {defined.get(name, name) for name in returned}
    assert any(name in defined for name in returned), "the ROOT returns elements of a multi-output fusion"
    rows = planned.peak.live_rows
    outputs = [r for r in rows if r.kind == "output"]
    assert {r.instruction for r in outputs} <= writers and len(outputs) == len(returned) == 6
    assert not [r for r in rows if r.kind == "temporary" and r.bytes == 2048 * 2048 * 4 // 8]
    elements = sum(r.bytes for r in outputs)
    assert elements == 6 * 2048 * 2048 * 4 // 8 and planned.output_bytes - elements < 1024  # less the tuple's table
    assert sorted(r.name for r in outputs) == sorted(f"out[{k}]['{w}']" for k in range(3) for w in ("w1", "w2"))
