"""--plan against the worked examples of "How to Scale Your Model" (the JAX scaling book,
jax-ml/scaling-book: sharding.md, training.md, gpus.md), each within a stated tolerance.

Every example is planned through `jaxpar_magic.plan_cell` (the twin of `%%shard --plan` /
`%%shard_map --plan`) on simulated CPU devices. They need up to 512 devices, so one fresh process
plans them all (about half a minute) and prints the figures; each test then checks one example.
"""
from __future__ import annotations

import json

import pytest

from shell_helpers import run_python

CHILD = r'''
import json
import jax
jax.config.update("jax_num_cpu_devices", 512)
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jaxpar_magic


def mesh_of(sizes, names):
    return Mesh(np.array(jax.devices()[:int(np.prod(sizes))]).reshape(sizes), names)


def abstract(shape, mesh, spec, dtype="bfloat16"):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=NamedSharding(mesh, P(*spec)))


def figures(plan):
    moving = [c for c in plan.collectives if c.group_size > 1]
    return {"collectives": [{"op": c.op, "shape": c.shape, "bytes": c.bytes, "seconds": c.seconds,
                             "bound": c.bound, "axes": list(c.axes), "group": c.group_size} for c in moving],
            "topology": plan.topology.describe(), "compute": plan.roofline.compute_s,
            "memory": plan.roofline.memory_s, "estimate": plan.roofline.estimate_s,
            "bound": plan.roofline.bound, "spans": {n: [[s.dim, s.extent, s.wraps] for s in spans]
                                                   for n, spans in plan.topology.axes.items()}}


def gather(mesh, shape, spec, hardware, **options):
    ns = {"x": abstract(shape, mesh, spec)}
    return figures(jaxpar_magic.plan_cell("y = x + 1", ns, magic="shard", mesh=mesh, out_specs={"y": ()},
                                          hardware=hardware, **options))


def per_device(mesh, source, shape, spec, hardware):
    ns = {"x": abstract(shape, mesh, spec), "jax": jax}
    return figures(jaxpar_magic.plan_cell(source, ns, magic="shard_map", mesh=mesh, in_specs={"x": spec},
                                          out_specs={"y": spec}, check_vma=False, hardware=hardware))


out = {}
quiz = mesh_of((8, 4), ("X", "Y"))
out["quiz2a"] = gather(quiz, (2048, 8192), ("Y", None), "tpu-v5e")
out["quiz2b"] = gather(quiz, (256, 256), ("Y", None), "tpu-v5e")
full = mesh_of((16, 16), ("X", "Y"))
out["full16"] = gather(full, (2048, 8192), ("Y", None), "tpu-v5e")
out["reduce16"] = per_device(full, "y = jax.lax.psum(x, 'Y')", (16 * 128, 8192), ("Y", None), "tpu-v5e")
out["gather16"] = per_device(full, "y = jax.lax.all_gather(x, 'Y', tiled=True)[:128]", (16 * 8, 8192), ("Y", None),
                             "tpu-v5e")
out["alltoall16"] = per_device(full, "y = jax.lax.all_to_all(x, 'Y', 0, 0, tiled=True)", (16 * 2048, 8192),
                               ("Y", None), "tpu-v5e")

# Data parallelism on a v5p 4x4x4 cube: 'data' on one physical axis (the other 16 chips replicate).
cube = mesh_of((16, 4), ("rest", "data"))
D, F = 2048, 8192
for label, tokens in {"dp_above": 2 * 2550, "dp_below": 2550 // 4}.items():
    ns = {"x": abstract((4 * tokens, D), cube, ("data", None)), "w": abstract((D, F), cube, ())}
    source = "grads = jax.grad(lambda w: jnp.sum(jnp.square((x @ w).astype(jnp.float32))))(w)"
    out[label] = figures(jaxpar_magic.plan_cell(source, {**ns, "jax": jax, "jnp": jnp}, magic="shard", mesh=cube,
                                                out_specs={"grads": ()}, hardware="tpu-v5p"))

# Two v5e pods (2 x 16x16): an axis across them runs over DCN.
pods = mesh_of((2, 16, 16), ("pod", "X", "Y"))
out["dcn"] = per_device(pods, "y = jax.lax.psum(x, 'pod')", (2 * 1024, 8192), ("pod", None), "tpu-v5e")
out["ici_same"] = per_device(pods, "y = jax.lax.psum(x, 'X')", (16 * 1024, 8192), ("X", None), "tpu-v5e")

# An axis partly on DCN: data=64 on 512 v5e (2 pods) is 2 pods x 32 chips; its all-reduce has both stages.
wide = mesh_of((64, 8), ("data", "model"))
ns = {"x": abstract((64 * 16, 8192), wide, ("data", None)), "w": abstract((8192, 4096), wide, ()), "jax": jax,
      "jnp": jnp}
plan = jaxpar_magic.plan_cell("g = jax.grad(lambda w: jnp.sum((x @ w).astype(jnp.float32)))(w)", ns, magic="shard",
                              mesh=wide, out_specs={"g": ()}, hardware="tpu-v5e")
out["mixed"] = figures(plan)
out["mixed"].update(ici_s=plan.roofline.ici_s, dcn_s=plan.roofline.dcn_s, latency_s=plan.roofline.latency_s)

# 64 H100s, 8 nodes of 8: a gather over all of them, past the NVLink domain.
gpus = mesh_of((8, 8), ("node", "gpu"))
out["gpu64"] = gather(gpus, (4096, 8192), (("node", "gpu"), None), "h100")
out["gpu8"] = gather(gpus, (4096, 8192), ("gpu", None), "h100")
# --topology: the same Pop Quiz gather on a 2x16 slice instead (Y on part of the 16 axis); the cost
# model on XLA:CPU's program (with libtpu, a named slice would compile with XLA:TPU, which has no 2x16 v5e)
out["quiz_topology"] = gather(quiz, (2048, 8192), ("Y", None), "tpu-v5e", topology="2x16", compiler="cpu")
print("BOOK" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def book():
    proc = run_python(CHILD, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("BOOK"))
    return json.loads(line[4:])


def only(example) -> dict:
    (c,) = example["collectives"]
    return c


def test_pop_quiz_2a_a_gather_without_wraparound(book):
    """sharding.md, Pop Quiz 2: AllGather_Y(bf16[2048_Y, 8192]) on v5e {X: 8, Y: 4}: 3 hops of 8.4 MB at
    4.5e10 one way, 560 µs (377 µs on an ideal ring; 680 µs measured). Tolerance: 2% of 560 µs."""
    c = only(book["quiz2a"])
    assert (c["op"], c["shape"], c["bytes"]) == ("all-gather", "bf16[2048,8192]", 2048 * 8192 * 2)  # bf16, not f32
    assert c["seconds"] == pytest.approx(560e-6, rel=0.02)
    assert 377e-6 < c["seconds"] < 680e-6
    assert c["bound"] == "ici" and book["quiz2a"]["bound"] == "ici"  # communication-bound, not memory-bound
    assert "4x8 ICI slice, no wraparound" in book["quiz2a"]["topology"]


def test_pop_quiz_2b_a_small_gather_is_latency_bound(book):
    """sharding.md, Pop Quiz 2 (b): at 256x256 each 32 kB hop takes 0.7 µs < 1 µs: latency-bound, 3 hops,
    about 3 µs (8 µs measured). Tolerance: 10% of 3 µs."""
    c = only(book["quiz2b"])
    assert c["seconds"] == pytest.approx(3e-6, rel=0.1)
    assert c["bound"] == "latency" and book["quiz2b"]["bound"] == "latency"


def test_a_full_16_axis_wraps_around(book):
    """sharding.md: with wraparound (a full 16 axis on v5e) the bidirectional ring takes V / W_bidi = 373 µs
    for bf16[2048, 8192] (the ring's exact (n-1)/n = 15/16 of it). Tolerance: 7% of V / W_bidi."""
    c = only(book["full16"])
    book_time = 2048 * 8192 * 2 / 9e10
    assert c["seconds"] == pytest.approx(book_time, rel=0.07)
    assert c["seconds"] == pytest.approx(15 / 16 * book_time, rel=1e-6)
    assert "wraparound on every axis" in book["full16"]["topology"]
    assert only(book["quiz2a"])["seconds"] / c["seconds"] > 1.5  # no wraparound "typically doubles" it


def test_an_all_reduce_is_twice_an_all_gather(book):
    """sharding.md: AllReduce = ReduceScatter + AllGather, 2x an AllGather of the same array. Tolerance: 1%."""
    reduce, gather = only(book["reduce16"]), only(book["gather16"])
    assert reduce["op"] == "all-reduce" and gather["op"] == "all-gather"
    assert reduce["bytes"] == gather["bytes"] == 128 * 8192 * 2
    assert reduce["seconds"] == pytest.approx(2 * gather["seconds"], rel=0.01)


def test_an_all_to_all_is_a_quarter_of_a_gather_and_does_not_shrink_with_the_group(book):
    """sharding.md: an AllToAll on a bidirectional ring is 1/4 of an AllGather of the same (whole) array.
    Here every device holds 2048 rows and the group's array is 16 of those. Tolerance: 1%."""
    c = only(book["alltoall16"])
    gather_of_the_array = 15 / 16 * 16 * 2048 * 8192 * 2 / 9e10
    assert c["op"] == "all-to-all" and c["shape"].startswith("bf16[")  # the program's dtype, not XLA:CPU's f32
    assert c["seconds"] == pytest.approx(gather_of_the_array / 4, rel=0.01)


def test_data_parallel_crossover_on_v5p(book):
    """training.md: data parallelism is compute-bound when tokens per chip exceed C / W_ici =
    4.59e14 / 1.8e11 = 2550 (one ICI axis), communication-bound well below. At twice it the plan is
    compute-bound; at a quarter, bound by ICI collectives."""
    above, below = book["dp_above"], book["dp_below"]
    assert above["spans"]["data"] == [[2, 4, True]] or len(above["spans"]["data"]) == 1  # one physical axis
    assert [c["op"] for c in above["collectives"]] == ["all-reduce"]
    assert above["bound"] == "compute"
    assert below["bound"] == "ici"
    comm = only(above)["seconds"]
    assert above["compute"] > comm and below["compute"] < only(below)["seconds"]


def test_an_axis_across_pods_runs_at_dcn_speed(book):
    """tpus.md: beyond a 16x16 v5e pod, DCN carries about 2.5e10 B/s per host of 8 chips. An all-reduce
    over 'pod' (2 pods) moves V/2 each way per chip at 2.5e10 / 8. Tolerance: 1%; and over an order of
    magnitude slower than the same all-reduce over ICI."""
    dcn, ici = only(book["dcn"]), only(book["ici_same"])
    v = 1024 * 8192 * 2
    assert dcn["bytes"] == ici["bytes"] == v
    assert dcn["seconds"] == pytest.approx(2 * (1 / 2) * v / (2.5e10 / 8), rel=0.01)
    assert dcn["bound"] == "dcn" and book["dcn"]["bound"] == "dcn"
    assert dcn["seconds"] > 10 * ici["seconds"]
    assert "2 slices over DCN" in book["dcn"]["topology"]


def test_past_eight_gpus_is_the_networks_speed(book):
    """gpus.md: an AllGather beyond the node costs bytes x max over levels of (D_i - 1) / (D_i W_i): NVLink
    (8 GPUs at 450 GB/s) and the scale-out network (here 8 nodes at 400 GB/s per node). Tolerance: 1%."""
    wide, node = only(book["gpu64"]), only(book["gpu8"])
    v = 4096 * 8192 * 2
    assert wide["seconds"] == pytest.approx(v * max(7 / (8 * 450e9), 7 / (8 * 400e9)), rel=0.01)
    assert wide["bound"] == "dcn" and node["bound"] == "ici"
    assert node["seconds"] == pytest.approx(7 / 8 * v / 450e9, rel=0.01)  # within a node: NVLink


def test_a_topology_option_lays_the_mesh_onto_that_slice(book):
    """--topology 2x16: the Pop Quiz's Y=4 takes part of the 16 axis (a line of 4, no wraparound) and X=8
    the rest: the same 560 µs; X cannot wrap either."""
    example = book["quiz_topology"]
    assert "2x16 ICI slice" in example["topology"]
    assert only(example)["seconds"] == pytest.approx(560e-6, rel=0.02)


def test_an_axis_partly_across_pods_pays_both_stages(book):
    """tpus.md / sharding.md, hierarchically: an all-reduce over data=64 spanning 2 pods of 32 chips runs a
    ring stage on ICI (the array V over the pod's chips) and a DCN stage (V / 32 per chip between the
    pods, at 2.5e10 / 8 per chip). Both show in the roofline, each with its own time. Tolerance: 1%."""
    example = book["mixed"]
    (c,) = [c for c in example["collectives"] if c["op"] == "all-reduce"]
    v = 8192 * 4096 * 2  # bf16 gradient
    assert c["bytes"] == v and c["shape"].startswith("bf16[")  # (XLA may transpose it)
    dcn = 2 * (1 / 2) * v / 32 / (2.5e10 / 8)
    ici = 2 * (31 / 32) * v / (9e10 + 4.5e10)  # one wrapped 16 axis (both ways) and a line of 2 (one way)
    assert example["dcn_s"] == pytest.approx(dcn, rel=0.01)
    assert example["ici_s"] + example["latency_s"] == pytest.approx(max(ici, 2 * (8 + 1) * 1e-6), rel=0.01)
    assert c["seconds"] == pytest.approx(example["ici_s"] + example["latency_s"] + example["dcn_s"], rel=1e-6)
    assert "DCN (2)" in example["topology"]
