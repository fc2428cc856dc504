"""A plan's memory is the program a training loop runs: `--donate` compiled with its aliasing, as
`jax.jit(donate_argnums=...)` compiles it, and said in the view; the rows at the peak add up to the
peak; a step that does not fit still gets its buffers. The oracle is a hand compile of the same
function: `jax.jit(f, donate_argnums=...).lower(...).compile().memory_analysis()`."""
from __future__ import annotations

import html
import textwrap

import jax
import jax.numpy as jnp
import pytest
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.stages.plan.plan import format_bytes
from jaxpar_magic.views import plan as plan_view
from shell_helpers import shown_widgets

UPDATE = """
def update(params, opt, batch):
    grads = jax.grad(lambda p: jnp.mean((jnp.tanh(batch @ p["w1"]) @ p["w2"]) ** 2))(params)
    opt = jax.tree.map(lambda m, g: 0.9 * m + g, opt, grads)
    params = jax.tree.map(lambda w, m: w - 0.01 * m, params, opt)
    return params, opt
"""


def plan_views(ip, line: str, source: str) -> list[dict]:
    with capture_output() as captured:
        ip.run_cell_magic("shard", line, textwrap.dedent(source))
    return [w.state for w in shown_widgets(captured) if type(w).__name__ == "PlanView"]


@pytest.fixture
def mlp(jx):
    with capture_output():
        jx.run_line_magic("mesh", "data=4 model=2 --axis-types auto --no-show")
    mesh = jx.user_ns["mesh"]
    w = NamedSharding(mesh, P(None, "model"))
    params = {"w1": jax.ShapeDtypeStruct((1024, 2048), jnp.float32, sharding=w),
              "w2": jax.ShapeDtypeStruct((2048, 1024), jnp.float32, sharding=NamedSharding(mesh, P("model", None)))}
    jx.push({"jaxpar_magic": jaxpar_magic, "params": params, "opt": dict(params),
             "batch": jax.ShapeDtypeStruct((256, 1024), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))})
    jx.run_cell(UPDATE, store_history=False).raise_error()
    return jx


def hand_compile(ns, donate):
    """The oracle: the user's own function, jitted by hand with the same inputs and donation."""
    mesh = ns["mesh"]
    with jax.set_mesh(mesh):
        lowered = jax.jit(ns["update"], donate_argnums=donate).lower(ns["params"], ns["opt"], ns["batch"])
    return lowered.compile().memory_analysis()


def test_donate_plans_the_aliasing_jit_compiles(mlp):
    donated = jaxpar_magic.plan_cell("params, opt = update(params, opt, batch)", mlp.user_ns, mesh=mlp.user_ns["mesh"],
                                     donate=("params", "opt"), bind=False)
    kept = jaxpar_magic.plan_cell("params, opt = update(params, opt, batch)", mlp.user_ns, mesh=mlp.user_ns["mesh"],
                                  bind=False)
    by_hand, without = hand_compile(mlp.user_ns, (0, 1)), hand_compile(mlp.user_ns, ())
    assert by_hand.alias_size_in_bytes > 0  # the oracle donates: w1, w2 and their moments
    for plan, oracle in ((donated, by_hand), (kept, without)):
        assert plan.alias_bytes == oracle.alias_size_in_bytes
        assert plan.argument_bytes == oracle.argument_size_in_bytes
        assert plan.output_bytes == oracle.output_size_in_bytes
        assert plan.total_bytes == (oracle.argument_size_in_bytes + oracle.output_size_in_bytes
                                    + oracle.temp_size_in_bytes - oracle.alias_size_in_bytes)
    assert donated.total_bytes < kept.total_bytes
    assert donated.donated == ("params", "opt") and kept.donated == ()


def test_the_view_says_what_was_donated(mlp):
    (state,) = plan_views(mlp, "--plan --mesh mesh --donate params opt", "params, opt = update(params, opt, batch)")
    said = " ".join(state["memory"]["notes"])
    assert state["memory"]["donated"] == ["params", "opt"]
    assert "donated: params, opt" in said and "counted once" in said
    text = plan_view.to_text(state)
    html = plan_view.to_html(state)
    assert "donated: params, opt" in text and "donated: params, opt" in html


