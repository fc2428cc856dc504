"""The step that does not fit, planned by XLA:TPU: it refuses the compile (RESOURCE_EXHAUSTED) after
assigning every buffer, and the plan is made from that assignment: "does not fit: needs X of Y", the
largest buffers with their lines, the timeline, and advice for a memory problem, alone and in
--compare. One v5e step of 4 GiB f32 matrices: XLA:TPU refuses it in about 2 s on 2 cores.
Needs the optional libtpu (tpu_support.py)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.stages.plan.compare import compare_cell
from jaxpar_magic.views import plan as plan_view
from tpu_support import require_libtpu

N = 32768  # f32[N, N] is 4 GiB: w, x, the gradient and one activation are 16 GiB, over a v5e's 15.75
GiB = 2**30
STEP = """def loss(w, x):
    h = jnp.tanh(x @ w)
    return (h @ w.T).sum()
g = jax.grad(loss)(w, x)
"""


@pytest.fixture(scope="module", autouse=True)
def libtpu():
    require_libtpu()


@pytest.fixture(scope="module")
def square():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    replicated = NamedSharding(mesh, P())
    ns = {"jax": jax, "jnp": jnp, "mesh": mesh, "w": jax.ShapeDtypeStruct((N, N), jnp.float32, sharding=replicated),
          "x": jax.ShapeDtypeStruct((N, N), jnp.float32, sharding=replicated)}
    return ns


@pytest.fixture(scope="module")
def refused(square):
    return jaxpar_magic.plan_cell(STEP, square, mesh=square["mesh"], hardware="tpu-v5e", topology="2x2", bind=False)


def test_the_plan_says_how_much_it_needs_of_what_xla_tpu_has(refused):
    said = re.search(r"required for HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)",
                     refused.refused)
    assert said, refused.refused  # XLA:TPU's own words are kept
    assert refused.fits is False and refused.compiler == "XLA:TPU"
    assert refused.capacity == float(said.group(2)) * GiB
    assert abs(refused.total_bytes / GiB - float(said.group(1))) < 0.005  # XLA's figure, to its 2 decimals
    assert refused.argument_bytes == 2 * N * N * 4  # w and x, replicated
    assert refused.flops is None and refused.roofline is None  # no executable: nothing to time
    assert refused.summary().startswith("XLA:TPU refused to compile it: does not fit: needs 16.00 GiB of 15.75 GiB")


def test_the_largest_buffers_are_named_with_their_lines_and_the_rows_stay_within_the_peak(refused):
    peak = refused.peak
    arguments = {b.name for b in peak.buffers if b.kind == "argument"}
    assert arguments == {"w", "x"}
    activation = [b for b in peak.buffers if b.kind == "temporary" and b.bytes == N * N * 4]
    assert activation and activation[0].line == 2 and activation[0].source == "h = jnp.tanh(x @ w)"
    assert sum(b.bytes for b in peak.buffers) + peak.other_bytes + peak.reserved_bytes == peak.reported
    assert len(peak.timeline) > 2 and max(p["bytes"] for p in peak.timeline) == peak.live


def test_the_advice_is_computed_from_the_buffers_at_the_peak(refused):
    # Issue 42: "To make it fit" was the same text every time, and "give --hardware" where it was given.
    by_kind = {a.kind: a for a in refused.advice}
    assert by_kind["shard"].bytes == 3 * 2 * N * N * 4 // 4  # w and x whole on each of 4 devices: a quarter each
    assert by_kind["donate"].bytes == N * N * 4 and "`--donate w`" in by_kind["donate"].text  # g has w's shape
    assert by_kind["recompute"].bytes == N * N * 4  # h, saved for the backward pass
    assert all("alone, it would fit" in a.text for a in refused.advice)  # each is 4 GiB or more of a 0.25 GiB excess
    text = " ".join(plan_view.to_text(refused.state("too big")).split())
    assert "DOES NOT FIT" in text and "the compiler refused it after" in text and "To make it fit: shard" in text
    assert "Google Cloud offers" not in text and "more devices" not in text  # nothing that cannot help
    assert "What fills memory at the peak" in text and "line 2: h = jnp.tanh(x @ w)" in text
    assert "no step-time estimate: XLA:TPU refused to compile this step, so there are no FLOPs" in text
    assert "give --hardware" not in text


def test_compare_gives_the_failing_layout_its_figures(square):
    mesh = square["mesh"]
    layouts = {"replicated": (mesh, {}, {}), "split": (mesh, {"x": ("data", None)}, {})}
    rows = {r.label: r for r in compare_cell(STEP, square, layouts, hardware="tpu-v5e", topology="2x2")}
    assert rows["split"].plan.fits is True
    failing = rows["replicated"]
    assert failing.plan is not None and failing.plan.fits is False and failing.plan.refused
    assert failing.plan.peak.largest.bytes == N * N * 4
    from jaxpar_magic.stages.plan.compare import comparison_state

    text = plan_view.to_text(comparison_state("compare", list(rows.values()), failing.plan.hardware))
    line = next(t for t in text.splitlines() if t.startswith("replicated"))
    assert "16.0 GiB" in line and "DOES NOT FIT" in line and "4.0 GiB" in text, text
