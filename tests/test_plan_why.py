"""What a plan adds to the compiled program's figures (issue 42), each against that program's own text:
why each collective is there, XLA's partitioner warnings as rows (and never on the process's stderr),
the inputs a cell hands back in another layout, calls per trip of a loop XLA cannot bound (and at most,
where its condition says), a summary by op and axis past a screenful, a pipeline's bubble, outputs at
the peak named as outputs, and one ICI time per program whatever the mesh's axes are called.
XLA:CPU, 8 simulated devices; XLA:TPU's cases are in test_tpu_plans.py and test_tpu_census.py."""
from __future__ import annotations

import html
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh, plan
from jaxpar_magic.stages.plan.hardware import PROFILES
from jaxpar_magic.stages.plan.topology import collective_time, placed, topology_for
from jaxpar_magic.views import plan as plan_view
from test_plan_differential import census


def _plan(source, ns, mesh, **kw):
    return jaxpar_magic.plan_cell(source, {"jax": jax, "jnp": jnp, "lax": lax, **ns}, mesh=mesh, bind=False, **kw)


def _instruction(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if re.match(rf"\s*(?:ROOT )?%?{re.escape(name)} = ", line))


# --- why ---------------------------------------------------------------------------------------------

def test_each_collective_says_why_in_the_programs_terms():
    mesh = make_mesh("data=4 model=2", axis_types="auto")
    ns = {"x": plan((512, 1024), "float32", mesh, ("data", None)), "w": plan((1024, 4096), "float32", mesh, ("data", "model"))}
    planned = _plan("h = x @ w\ny = jnp.tanh(h).sum(axis=0)\n", ns, mesh)
    text = planned.compiled.as_text()
    assert planned.collectives
    for c in planned.collectives:
        line = _instruction(text, _name_of(planned, c))
        op_name = re.search(r'op_name="[^"]*/([\w.]+)"', line).group(1)
        assert c.why["op"] == op_name and c.why["text"].startswith(op_name)  # the op the program names for it
        dims = re.search(r"dimensions=\{(\d+)", line)
        if c.op == "all-gather":  # the program's own dimension and axes: needed whole, split over them
            assert c.why["needed"] == f"dimension {dims.group(1)} whole"
            assert c.why["before"] == f"dimension {dims.group(1)} split over " + " x ".join(map(repr, c.axes))
        if c.op == "all-reduce":
            assert c.why["needed"] == "the sum on every device" and "partial sum" in c.why["text"]
    gather = next(c for c in planned.collectives if c.op == "all-gather")
    assert gather.line == 1 and gather.why["text"].startswith("dot_general at line 1 needs w's dimension 0 whole")
    shown = " ".join(plan_view.to_text(planned.state("why")).split())
    assert f"why: {gather.why['text']}" in shown
    assert html.escape(f"why: {gather.why['text']}") in plan_view.to_html(planned.state("why"))


def _name_of(planned, c):
    """The compiled instruction a planned collective is (the plan keeps rows in program order)."""
    from jaxpar_magic.cell.hlo import collectives

    found = collectives(planned.compiled.as_text())
    return found[planned.collectives.index(c)].name


def test_a_collective_the_cell_writes_says_the_cell_asks_for_it():
    mesh = make_mesh("data=8", axis_types="auto")
    planned = _plan("y = lax.psum(x, 'data')\n", {"x": plan((64, 8), "float32", mesh, ("data", None))}, mesh,
                    magic="shard_map", in_specs={"x": P("data")}, out_specs={"y": P("data")})
    (c,) = planned.collectives
    assert c.why == {"op": "psum", "asked": True, "operand": "x", "before": "partial sums over 'data'",
                     "needed": "the sum on every device", "text": "the cell asks for it: psum at line 1"}