def test_advice_is_computed_from_the_buffers_at_the_peak(mlp):
    # Issue 42: "To make it fit" was the same four remedies every time. Now each piece is computed from
    # the peak's rows, with the bytes it saves, and only where it can help.
    ns, mesh = mlp.user_ns, mlp.user_ns["mesh"]
    line = "params, opt = update(params, opt, batch)"
    plan = jaxpar_magic.plan_cell(line, ns, mesh=mesh, hardware="h100", device_memory="1MiB", bind=False)
    assert plan.fits is False and plan.compiler == "XLA:CPU"
    rows = plan.peak.live_rows
    assert sum(r.bytes for r in rows) == plan.peak.live  # every live buffer, ungrouped
    by_kind = {a.kind: a for a in plan.advice}
    # donation: the new params and moments (outputs at the peak) have their old values' shapes
    arguments = [r for r in rows if r.kind == "argument" and r.name.startswith(("params", "opt"))]
    outputs = [r for r in rows if r.kind == "output"]
    assert outputs, "the update's outputs are live at the peak"
    pairs = sorted((r.dtype, r.shape) for r in outputs)
    matched = sum(min(o.bytes, next(a.bytes for a in arguments if (a.dtype, a.shape) == (o.dtype, o.shape)))
                  for o in outputs if (o.dtype, o.shape) in {(a.dtype, a.shape) for a in arguments})
    assert pairs and by_kind["donate"].bytes == matched > 0
    assert "`--donate opt params`" in by_kind["donate"].text
    # sharding: w1 is P(None, 'model') and w2 P('model', None): each copied on the 4 devices of 'data';
    # the batch, P('data', None), on the 2 of 'model'
    (batch,) = [r for r in rows if r.kind == "argument" and r.name == "batch"]
    assert by_kind["shard"].bytes == int(sum(a.bytes * 3 / 4 for a in arguments) + batch.bytes / 2)
    assert "recompute" not in by_kind or by_kind["recompute"].bytes > 0  # never advice that saves nothing
    assert [a.bytes for a in plan.advice] == sorted((a.bytes for a in plan.advice), reverse=True)
    note = next(n for n in plan.memory_notes() if n.startswith("To make it fit"))
    assert all(a.text in note for a in plan.advice) and format_bytes(matched) in note
    # Donated, the advice to donate is gone: it cannot help any more; and what it saved is (at most) what
    # it said it would, against the program compiled with the aliasing.
    donated = jaxpar_magic.plan_cell(line, ns, mesh=mesh, hardware="h100", device_memory="1MiB", bind=False,
                                     donate=("params", "opt"))
    assert "donate" not in {a.kind for a in donated.advice}
    assert 0 < plan.total_bytes - donated.total_bytes <= matched
    text = plan_view.to_text(plan.state("too big"))
    assert "DOES NOT FIT" in text and "What fills memory at the peak" in text and "To make it fit: donate" in text


def small_dump():
    """A hand-made buffer assignment: an HBM temporary arena of 100 bytes holding two values at once
    at the same offset (70 and 60 bytes: an in-place view), and 40 bytes of VMEM."""
    from jaxpar_magic.cell.xla_dump import Allocation, BufferDump, Value

    allocations = {0: Allocation(0, 100, "temp"), 1: Allocation(1, 40, "temp", color=1)}
    values = [Value("a", "{}", 0, 0, 70, "f32[10,7]"), Value("b", "{}", 0, 0, 60, "f32[15]"),
              Value("v", "{}", 1, 0, 40, "f32[10]")]
    ranges = {"a{}": (0, 2), "b{}": (1, 2), "v{}": (0, 1)}
    return BufferDump(allocations, values, ["a", "b", "c"], ranges, 2, {0: "default", 1: "vmem"})


def test_rows_never_exceed_the_peak_and_a_disagreement_is_said_with_its_size():
    from jaxpar_magic.stages.plan.peak import memory_peak
    from jaxpar_magic.views import memory as memory_view

    peak = memory_peak(small_dump(), [], None, 100)
    assert peak.live == 130 and peak.reported == 100 and peak.reserved_bytes == 0
    assert "30 bytes more than the 100 reported" in peak.disagreement
    assert all(b.space is None for b in peak.buffers) and peak.elsewhere == {"vmem": 40}  # VMEM apart
    state = {"title": "t", "compiler": "XLA:TPU", "capacity": None, "peak": peak.state()}
    assert peak.disagreement in " ".join(memory_view.to_text(state).split())  # wrapped, never cut
    assert "jpm-disagreement" in memory_view.to_html(state)
    fits = memory_peak(small_dump(), [], None, 140)
    assert fits.disagreement is None and sum(b.bytes for b in fits.buffers) + fits.other_bytes + fits.reserved_bytes == 140


