"""What fills memory at the peak (stages/plan/peak.py) and the memory timeline, on XLA:CPU.

Checked against what is known by construction: a deliberately huge `h = x @ w1` on line 2 is the
largest buffer, with its bytes and its line; the rows add up to the plan's reported peak; the plan's
memory figures equal `compiled.memory_analysis()` of the same function compiled by hand; the
collectives equal the compiled program's text. The XLA:TPU twins are in test_tpu_plans.py.
"""
from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh, plan
from jaxpar_magic.stages.plan.plan_program import compile_plan
from jaxpar_magic.views import memory as memory_view, plan as plan_view

ROWS, WIDE = 1024, 16384  # per device: h is f32[1024, 16384], 64 MiB


@pytest.fixture(scope="module")
def flat():
    return make_mesh("data=8", axis_types="auto")


@pytest.fixture(scope="module")
def huge(flat):
    """One plan shared by the tests below: a cell whose line 2 makes a 64 MiB array per device."""
    ns = {"jnp": jnp, "x": plan((8 * ROWS, 256), "float32", flat, ("data", None)),
          "w1": plan((256, WIDE), "float32", flat, (None, None)), "w2": plan((WIDE, 8), "float32", flat, (None, None))}
    source = "scale = 2.0\nh = x @ w1\nout = jnp.tanh(h * scale) @ w2\n"
    return jaxpar_magic.plan_cell(source, ns, mesh=flat, bind=False, hardware="h100")


def rows_total(peak) -> int:
    assert sum(n for n, _ in peak.reserve) == peak.reserved_bytes
    return sum(b.bytes for b in peak.buffers) + peak.other_bytes + peak.reserved_bytes


def test_the_huge_array_on_line_2_is_named_with_its_bytes_and_its_line(huge):
    h = next(b for b in huge.peak.buffers if b.line == 2)
    assert h.bytes == ROWS * WIDE * 4 == max(b.bytes for b in huge.peak.buffers)
    assert (h.dtype, h.shape) == ("f32", (ROWS, WIDE))
    assert h.source == "h = x @ w1" and h.op == "dot_general"
    assert h.kind == "output" and h.name == "h"  # the cell assigns it
    assert huge.summary().count("largest buffer 64.0 MiB") == 1


def test_a_temporary_inside_a_function_is_named_by_its_own_file_and_line(flat):
    def step(x, w1, w2):
        scaled = x * 2.0
        h = scaled @ w1  # the function's second line: the huge temporary
        return jnp.tanh(h) @ w2

    x = plan((8 * ROWS, 256), "float32", flat, ("data", None))
    w1, w2 = plan((256, WIDE), "float32", flat, ()), plan((WIDE, 8), "float32", flat, ())
    result = compile_plan(step, (x, w1, w2), flat)
    top = result.peak.buffers[0]
    assert top.bytes == ROWS * WIDE * 4 and top.kind == "temporary"
    assert top.line == step.__code__.co_firstlineno + 2 and "h = scaled @ w1" in top.source
    names = {b.name for b in result.peak.buffers if b.kind == "argument"}
    assert names == {"w1", "w2", "x"}  # arguments named by the function's own parameters


def test_the_rows_add_up_to_the_reported_peak(huge, flat):
    assert rows_total(huge.peak) == huge.total_bytes == huge.peak.reported
    small = compile_plan(lambda a, b: (a @ b).sum(axis=0), (plan((64, 32), "float32", flat, ("data",)),
                                                              plan((32, 16), "float32", flat, ())), flat)
    assert rows_total(small.peak) == small.total_bytes


def test_memory_figures_are_what_memory_analysis_says_for_the_same_compile_by_hand(flat):
    def step(params, x):
        def loss(p):
            return jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"])
        return jax.grad(loss)(params)

    params = {"w1": plan((256, 512), "float32", flat, (None, "data")), "w2": plan((512, 8), "float32", flat, ("data", None))}
    x = plan((64, 256), "float32", flat, ("data", None))
    planned = compile_plan(step, (params, x), flat)
    by_hand = jax.jit(step).lower(params, x).compile().memory_analysis()
    assert (planned.argument_bytes, planned.output_bytes, planned.temp_bytes, planned.alias_bytes) == (
        by_hand.argument_size_in_bytes, by_hand.output_size_in_bytes, by_hand.temp_size_in_bytes,
        by_hand.alias_size_in_bytes)
    assert planned.total_bytes == (by_hand.argument_size_in_bytes + by_hand.output_size_in_bytes
                                   + by_hand.temp_size_in_bytes - by_hand.alias_size_in_bytes)