def test_the_partitioners_warning_is_a_row_of_the_plan_and_not_on_stderr(capfd):
    # The sharding chapter's explorer check printed XLA's C++ warning above its verdict (issue 41).
    loose = make_mesh("data=2 model=4", axis_types="auto")
    ns = {"xb": plan((512, 1024), "float32", loose, (("data", "model"), None)),
          "wb": plan((1024, 4096), "float32", loose, ("model", "data"))}
    capfd.readouterr()
    planned = _plan("yb = xb @ wb\n", ns, loose)
    assert "Involuntary" not in capfd.readouterr().err  # read from fd 2, where XLA writes it
    (row,) = planned.partitioner
    assert row["what"] == "rematerialization" and row["name"] == "xb"
    assert row["from"] == "P(('data', 'model'))" and "Involuntary full rematerialization" in row["said"]
    assert "cannot go from sharding {devices=[8,1]<=[8]}" in row["said"]
    text = " ".join(plan_view.to_text(planned.state("warned")).split())
    assert "XLA's partitioner cannot go from P(('data', 'model'))" in text
    assert "XLA's partitioner cannot go from" in html.unescape(plan_view.to_html(planned.state("warned")))
    again = _plan("yb = xb @ wb\n", ns, loose)  # a kept compile keeps what XLA said
    assert again.reused and again.partitioner == planned.partitioner


# --- layouts that change -----------------------------------------------------------------------------

def test_a_name_bound_again_in_another_layout_is_listed_against_the_compiled_outputs():
    mesh = make_mesh("data=4 model=2", axis_types="auto")
    params = {"w1": plan((64, 32), "float32", mesh, ("model", "data")), "w2": plan((32, 16), "float32", mesh, (None, "model"))}
    source = ("params = {'w1': jax.lax.with_sharding_constraint(params['w1'] * 2, P(None, 'data')),\n"
              "          'w2': params['w2'] + 1}\n")
    planned = _plan(source, {"params": params, "P": P}, mesh)
    (change,) = planned.layout_changes
    assert change == ("params['w1']", P("model", "data"), P(None, "data"))
    # the oracle: the compiled program's own output sharding for that leaf, against the input's
    shardings = jax.tree.leaves(planned.compiled.output_shardings, is_leaf=lambda s: hasattr(s, "spec"))
    assert any(getattr(s, "spec", None) in (P(None, "data"), P(None, "data", )) for s in shardings)
    state = planned.state("moved")
    assert state["layout_changes"] == [{"name": "params['w1']", "before": str(P("model", "data")),
                                        "after": str(P(None, "data"))}]
    assert f"params['w1'] comes in as {P('model', 'data')} and leaves as" in plan_view.to_text(state)


# --- loops XLA cannot bound ----------------------------------------------------------------------------

UNBOUNDED = """
def inner(j, v):
    return jnp.tanh(lax.psum(v @ w, 'data')) * 0.1 + v
def body(c):
    return c[0] + 1, lax.fori_loop(0, 5, inner, c[1])
def cond(c):
    return (c[0] < 1000) & (jnp.sum(c[1]) > 0.5)
y = lax.while_loop(cond, body, (0, x))[1]
del body, cond, inner
"""


def test_a_loop_xla_cannot_bound_gives_calls_per_trip_and_the_conditions_bound():
    mesh = make_mesh("data=8", axis_types="auto")
    ns = {"x": plan((64, 256), "float32", mesh, ("data", None)), "w": plan((256, 256), "float32", mesh, ())}
    planned = _plan(UNBOUNDED, ns, mesh, magic="shard_map", in_specs={"x": P("data")}, out_specs={"y": P("data")},
                    check_vma=False, hardware="tpu-v5e", compiler="cpu")
    text = planned.compiled.as_text()
    (c,) = planned.collectives
    assert c.count is None
    # the census of the program: the inner loop's known trip count, the outer loop once (as XLA counts its
    # FLOPs), or as many times as the constant its condition compares the counter with
    (bound,) = {int(n) for n in re.findall(r"= s32\[\]\S* constant\((\d+)\)", text) if int(n) > 5}
    assert bound == 1000
    assert c.per_trip == census(_with_trips(text, 1))["all-reduce"] == 5
    assert c.at_most == census(_with_trips(text, bound))["all-reduce"] == 5000
    assert "5 times per trip of a loop XLA cannot bound (at most 5,000 times a step" in c.groups_text
    one = collective_time(planned.topology, "all-reduce", c.axes, c.bytes, c.bytes, c.group_size, c.groups[0])
    assert c.seconds == pytest.approx(5 * one.seconds)  # timed for one trip, as the FLOPs are counted


def _with_trips(text: str, trips: int) -> str:
    """The program with each loop XLA gave no trip count read as `trips` trips."""
    return "\n".join(line + f', backend_config={{"known_trip_count":{{"n":"{trips}"}}}}'
                     if " while(" in line and "known_trip_count" not in line else line for line in text.splitlines())