def test_a_cpu_plan_of_a_bf16_step_says_how_much_of_its_peak_is_f32_copies(jx):
    """A step held entirely in bf16 (its loss too): every f32 buffer XLA:CPU keeps at the peak is one of
    its upcast copies, so the oracle is the f32 buffers live at the peak, read from the rows."""
    from jaxpar_magic.stages.plan import peak as peak_module
    from jaxpar_magic.stages.plan.plan_program import compile_plan

    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def step(w1, w2, x):
        def loss(w1, w2):
            return jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2))
        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - g1, w2 - g2

    def spec(shape, *axes):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P(*axes)))

    args = (spec((512, 2048)), spec((2048, 512)), spec((4096, 512), "data"))
    original = peak_module.MAX_ROWS, peak_module.MIN_SHARE
    peak_module.MAX_ROWS, peak_module.MIN_SHARE = 10_000, 0.0  # every live buffer a row, for the oracle
    try:
        plan = compile_plan(step, args, mesh, hardware="h100")
    finally:
        peak_module.MAX_ROWS, peak_module.MIN_SHARE = original
    f32 = [b for b in plan.peak.buffers if b.dtype == "f32"]
    assert plan.peak.other_count == 0 and f32
    assert plan.peak.upcast_bytes == sum(b.bytes for b in f32) and plan.peak.upcast_count == len(f32)
    note = next(n for n in plan.memory_notes() if "f32 copies" in n)
    assert note.startswith(f"{format_bytes(plan.peak.upcast_bytes)} of this {format_bytes(plan.total_bytes)} peak")
    assert "f32 copies" in " ".join(plan_view.to_text(plan.state("bf16")).split())  # wrapped at 80 columns


def fsdp_step(params, x):
    mesh = jax.sharding.get_abstract_mesh()
    w = jax.lax.with_sharding_constraint(params["w"], NamedSharding(mesh, P()))  # FSDP: the weight gathered
    return jnp.tanh(x @ w), jax.grad(lambda v: jnp.sum(jnp.tanh(x @ v) ** 2))(params["w"])


def test_rows_say_what_each_buffer_is_for(jx):
    """The gathered weight is named as the all-gather of its parameter (the compiled program's own
    all-gather reads that parameter), the backward pass's all-reduce as the summed gradient; what is not
    named one by one is grouped by what it is and its line, and "other" holds at most 10 % of the peak."""
    from jaxpar_magic.stages.plan.plan_program import compile_plan

    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def spec(shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("data", None)))

    def forward(params, x):
        return fsdp_step(params, x)[0]

    gathered = compile_plan(forward, ({"w": spec((2048, 2048))}, spec((1024, 2048))), mesh, names=["params", "x"])
    text = gathered.compiled.as_text()
    assert "all-gather(" in text or "all-gather-start(" in text
    top = gathered.peak.buffers[0]
    assert (top.role, top.bytes) == ("all-gather of params['w']", 2048 * 2048 * 4)
    trained = compile_plan(fsdp_step, ({"w": spec((2048, 2048))}, spec((1024, 2048))), mesh, names=["params", "x"])
    roles = {b.role for b in trained.peak.buffers}
    assert "gradient summed across devices (all-reduce)" in roles
    for plan in (gathered, trained):
        assert plan.peak.other_bytes <= 0.10 * plan.peak.reported
        shown = plan_view.to_text(plan.state("roles"))
        assert "all-gather of params['w']" in shown or plan is trained


def test_the_static_timeline_draws_its_bars_as_the_live_view_does():
    """The static form (what an untrusted notebook keeps) draws each bar as a block of its height
    inside a table row, every style inline and kept by JupyterLab's sanitizer; before, its bars were
    bare spans whose styles lived only in js/views.css, so the page read "step 0the schedulestep 2"."""
    import re

    from sample_states import plan_state
    from sanitizer_rules import rejected_declarations

    from jaxpar_magic.stages.plan.peak import memory_peak
    from jaxpar_magic.views import PlanView

    state = plan_state()
    state["peak"] = memory_peak(small_dump(), [], None, 140).state()
    view = PlanView(state=state)
    page = view.to_html()
    view.close()
    bars = re.findall(r'<span class="jpm-tl-bar[^"]*" style="([^"]*)"', page)
    assert len(bars) == len(state["peak"]["timeline"]) == 3
    assert all("display:block" in b.replace(" ", "") and re.search(r"height:\s*\d+px", b) for b in bars), bars
    heights = [int(re.search(r"height:\s*(\d+)px", b).group(1)) for b in bars]
    assert heights == [round(96 * p["bytes"] / 140) for p in state["peak"]["timeline"]]  # the top: the 140 B peak
    assert re.search(r'<table class="jpm-tl-axis" style="[^"]*display:\s*table', page)
    styles = re.findall(r'style="([^"]*)"', page)
    assert not sorted({d for s in styles for d in rejected_declarations(s)})