def test_collectives_are_those_of_the_compiled_text(flat):
    x = plan((64, 32), "float32", flat, ("data", None))
    result = compile_plan(lambda a: (a.sum(axis=0), jnp.concatenate([a, a])[::2].sum()), (x,), flat)
    text = result.compiled.as_text()
    listed = re.findall(r"=\s*\S.*?\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(",
                        text)
    assert sorted(c.op for c in result.collectives) == sorted(listed)


def test_plan_rows_name_each_all_reduces_reduction_as_the_collectives_view_does(flat):
    x = plan((64, 32), "float32", flat, ("data", None))
    result = compile_plan(lambda a: (a.sum(axis=0), a.max(axis=0)), (x,), flat)
    assert sorted(c.reduction for c in result.collectives if c.op == "all-reduce") == ["max", "sum"]
    state = result.state("reductions")
    text, html = plan_view.to_text(state), plan_view.to_html(state)
    for words in ("all-reduce (sum)", "all-reduce (max)"):
        assert words in text and f">{words}</td>" in html


FSDP = '''def loss(p, x):
    return jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"])
grads = jax.grad(loss)(params, x)
params = jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)
'''


def test_fsdp_gradient_is_the_reduce_scatter_the_target_makes(flat):
    """XLA:CPU sums each gradient whole and keeps each device's shard: the plan shows and costs the
    reduce-scatter XLA:GPU and XLA:TPU make of it, and says so."""
    ns = {"jnp": jnp, "jax": jax, "x": plan((64, 256), "float32", flat, ("data", None)),
          "params": {"w1": plan((256, 512), "float32", flat, ("data", None)),
                     "w2": plan((512, 128), "float32", flat, ("data", None))}}
    result = jaxpar_magic.plan_cell(FSDP, ns, mesh=flat, hardware="h100", bind=False)
    scattered = [c for c in result.collectives if c.op == "reduce-scatter"]
    assert scattered and all(c.sliced_from == "all-reduce" for c in scattered)
    w2 = 512 * 128 * 4  # XLA:CPU sums w2's whole f32 gradient on the 8 devices, then each keeps 1/8
    assert [(c.shape, c.operand_bytes, c.bytes) for c in scattered] == [("f32[128,64]", w2, w2 // 8)]
    assert scattered[0].traffic_bytes == pytest.approx(w2 * 7 / 8)  # a ring passes 7/8 of the whole array
    assert not any(c.op == "all-reduce" for c in result.collectives)  # none left: no 256 KiB all-reduce
    assert any("reduce-scatter creator" in c for c in result.caveats)
    state = result.state("fsdp")
    text = plan_view.to_text(state)
    assert "reduce-scatter (sum) (XLA:CPU: all-reduce + slice)" in text
    assert "reduce-scatter (sum) *" in plan_view.to_html(state)


def test_a_cell_with_jax_checkpoint_says_xla_cpu_undoes_it_and_how_to_get_the_tpu_compile(flat):
    ns = {"jnp": jnp, "jax": jax, "x": plan((64, 256), "float32", flat, ("data", None)),
          "w": plan((256, 256), "float32", flat, ())}
    # `del block`: a function closing over the cell's traced `w` may not leave the cell (issue 33 item 5)
    source = ("block = jax.checkpoint(lambda h: jnp.tanh(h @ w))\ng = jax.grad(lambda v: block(block(v)).sum())(x)\n"
              "del block\n")
    result = jaxpar_magic.plan_cell(source, ns, mesh=flat, hardware="tpu-v5e", bind=False)
    first = result.caveats[0]
    assert "jax.checkpoint" in first and "XLA:CPU undoes it" in first
    assert 'pip install "jaxpar_magic[tpu]"' in first and "--topology" in first
    plain = jaxpar_magic.plan_cell("g = jax.grad(lambda v: jnp.tanh(v @ w).sum())(x)\n", ns, mesh=flat,
                                   hardware="tpu-v5e", bind=False)
    assert not any("jax.checkpoint" in c for c in plain.caveats)


SCANNED = """def block(h, w):
    a = jnp.tanh(h @ w[0])
    return jnp.tanh(a @ w[1])
def body(h, w):
    with jax.named_scope("layer"):  # a name scope (or a vmap) inside the body, as model libraries add
        return BLOCK(h, w), None
def loss(ws, x):
    return jnp.mean(jax.lax.scan(body, x, ws)[0] ** 2)
grads = jax.grad(loss)(ws, x)
"""


def test_jax_checkpoint_inside_lax_scan_is_kept_by_xla_cpu_and_gets_no_caveat(flat):
    """Inside a loop's body XLA:CPU keeps the recomputation: the peak drops, and the plan must not say
    that XLA:CPU undid it."""
    import numpy as np
    from jax.sharding import Mesh

    one = Mesh(np.array(jax.devices()[:1]), ("data",))
    ns = {"jnp": jnp, "jax": jax, "x": plan((1024, 128), "float32", one, ("data", None)),
          "ws": (plan((3, 128, 512), "float32", one, ()), plan((3, 512, 128), "float32", one, ()))}
    plain, checkpointed = (jaxpar_magic.plan_cell(SCANNED.replace("BLOCK", b), ns, mesh=one, bind=False)
                           for b in ("block", "jax.checkpoint(block)"))
    assert checkpointed.total_bytes < plain.total_bytes  # the activations of the 3 steps are not kept
    assert not any("jax.checkpoint" in c for c in checkpointed.caveats + plain.caveats)


def test_the_timeline_peaks_where_the_breakdown_is_taken(huge):
    peak = huge.peak
    assert max(p["bytes"] for p in peak.timeline) == peak.live
    assert any(p["step"] == peak.step for p in peak.timeline)
    assert len(peak.timeline) <= 120 and peak.steps >= len(peak.timeline)
    assert all(0 <= p["at"] < len(peak.places) for p in peak.timeline)
    assert json.loads(json.dumps(peak.state())) == peak.state()


def test_views_show_the_peak_in_html_and_in_text_within_80_columns(huge):
    state = huge.state("%%shard --plan")
    html = plan_view.to_html(state)
    assert "What fills memory at the peak" in html and "h = x @ w1" in html and "jpm-timeline" in html
    assert "compiled by XLA:CPU for 8 simulated CPU devices" in html
    memory = plan_view.memory_state(state)
    lines = memory_view.section_text(memory)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert any("64.0 MiB  output h f32[1024,16384], line 2: h = x @ w1" in line for line in lines)
    assert memory_view.to_text({"title": "t", **memory}).startswith("t\nLive memory per device")


def test_a_kept_compile_planned_again_from_other_callers_gives_the_same_figures(flat):
    """A re-plan reuses the compile (compiled_plans.py), whose program names the first plan's callers;
    the figures must not depend on them (XLA:CPU's bf16 upcast was missed: twice the memory time)."""
    ns = {"jnp": jnp, "jax": jax, "w": plan((1024, 4096), "bfloat16", flat, ()),
          "x": plan((256, 1024), "bfloat16", flat, ("data", None))}
    source = "g = jax.grad(lambda w: jnp.sum(jnp.square((x @ w).astype(jnp.float32))))(w)\n"  # a bf16 all-reduce

    def first_caller():
        return jaxpar_magic.plan_cell(source, dict(ns), mesh=flat, hardware="tpu-v5p", bind=False)

    def second_caller():
        return jaxpar_magic.plan_cell(source, dict(ns), mesh=flat, hardware="tpu-v5p", bind=False)

    first, again = first_caller(), second_caller()
    assert again.reused and any("bf16 in f32" in c for c in first.caveats)
    assert again.bytes_accessed == first.bytes_accessed and again.caveats == first.caveats
    assert again.roofline.estimate_s == first.roofline.estimate_s