# --- many collectives, and a pipeline ---------------------------------------------------------------

def test_more_than_a_screen_of_collectives_is_summed_by_op_and_axis():
    mesh = make_mesh("d=8")
    source = ("a = x\nfor _ in range(30):\n    a = jnp.sin(lax.psum(a, 'd'))\n"
              "y = lax.ppermute(a, 'd', [(i, (i + 1) % 8) for i in range(8)])\ndel a\n")
    planned = _plan(source, {"x": plan((8, 4), "float32", mesh, ("d",))}, mesh, magic="shard_map",
                    in_specs={"x": P("d")}, out_specs={"y": P("d")}, check_vma=False, hardware="tpu-v5e")
    kinds = census(planned.compiled.as_text())
    summary = {s["op"]: s for s in planned.state("many")["collective_summary"]}
    assert {op: s["calls"] for op, s in summary.items()} == kinds == {"all-reduce": 30, "collective-permute": 1}
    assert summary["all-reduce"]["bytes"] == 30 * 4 * 4 and summary["all-reduce"]["axes"] == ["d"]
    assert summary["all-reduce"]["seconds"] == pytest.approx(sum(c.seconds for c in planned.collectives if c.op == "all-reduce"))
    text = plan_view.to_text(planned.state("many"))
    assert "by op and axis:" in text and "all-reduce over 'd': 30 instructions, 480 B moved per device" in text


GPIPE = """
S, M = 4, 8
stage = lax.axis_index('stage')
def tick(carry, t):
    state, outs = carry
    inp = jnp.where(stage == 0, x[jnp.minimum(t, M - 1)], state)
    out = jnp.tanh(inp @ w[0])
    outs = outs.at[jnp.clip(t - (S - 1), 0, M - 1)].set(out)
    state = lax.ppermute(out, 'stage', [(i, (i + 1) % S) for i in range(S)])
    return (state, outs), None
(last, outs), _ = lax.scan(tick, (jnp.zeros_like(x[0]), jnp.zeros_like(x)), jnp.arange(M + S - 1))
y = lax.psum(jnp.where(stage == S - 1, outs, 0.0), 'stage')
del tick, last, outs, stage
"""


def test_a_scanned_pipelines_bubble_is_its_ticks_beyond_its_microbatches():
    mesh = make_mesh("stage=4 data=2", axis_types="auto")
    ns = {"x": plan((8, 16, 64), "float32", mesh, (None, "data", None)), "w": plan((4, 64, 64), "float32", mesh, ("stage",))}
    planned = _plan(GPIPE, ns, mesh, magic="shard_map", in_specs={"x": P(None, "data"), "w": P("stage")},
                    out_specs={"y": P(None, "data")}, check_vma=False)
    ticks = int(re.search(r'"known_trip_count":\{"n":"(\d+)"\}', planned.compiled.as_text()).group(1))
    assert ticks == 11
    assert planned.pipeline == {"ticks": 11, "microbatches": 8, "stages": 4, "axis": "stage", "passes": 1, "bubble": 3,
                                "fraction": 3 / 11, "line": 11}
    assert "pipeline bubble: 3 of 11 ticks (27%)" in plan_view.to_text(planned.state("gpipe"))
    ring = _plan("y = lax.ppermute(x, 'stage', [(i, (i + 1) % 4) for i in range(4)])\n", ns, mesh, magic="shard_map",
                 in_specs={"x": P(None, "data")}, out_specs={"y": P(None, "data")}, check_vma=False)
    assert ring.pipeline is None  # a permute without a loop of ticks is no pipeline


# --- outputs at the peak, and the timeline's start -------------------------------------------------