def test_a_plan_served_from_the_kept_compiles_says_it_is_reused_and_the_twins_share_them(mlp):
    """The magic, plan_cell and compare_cell keep one set of compiled plans: planning the same program
    for the same devices again compiles nothing, and the view says so instead of 'compiled in'."""
    from jaxpar_magic.stages.plan.compare import compare_cell
    from jaxpar_magic.stages.plan.compiled_plans import forget

    forget()  # earlier tests planned this cell too
    cell = "params, opt = update(params, opt, batch)"
    (first,) = plan_views(mlp, "--plan --mesh mesh", cell)
    (again,) = plan_views(mlp, "--plan --mesh mesh", cell)
    assert (first["compiled"], again["compiled"]) == ("compiled", "reused")
    assert "reused an earlier plan's compile" in plan_view.to_text(again)
    assert "reused an earlier plan's compile" in html.unescape(plan_view.to_html(again))
    twin = jaxpar_magic.plan_cell(cell, mlp.user_ns, mesh=mlp.user_ns["mesh"], bind=False)
    assert twin.reused
    mesh = mlp.user_ns["mesh"]
    (row,) = compare_cell(cell, mlp.user_ns, {"same": (mesh, {}, {})})
    assert row.plan.reused and row.plan.total_bytes == twin.total_bytes


def test_out_takes_a_pytree_of_specs_and_the_plan_keeps_the_pinned_layouts(jx):
    """`--out state=@specs` pins each leaf of `state` (the compiler would choose otherwise: a P() scale
    next to a model-sharded weight comes back sharded), in a run and in a plan, whose `_plan.abstract`
    then carries the pinned layouts to the next plan; a spec tree of another structure is a UsageError."""
    from IPython.core.error import UsageError

    with capture_output():
        jx.run_line_magic("mesh", "data=4 model=2 --axis-types auto --no-show")
    mesh = jx.user_ns["mesh"]
    jx.push({"state": {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P(None, "model"))),
                       "scale": jax.ShapeDtypeStruct((512,), jnp.float32, sharding=NamedSharding(mesh, P("model")))},
             "specs": {"w": P("data", "model"), "scale": P()}, "wrong": [P(), P()]})
    cell = "state = {'w': state['w'] * 2, 'scale': state['scale'] + 1}\n"
    free = plan_views(jx, "--plan --mesh mesh", cell)
    assert free and jx.user_ns["_plan"].abstract["state"]["scale"].sharding.spec == P("model")  # the compiler's
    plan_views(jx, "--plan --mesh mesh --out state=@specs", cell)
    pinned = jx.user_ns["_plan"].abstract["state"]
    assert {k: v.sharding.spec for k, v in pinned.items()} == {"w": P("data", "model"), "scale": P()}
    with capture_output():
        jx.run_cell_magic("shard", "--mesh mesh --out state=@specs --no-show",
                          "state = {'w': jnp.ones((256, 512)), 'scale': jnp.ones(512)}\n")
    assert {k: v.sharding.spec for k, v in jx.user_ns["state"].items()} == {"w": P("data", "model"), "scale": P()}
    before = dict(jx.user_ns)
    with pytest.raises(UsageError, match="does not match 'state'"), capture_output():
        jx.run_cell_magic("shard", "--mesh mesh --out state=@wrong", cell)
    assert jx.user_ns["state"] is before["state"]


def scan_layer(h, w):
    return jnp.tanh(h @ w), None  # the scan body's line: what each trip saves for the backward pass


def scan_step(w, x):
    return jax.grad(lambda v: jnp.sum(jax.lax.scan(scan_layer, x, v)[0] ** 2))(w)


def scan_args(dtype):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    w = jax.ShapeDtypeStruct((8, 512, 512), dtype, sharding=NamedSharding(mesh, P()))
    return mesh, (w, jax.ShapeDtypeStruct((1024, 512), dtype, sharding=NamedSharding(mesh, P("data", None))))


