"""XLA:TPU's programs read as they are: async collectives once, loops without known_trip_count
counted from their bounds, windowed-einsum permutes named for what they do, and the cross-slice
(Megascale) stage of a multi-slice reduction costed on DCN.

They need the optional libtpu (tpu_support.py). Each compiles one small program with XLA:TPU.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

from jaxpar_magic.cell.hlo import collectives
from jaxpar_magic.stages.plan.plan_program import compile_plan
from test_loop_census import D, F, L, fsdp_block
from test_plan_differential import asynchronous
from tpu_support import require_libtpu


@pytest.fixture(scope="module", autouse=True)
def libtpu():
    require_libtpu()


def test_zero3_on_xla_tpu_lists_four_gathers_and_two_scatters_each_eight_times():
    pod = AbstractMesh((8,), ("data",))

    def spec(shape, *axes):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(pod, P(*axes)))

    def grads(params, x):
        return jax.grad(lambda p: jnp.mean(lax.scan(jax.checkpoint(fsdp_block), x, p)[0] ** 2))(params)

    fn = jax.shard_map(grads, in_specs=(P(None, "data"), P("data")), out_specs=P(None, "data"))
    params = {"w1": spec((L, D, F), None, "data"), "w2": spec((L, F, D), None, "data")}
    planned = compile_plan(fn, (params, spec((512, D), "data")), pod, hardware="tpu-v5e", topology="2x4")
    text = planned.compiled.as_text()
    assert "known_trip_count" not in text  # XLA:TPU's loops: the plan reads their bounds
    # XLA:TPU prints one async gather in its start, middle and done fusions: four instructions, one gather.
    assert len(re.findall(r"= \S+ all-gather\(", text)) > 4
    ops = sorted(c.op for c in planned.collectives)
    assert ops == ["all-gather"] * 4 + ["reduce-scatter"] * 2, ops
    assert {c.count for c in planned.collectives} == {8}
    assert all("8 times (in a loop)" in c.groups_text for c in planned.collectives)
    # Issue 42: which of them the compiled schedule overlaps (an async collective fusion's start) and
    # which make the device wait; the estimate adds the latter.
    started = asynchronous(text)
    assert started, "XLA:TPU starts at least one collective asynchronously here"
    assert [c.overlapped for c in planned.collectives] == [f.computation in started for f in collectives(text)]
    assert {c.overlapped for c in planned.collectives} == {True, False}
    r = planned.roofline
    exposed = sum(c.seconds for c in planned.collectives if c.overlapped is False)
    assert r.exposed_s == pytest.approx(exposed) and exposed > 0
    assert r.estimate_s == pytest.approx(max(r.compute_s, r.memory_s, r.collective_s - exposed) + exposed)


def test_a_multi_slice_reduction_has_its_dcn_stage_costed_on_dcn():
    pod = AbstractMesh((32,), ("data",))
    x = jax.ShapeDtypeStruct((32 * 64, 1024), jnp.float32, sharding=NamedSharding(pod, P("data")))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(pod, P()))

    def step(w, x):
        return jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)

    planned = compile_plan(step, (w, x), pod, hardware="tpu-v5e", topology="4x4")  # 2 slices of 16
    text = planned.compiled.as_text()
    sends = re.findall(r"= (.+?) send\(.*_xla_megascale_transfer_type=\"ALL_REDUCE\"", text)
    assert len(sends) == 1
    (dcn,) = [c for c in planned.collectives if c.over_dcn]
    assert dcn.op == "all-reduce" and dcn.group_size == 2 and dcn.reduction == "sum"
    assert dcn.bytes == 64 * 1024 * 4  # each device's 1/16 after the slice's reduce-scatter
    chunk_rate = planned.hardware.dcn_bandwidth / planned.hardware.host_chips
    assert dcn.seconds == pytest.approx(2 * (2 - 1) / 2 * dcn.bytes / chunk_rate)
    assert planned.roofline.dcn_s == pytest.approx(dcn.seconds) and planned.roofline.dcn_s > 0
    ici = [c for c in planned.collectives if not c.over_dcn]
    assert sorted(c.op for c in ici) == ["all-gather", "reduce-scatter"] and all(c.group_size == 16 for c in ici)


def test_windowed_einsum_permutes_are_named_for_the_collective_they_implement():
    pod = AbstractMesh((16,), ("data",))
    d, f, b = 4096, 16384, 16384

    def spec(shape, *axes):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(pod, P(*axes)))

    def step(params, x):
        loss = lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]).astype(jnp.float32) ** 2)  # noqa: E731
        return jax.tree.map(lambda w, g: w - 0.1 * g, params, jax.grad(loss)(params))

    params = {"w1": spec((d, f), "data", None), "w2": spec((f, d), None, "data")}
    planned = compile_plan(step, (params, spec((b, d), "data", None)), pod, hardware="tpu-v5e", topology="4x4")
    text = planned.compiled.as_text()
    loops = re.findall(r"body=%?[\w.]*windowed_dot_general_body\w*?_(ag|rs)", text)
    assert loops and set(loops) <= {"ag", "rs"}
    permutes = [c for c in planned.collectives if c.op == "collective-permute"]
    assert permutes and all("windowed einsum" in c.groups_text for c in permutes)
    assert {"all-gather", "reduce-scatter"} == {c.groups_text.split("windowed einsum: the ")[1].split(" of ")[0]
                                                for c in permutes}
    assert not any("unknown" in c.groups_text or "cannot know" in c.groups_text for c in planned.collectives)
    # Every trip's FLOPs: 5 matmuls of 2*b*d*f / 16 (the forward's two, the backward's three; no dx).
    assert planned.flops == pytest.approx(5 * 2 * b * d * f / 16, rel=0.01)


def test_one_program_over_two_slices_gets_one_time_whatever_the_mesh_calls_its_axes():
    # Issue 42: `data=32` and `dcn=2 data=16` over two v5e 4x4 slices compile to the same program, yet its
    # gradient's in-slice reduction was 2.80 ms under one and 1.40 ms under the other (a group of 16 on
    # part of a 32-device axis was timed as a line with one link).
    def step(w, x):
        return jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)

    plans = {}
    for shape, names in (((32,), ("data",)), ((2, 16), ("dcn", "data"))):
        pod = AbstractMesh(shape, names)
        batch = P(names) if len(names) > 1 else P("data")
        x = jax.ShapeDtypeStruct((32 * 64, 1024), jnp.float32, sharding=NamedSharding(pod, batch))
        w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(pod, P()))
        plans[names] = compile_plan(step, (w, x), pod, hardware="tpu-v5e", topology="4x4")
    one, two = plans[("data",)], plans[("dcn", "data")]
    strip = lambda text: re.sub(r"\bmesh\[[^\]]*\]|'?axis_\d'?|metadata=\{[^}]*\}", "", text)  # noqa: E731
    assert strip(one.compiled.as_text()) == strip(two.compiled.as_text())  # the same program
    assert [(c.op, c.group_size) for c in one.collectives] == [(c.op, c.group_size) for c in two.collectives]
    for a, b in zip(one.collectives, two.collectives):
        assert a.seconds == pytest.approx(b.seconds), (a.op, a.groups_text, b.groups_text)
    assert one.roofline.ici_s == pytest.approx(two.roofline.ici_s) and one.roofline.estimate_s == pytest.approx(two.roofline.estimate_s)
    # each in-slice stage spans the slice's two ICI axes of 4 (no wraparound on a 4x4 v5e)
    ici = [c for c in one.collectives if not c.over_dcn and c.group_size == 16]
    assert ici and all(c.parts.get("ici", 0) + c.parts.get("latency", 0) > 0 for c in ici)