def test_every_buffer_the_program_returns_is_an_output_and_rows_agree_with_the_header():
    mesh = make_mesh("data=8", axis_types="auto")
    params = {k: plan((256, 256), "float32", mesh, ("data",)) for k in ("w", "m", "v")}
    source = ("g = params['w'] * 0.5\n"
              "m = 0.9 * params['m'] + 0.1 * g\nv = 0.99 * params['v'] + 0.01 * g * g\n"
              "params = {'w': params['w'] - 0.1 * m / (jnp.sqrt(v) + 1e-8), 'm': m, 'v': v}\ndel g, m, v\n")
    planned = _plan(source, {"params": params}, mesh)
    text = planned.compiled.as_text()
    root = next(line for line in text.splitlines() if line.lstrip().startswith("ROOT") and " tuple(" in line
                and "ENTRY" in _computation_of(text, line))
    returned = set(re.findall(r"%([\w.\-]+)", root.split(" tuple(", 1)[1]))
    peak = planned.peak
    named = {r.instruction for r in peak.live_rows if r.kind == "output"}
    temporaries = {r.instruction for r in peak.live_rows if r.kind == "temporary"}
    assert not temporaries & returned, "a value the program returns was listed as a temporary"
    later = sum(n for n, what in peak.reserve if what.startswith("outputs written after"))
    assert sum(r.bytes for r in peak.live_rows if r.kind == "output") + later == planned.output_bytes
    assert named or later
    assert peak.start_bytes == sum(r.bytes for r in peak.live_rows if r.kind == "argument") == planned.argument_bytes


def _computation_of(text: str, line: str) -> str:
    before = text[:text.index(line)]
    return next(l for l in reversed(before.splitlines()) if l and not l[0].isspace() and l.rstrip().endswith("{"))


def test_the_timeline_does_not_credit_the_arguments_to_the_first_step():
    # Issue 39: "step 0: +2.1 GiB constant.15": the arguments are live before anything runs.
    mesh = make_mesh("data=8", axis_types="auto")
    planned = _plan("y = jnp.tanh(x @ w)\n", {"x": plan((4096, 512), "float32", mesh, ("data",)),
                                               "w": plan((512, 512), "float32", mesh, ())}, mesh)
    from jaxpar_magic.views.memory import key_steps, section_text

    state = planned.state("t")
    peak = state["peak"]
    assert peak["start_bytes"] == planned.argument_bytes > 0
    first = peak["timeline"][0]
    steps = {s["step"]: s for s in key_steps(peak, count=len(peak["timeline"]))}
    assert first["step"] not in steps or steps[first["step"]]["rise"] == first["bytes"] - planned.argument_bytes
    lines = section_text(plan_view.memory_state(state))
    assert f"  before step 0: {plan_view.format_bytes(planned.argument_bytes)} of arguments, live when the program starts" in lines


# --- one ICI time per program ----------------------------------------------------------------------

class _Devices:
    """Device ids in a grid (what `placed` reads of a simulated mesh: ids and axis names)."""

    def __init__(self, shape, names):
        ids = np.arange(int(np.prod(shape)))
        self.devices = np.array([type("D", (), {"id": int(i)})() for i in ids], dtype=object).reshape(shape)
        self.axis_names = names


def test_one_program_gets_one_ici_time_whatever_its_axes_are_called():
    # Two v5e 4x4 slices: `data=32` and `dcn=2 data=16` are the same devices in the same order. A group of
    # 16 within a slice spans that slice's two ICI axes under either name: it was timed as a line of 16
    # devices on one link under `data=32` (2.80 ms against 1.40 ms in issue 42).
    v5e = PROFILES["tpu-v5e"]
    one = placed(topology_for(v5e, {"data": 32}, "4x4"), _Devices((32,), ("data",)))
    two = placed(topology_for(v5e, {"dcn": 2, "data": 16}, "4x4"), _Devices((2, 16), ("dcn", "data")))
    assert one.places == two.places and len(set(one.places.values())) == 32  # each device at a place of its own
    four = placed(topology_for(v5e, {"a": 2, "b": 2, "c": 16}, "4x4"), _Devices((2, 2, 16), ("a", "b", "c")))
    assert sorted({p[0] for p in four.places.values()}) == [0, 1, 2, 3] and len(set(four.places.values())) == 64
    bytes_ = 64 * 2**20
    for group in (list(range(16)), list(range(16, 32)), list(range(32))):
        a = collective_time(one, "all-reduce", ("data",), bytes_, bytes_, len(group), group)
        b = collective_time(two, "all-reduce", ("data",) if len(group) == 16 else ("dcn", "data"), bytes_, bytes_,
                            len(group), group)
        assert a.seconds == pytest.approx(b.seconds)
    slice_ = collective_time(one, "all-reduce", ("data",), bytes_, bytes_, 16, list(range(16)))
    line = collective_time(one, "all-reduce", ("data",), bytes_, bytes_, 16)  # no group: the old reading
    assert slice_.seconds == pytest.approx(line.seconds / 2)  # two ICI axes, not one link