def test_a_scans_stacked_residuals_are_activations_saved_over_its_trips_at_the_body_line():
    """Issue 29 item 11: a lax.scan's saved activations (the forward loop's results, one slice written a
    trip) read 'temporary from while' with the grad's line. Oracle: the compiled program's own forward
    while, its known_trip_count and the f32[8,128,512] elements of its state."""
    import inspect
    import re

    from jaxpar_magic.stages.plan.plan_program import compile_plan

    mesh, args = scan_args(jnp.float32)
    plan = compile_plan(scan_step, args, mesh, names=["w", "x"])
    text = plan.compiled.as_text()
    (forward,) = [line for line in text.splitlines() if " while(" in line and "transpose(" not in line]
    trips = int(re.search(r'"known_trip_count":\{"n":"(\d+)"\}', forward).group(1))
    stacked = [b for b in plan.peak.buffers if b.shape == (trips, 128, 512)]
    assert trips == 8 and len(stacked) >= 2
    body_line = inspect.getsourcelines(scan_layer)[1] + 1
    for b in stacked:
        assert b.role == "activation saved for the backward pass, stacked over 8 trips", b
        assert b.line == body_line, b
    shown = " ".join(plan_view.to_text(plan.state("scan")).split())
    assert "activation saved for the backward pass, stacked over 8 trips" in shown and "from while" not in shown


def test_xla_cpus_fusions_and_f32_copies_have_a_line_and_say_what_they_are():
    """Issue 29 item 11: XLA:CPU's fusions with no metadata of their own (its converts to f32) had no
    line and read 'temporary from fusion'. Each temporary at the peak now has a line (from the fused
    computation's operations, else from the value it converts), and an f32 copy of a bf16 value says so;
    what is not named one by one is grouped so "other" holds at most 10 % of the peak."""
    from jaxpar_magic.stages.plan.plan_program import compile_plan

    mesh, args = scan_args(jnp.bfloat16)
    plan = compile_plan(scan_step, args, mesh, names=["w", "x"], hardware="h100")
    temporaries = [b for b in plan.peak.buffers if b.kind == "temporary" and b.count == 1 and b.bytes > 4]
    computed = [b for b in temporaries if not (b.role or "").startswith("copy of") and not (b.role or "").endswith(" of w")]
    assert computed and all(b.line is not None for b in computed), computed  # copies of an argument have no line
    assert not [b for b in temporaries if b.op == "fusion"]
    copies = [b for b in temporaries if b.role and b.role.startswith("XLA:CPU's f32 copy (bf16 in the program)")]
    assert copies and all(b.dtype == "f32" for b in copies)
    assert plan.peak.other_bytes <= 0.10 * plan.peak.reported


def test_memory_spaces_beyond_hbm_are_said_in_words_never_by_xlas_names():
    """Issue 29 item 11: XLA:TPU's memory-usage report names its spaces 'vmem', 'smem' and 'color_6'
    (measured on v5e: 112 MiB, 80 B, 1 KiB for an MLP); the notes said 'on-chip SMEM' and 'on-chip
    COLOR_6'. Host memory is no device memory and is not said."""
    from types import SimpleNamespace

    from jaxpar_magic.stages.plan.plan_program import other_spaces

    peak = SimpleNamespace(elsewhere={"vmem": 117440512, "smem": 80, "host": 4096, "color_6": 1024, "color_7": 1024})
    notes = other_spaces(SimpleNamespace(peak=peak, xla_peak_bytes=None), SimpleNamespace(compiler="XLA:TPU"))
    text = " ".join(notes)
    assert "on-chip vector memory (VMEM)" in text and "on-chip scalar memory (SMEM)" in text
    assert "2.0 KiB in 2 more memory spaces it names only by number" in text
    assert "color" not in text.lower() and "host" not in text and len(notes) == 3
    assert all("not HBM: outside these figures and the fit" in n for n in notes)


def test_a_plan_with_out_names_compiles_the_program_the_run_runs(mlp):
    """`--out params2` makes every other name the cell assigns a temporary of the run's program; a plan
    compiled them all as outputs (8 MiB more per device here). Oracle: the same body jitted by hand,
    returning only params2."""
    cell = "g = jax.tree.map(lambda w: w * 2, params)\nparams2 = jax.tree.map(lambda w, v: w + v, params, g)\n"
    plan_views(mlp, "--plan --mesh mesh --out params2", cell)
    planned = mlp.user_ns["_plan"]
    ns = mlp.user_ns

    def body(params):
        g = jax.tree.map(lambda w: w * 2, params)
        return jax.tree.map(lambda w, v: w + v, params, g)

    with jax.set_mesh(ns["mesh"]):
        hand = jax.jit(body).lower(ns["params"]).compile().memory_analysis()
    assert set(planned.abstract) == {"params2"}
    assert planned.output_bytes == hand.output_size_in_bytes
    plan_views(mlp, "--plan --mesh mesh", cell)
    assert mlp.user_ns["_plan"].output_bytes == 2 * hand.output_size_in_bytes  # g and params2, as a run without --out
