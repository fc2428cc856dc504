"""The layout explorer (`%%shard --plan --explore`, `_explorer`, `explore_cell`) through a real
InteractiveShell over 8 simulated devices: its Python side, and its plans against the same layouts
planned as cells with the line it gives (the differential oracle)."""
from __future__ import annotations

import html
import random
import re
import textwrap
import threading

import jax
import jax.numpy as jnp
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.stages.plan import compiled_plans
from shell_helpers import shown_widgets, snapshot

STEP = """
h = jnp.tanh(x @ params['w1'])
y = h @ params['w2']
"""


@pytest.fixture
def cell(jx):
    """A Flax/optax-like params dict and a batch, abstract (nothing allocated), on an Auto mesh."""
    with capture_output():
        jx.run_line_magic("mesh", "data=4 model=2 --axis-types auto --no-show")
    jx.push({"x": jax.ShapeDtypeStruct((64, 128), jnp.float32),
             "params": {"w1": jax.ShapeDtypeStruct((128, 256), jnp.float32),
                        "w2": jax.ShapeDtypeStruct((256, 12), jnp.float32)}})
    return jx


def explore(ip, line: str = "--in x=data,None"):
    with capture_output() as captured:
        ip.run_cell_magic("shard", f"--plan --explore {line}", STEP)
    return ip.user_ns["_explorer"], shown_widgets(captured)


def figures(plan) -> dict:
    """What a plan says, without the compile's own timing."""
    return {"memory": (plan.argument_bytes, plan.output_bytes, plan.temp_bytes, plan.alias_bytes, plan.total_bytes),
            "flops": plan.flops, "bytes_accessed": plan.bytes_accessed, "axes": plan.axes,
            "collectives": [(c.op, c.shape, c.bytes, c.count, c.axes, c.line) for c in plan.collectives],
            "peak": [(b.kind, b.name, b.bytes, b.shape, b.line) for b in plan.peak.buffers]}


def planned_as_cell(ip, ex, source: str = STEP) -> object:
    """The explorer's current layout planned by `%%shard --plan` with `ex.line()`'s options, compiled afresh:
    the line pasted into a cell as it is, nothing bound first (it names no mesh or specs variable)."""
    line = ex.line()
    assert line.startswith("%%shard ") and ex.line_names() == {}
    assert not re.search(r"--mesh mesh\b|=@", line), line
    compiled_plans.forget()  # no kept compile: the cell compiles its own
    with capture_output():
        ip.run_cell_magic("shard", line[len("%%shard "):] + " --no-show", source)
    return ip.user_ns["_plan"]


def test_the_magic_binds_the_explorer_and_shows_its_view(cell):
    before = set(cell.user_ns)
    ex, widgets = explore(cell)
    assert [type(w).__name__ for w in widgets] == ["ExplorerView"]
    assert set(cell.user_ns) - before == {"_explorer"}  # the cell's names (h, y) are not bound
    state = widgets[0].state
    assert [i["name"] for i in state["inputs"]] == ["x", "params['w1']", "params['w2']"]
    assert state["inputs"][0]["spec"] == [["data"], []]
    assert state["inputs"][1]["group"] == "params" and state["inputs"][1]["shape"] == [128, 256]
    assert state["mesh"]["axes"] == [["data", 4], ["model", 2]] and state["mesh"]["types"] == ["Auto", "Auto"]
    assert state["mesh"]["shapes"] == ["data=8,model=1", "data=4,model=2", "data=2,model=4", "data=1,model=8"]
    assert state["plan"]["peak_bytes"] == ex.plan.total_bytes and state["generation"] == 1 == state["compiles"]
    assert state["tried"] == [{"rank": 1, "line": ex.line(), "peak_bytes": ex.plan.total_bytes, "fits": None,
                               "collective_bytes": 0, "estimate_s": None, "bound": None, "current": True,
                               "mesh": "data=4,model=2 Auto"}]


def test_choose_reshape_tried_line_and_best(cell):
    ex, _ = explore(cell)
    first = ex.plan
    tp = ex.choose("params['w1']", P(None, "model"))  # one leaf, by its path
    # Self-contained: the mesh by its shape and axis types, the leaf by its path; nothing to bind first.
    assert ex.line() == ("%%shard --plan --mesh data=4,model=2 --axis-types auto --in x=P('data',None) "
                         "params=P(None,None) params['w1']=P(None,'model')")
    assert ex.line_names() == {}
    assert any(c.group_size > 1 for c in tp.collectives) and tp is not first  # w1 cut: data moves
    ex.choose("params['w2']", P("model", None))
    assert ex.line().endswith("params=P(None,'model') params['w2']=P('model',None)")  # a tie: the first leaf's
    assert len({r.line for r in ex.tried}) == 3  # lines differ
    ex.choose("params", "None,model")  # every leaf of an input, in --in's syntax
    assert ex.line().endswith("params=P(None,'model')") and ex.line_names() == {}
    ex.reshape("data=2,model=4")
    assert ex.plan.axes == {"data": 2, "model": 4}
    assert ex.line() == "%%shard --plan --mesh data=2,model=4 --axis-types auto --in x=P('data',None) params=P(None,'model')"
    tried = ex.tried
    assert len(tried) == 5 and sum(r.plan is ex.plan for r in tried) == 1
    assert [r.peak_bytes for r in tried] == sorted(r.peak_bytes for r in tried)  # no profile: ranked by peak
    assert ex.best() is tried[0]
    assert ex.state()["diff"].startswith("peak ")


def test_the_explorers_plans_equal_the_same_layouts_planned_as_cells(cell):
    """The oracle: `%%shard --plan` with the explorer's line plans the same program, figure for figure."""
    ex, _ = explore(cell)
    layouts = [lambda: None,
               lambda: ex.choose("params['w1']", "P(None,'model')"),  # per-leaf specs: @params_specs
               lambda: ex.reshape("data=8,model=1", axis_types="explicit"),  # inline --mesh (JAX's default type)
               lambda: (ex.choose("params", P()), ex.choose("x", P(("data", "model"), None)))]
    for change in layouts:
        change()
        mine = ex.plan
        assert figures(planned_as_cell(cell, ex)) == figures(mine), ex.line()


def test_a_line_names_the_mesh_by_its_shape_so_a_rebound_mesh_changes_nothing(cell):
    """Issue 40: the line said `--mesh mesh`; after `%mesh` rebound `mesh`, it planned another layout than the
    explorer showed. The oracle: the line planned as a cell after the rebinding, figure for figure."""
    ex, _ = explore(cell)
    ex.choose("params['w1']", P(None, "model"))
    with capture_output():
        cell.run_line_magic("mesh", "data=2 model=4 --no-show")  # `mesh` is now another mesh, of Explicit axes
    again = planned_as_cell(cell, ex)
    assert again.axes == {"data": 4, "model": 2} and figures(again) == figures(ex.plan)
    ex.reshape("data=8,model=1", axis_types="explicit")  # JAX's default type: no --axis-types
    assert " --mesh data=8,model=1 --in " in ex.line()
    assert figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_a_mesh_over_some_devices_is_spelled_with_devices(cell):
    with capture_output():
        cell.run_line_magic("mesh", "data=2 model=2 --devices 4 2 6 0 --axis-types auto --name four --no-show")
        cell.run_cell_magic("shard", "--plan --explore --mesh four --in x=data,None", STEP)
    ex = cell.user_ns["_explorer"]
    assert ex.line().startswith("%%shard --plan --mesh data=2,model=2 --axis-types auto --devices 4 2 6 0 --in ")
    mine = ex.choose("params", P(None, "model"))
    assert [d.id for d in planned_as_cell(cell, ex).mesh.devices.flat] == [4, 2, 6, 0]
    assert figures(planned_as_cell(cell, ex)) == figures(mine)
    ex.reshape("data=4,model=1")  # a new shape over the same devices
    assert "--mesh data=4,model=1 --axis-types auto --devices " in ex.line()
    assert figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_a_mesh_of_mixed_axis_types_is_spelled_one_type_per_axis(cell):
    """A mesh whose axes differ in type (Explicit data, Auto model) was the one mesh a line could not spell:
    it named `mesh_4x2_explicit_auto`, to bind by hand. Now `--axis-types explicit,auto`; the oracle is the
    line planned as a cell (figure for figure) and the mesh it builds against jax.make_mesh's own."""
    import jax

    mixed = jax.make_mesh((4, 2), ("data", "model"),
                          axis_types=(jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto))
    cell.user_ns["mixed"] = mixed
    with capture_output():
        cell.run_cell_magic("shard", "--plan --explore --mesh mixed --in x=data,None", STEP)
    ex = cell.user_ns["_explorer"]
    mine = ex.choose("params", P(None, "model"))
    assert " --mesh data=4,model=2 --axis-types explicit,auto --in " in ex.line() and ex.line_names() == {}
    again = planned_as_cell(cell, ex)
    assert again.mesh.axis_types == mixed.axis_types and figures(again) == figures(mine)
    ex.reshape("data=2,model=4")  # same axes, same types: a new shape keeps them, spelled per axis
    assert " --mesh data=2,model=4 --axis-types explicit,auto --in " in ex.line()
    assert figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_the_explorer_plans_an_abstract_mesh_for_a_slice(cell):
    """Issue 42: `%mesh --abstract` (which --plan takes) was refused. Over an AbstractMesh the explorer plans
    with XLA:TPU for the slice --topology names; its line spells the mesh `--abstract`, and pasted it plans
    the same (the oracle, figure for figure)."""
    from tpu_support import require_libtpu

    with capture_output():
        cell.run_line_magic("mesh", "data=16 model=4 --abstract --axis-types auto --name pod --no-show")
    with pytest.raises(UsageError, match="not an AbstractMesh: simulate them first"):  # XLA:CPU needs devices
        explore(cell, "--mesh pod --in x=data,None")
    require_libtpu()
    ex, (view,) = explore(cell, "--mesh pod --in x=data,None --hardware tpu-v5e --topology 8x8")
    assert view.state["mesh"]["devices"] == 64 and ex.plan.compiler == "XLA:TPU"
    assert ex.line().startswith("%%shard --plan --mesh data=16,model=4 --axis-types auto --abstract --hardware "
                                "tpu-v5e --topology 8x8 --in ")
    ex.choose("params['w1']", "None,model")
    ex.reshape("data=8,model=8")
    assert ex.plan.axes == {"data": 8, "model": 8} and figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_out_names_are_planned_and_kept_in_the_line(cell):
    """`--out y`: the explorer plans only `y` as an output (h is a temporary), as the cell does, and its line says so."""
    ex, _ = explore(cell, "--in x=data,None --out y")
    assert ex.line().endswith("--out y")
    every_name, _ = explore(cell)
    assert ex.plan.output_bytes < every_name.plan.output_bytes  # h is no output
    ex.choose("params['w1']", "P(None,'model')")
    assert "--out y" in ex.line() and figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_a_tried_layout_comes_back_from_the_cache_without_compiling(cell, compiles):
    ex, _ = explore(cell)
    dp = ex.plan
    ex.choose("params", "P(None,'model')")
    count, made = ex.compiles, compiles.count
    again = ex.choose("params", P())  # the first layout again
    assert again is dp and ex.compiles == count and compiles.count == made
    ex.submit({"kind": "restore", "line": ex.tried[-1].line if ex.tried[-1].plan is not dp else ex.tried[0].line})
    assert ex.wait(60) and ex.compiles == count and compiles.count == made


def when(ex, condition) -> threading.Event:
    """An event set (on whichever thread tells the explorer's observers) once `condition(state)` holds."""
    seen = threading.Event()
    ex.observe(lambda state: seen.set() if condition(state) else None)
    return seen


def busy_with(text: str):
    return lambda state: state["status"]["busy"] and text in state["status"]["text"]


def test_changes_made_during_a_compile_are_coalesced_to_the_latest(cell):
    ex, _ = explore(cell)
    compiles, generation = ex.compiles, ex.generation
    started = when(ex, busy_with("params['w1']=P(None,'model')"))
    with ex.holding():  # the compile waits until the test lets it go: deterministic, no timing
        ex.submit({"kind": "choose", "name": "params['w1']", "spec": [[], ["model"]]})
        assert started.wait(120)
        status = ex.state()["status"]
        assert status["busy"] and status["text"].startswith("planning data=4,model=2 params['w1']=P(None,'model')… ")
        ex.submit({"kind": "choose", "name": "params['w2']", "spec": [["model"], []]})
        ex.submit({"kind": "choose", "name": "x", "spec": [["data"], ["model"]]})
        ex.submit({"kind": "choose", "name": "x", "spec": [[], []]})
    assert ex.wait(120)
    assert ex.compiles == compiles + 2 and ex.generation == generation + 2  # the first and the latest only
    specs = {i["name"]: i["spec"] for i in ex.state()["inputs"]}
    assert specs == {"x": [[], []], "params['w1']": [[], ["model"]], "params['w2']": [["model"], []]}
    lines = [r.line for r in ex.tried]
    assert not any("x=P('data','model')" in line for line in lines)  # an intermediate layout: never planned
    assert ex.state()["status"] == {"busy": False, "text": ""}


def test_a_change_made_while_the_next_layout_compiles_adds_to_it(cell):
    """Issue 40: x->data, then w1->model (waiting), then, while w1's layout compiles, w2->model. Every change
    is kept (w1 was lost: the first compile's end took the explorer back to its own layout). The oracle: the
    same choices made one by one, and the explorer's line planned as a cell."""
    ex, _ = explore(cell, "")
    generation = ex.generation
    held = []

    def hold_the_next_compile(state):  # on the worker, as x's layout becomes current: w1's compile waits
        if state["generation"] == generation + 1 and not held:
            held.append(ex.holding())

    ex.observe(hold_the_next_compile)
    compiling_x, compiling_w1 = when(ex, busy_with("x=P('data',None)")), when(ex, busy_with("params['w1']"))
    with ex.holding():
        ex.submit({"kind": "choose", "name": "x", "spec": [["data"], []]})
        assert compiling_x.wait(120)  # x's layout is on the worker: w1's waits behind it
        ex.submit({"kind": "choose", "name": "params['w1']", "spec": [[], ["model"]]})
    assert compiling_w1.wait(120) and held
    assert ex.state()["inputs"][0]["spec"] == [["data"], []]  # x's layout is current
    ex.submit({"kind": "choose", "name": "params['w2']", "spec": [["model"], []]})
    held[0].release()
    assert ex.wait(120) and ex.message is None
    specs = {i["name"]: i["spec"] for i in ex.state()["inputs"]}
    assert specs == {"x": [["data"], []], "params['w1']": [[], ["model"]], "params['w2']": [["model"], []]}
    one_by_one, _ = explore(cell, "")
    one_by_one.choose("x", P("data", None))
    one_by_one.choose("params['w1']", P(None, "model"))
    one_by_one.choose("params['w2']", P("model", None))
    assert one_by_one.layout == ex.layout and figures(one_by_one.plan) == figures(ex.plan)
    assert figures(planned_as_cell(cell, ex)) == figures(ex.plan)


SPECS = [[[], []], [["data"], []], [[], ["model"]], [["model"], []], [[], ["data"]], [["data"], ["model"]]]


@pytest.mark.parametrize("seed", [40, 5, 42])
def test_random_changes_while_compiles_are_held_add_up(cell, seed):
    """Issue 40's differential: random changes from the view, some while compiles are held. Whatever the
    worker's timing, every layout it plans is the sum of a first run of the changes (none lost, none out
    of order), it ends at the sum of them all, and that layout's line, pasted, plans the same figures."""
    rng = random.Random(seed)
    ex, _ = explore(cell, "")
    names = [leaf.label for leaf in ex.leaves]
    layouts = [dict(zip(names, ex.layout.specs))]  # after 0, 1, 2, ... changes
    stops, armed = [], []

    def stop_after_a_plan(state):  # armed: the worker stops as a plan becomes current, before the next one
        if armed and state["generation"] > armed[0]:
            stops.append(ex.holding())
            armed.pop(1).set()
            armed.clear()

    def change():  # one leaf's spec, to a layout not asked for before: each plan that ends is a new current one
        while True:
            name, spec = rng.choice(names), rng.choice(SPECS)
            after = {**layouts[-1], name: tuple(tuple(axes) for axes in spec)}
            if after not in layouts:
                break
        ex.submit({"kind": "choose", "name": name, "spec": spec})
        layouts.append(after)

    ex.observe(stop_after_a_plan)
    for _ in range(4):  # changes while a compile waits, one plan ends, a change while the next one waits
        held = ex.holding()
        for _ in range(rng.randint(1, 3)):
            change()
        ended = threading.Event()
        armed[:] = [ex.generation, ended]
        for hold in [held, *stops]:
            hold.release()
        stops.clear()
        assert ended.wait(120)
        change()
    for hold in stops:
        hold.release()
    assert ex.wait(240) and ex.message is None
    sums = [tuple(layout[n] for n in names) for layout in layouts]
    assert all(row.layout.specs in sums for row in ex.tried), [r.line for r in ex.tried]
    assert ex.layout.specs == sums[-1]
    assert figures(planned_as_cell(cell, ex)) == figures(ex.plan)


def test_an_observer_that_raises_is_said_in_the_view_and_the_explorer_goes_on(cell):
    """Issue 40: a callback that raised ended the worker thread (wait() never True, later changes ignored)."""
    ex, (view,) = explore(cell)

    def broken(state):
        raise RuntimeError("my callback is wrong")

    ex.observe(broken)
    ex.submit({"kind": "choose", "name": "params['w1']", "spec": [[], ["model"]]})
    assert ex.wait(120)
    said = "observe: the callback " + broken.__qualname__ + " raised RuntimeError: my callback is wrong"
    assert ex.message.startswith(said) and "\n" not in ex.message
    assert view.state["message"] == ex.message and ex.generation == 2  # the view was told, the plan made
    ex.submit({"kind": "choose", "name": "params['w2']", "spec": [["model"], []]})  # later changes: planned
    assert ex.wait(120) and ex.generation == 3 and ex.message.startswith(said)
    assert ex.choose("x", P()) is ex.plan and " x=P(None,None) params=" in ex.line()


def test_wrong_choices_say_one_line_and_keep_the_plan(cell):
    ex, _ = explore(cell)
    plan, generation = ex.plan, ex.generation
    with pytest.raises(UsageError, match="mesh axis 'data' is used twice"):
        ex.choose("x", "P('data','data')")
    assert ex.plan is plan and ex.message.startswith("x: mesh axis 'data' is used twice")
    with pytest.raises(UsageError, match=r"dimension 1 has 12 elements, which data=4 x model=2 = 8 devices do not"):
        ex.choose("params['w2']", P(None, ("data", "model")))
    with pytest.raises(UsageError, match="the cell reads no array called that"):
        ex.choose("w3", P())
    assert ex.message.startswith("choose('w3'): ")
    with pytest.raises(UsageError, match=r"^choose\('x'\): entry 2 of 'data,,' is empty; write None"):
        ex.choose("x", "data,,")  # issue 40: read as P('data', None) before, while '(data' was refused
    assert ex.plan is plan and "\n" not in ex.message
    ex.submit({"kind": "choose", "name": "x", "spec": [["nope"], []]})  # from the view: a message, no exception
    assert ex.wait(60) and "'nope' is not an axis of the mesh" in ex.message and "\n" not in ex.message
    assert ex.plan is plan and ex.generation == generation
    ex.choose("x", P(None, "data"))  # a good choice clears the message
    assert ex.message is None


def test_a_layout_the_compiler_refuses_is_a_message(cell):
    ex, _ = explore(cell)
    ex.reshape("data=4,model=2", axis_types="explicit")
    plan, compiles, generation = ex.plan, ex.compiles, ex.generation
    assert ex.line().startswith("%%shard --plan --mesh data=4,model=2 ")  # Explicit: JAX's default, inline
    # Explicit axes: x[64@data, 128] @ w1[128, 256@data] would cut two dimensions of the result over 'data';
    # JAX refuses to trace it without an out_sharding the cell does not give.
    ex.submit({"kind": "choose", "name": "params['w1']", "spec": [[], ["data"]]})  # from the view
    assert ex.wait(120)
    refused = ex.message
    assert refused.startswith("data=4,model=2 (Explicit) params['w1']=P(None,'data'): ") and "\n" not in refused
    # One line, no paragraph of fixes for a cell (out_sharding=..., jax.reshard) and no literal backticks.
    assert re.fullmatch(r"data=4,model=2 \(Explicit\) params\['w1'\]=P\(None,'data'\): on Explicit axes JAX refuses "
                        r"line 1 of the cell \(h = jnp.tanh\(x @ params\['w1'\]\)\): dot_general operation .* produces "
                        r"an illegally sharded result: f32\[64@data,256@data\]\. Try Auto axis types or another layout\.",
                        refused), refused
    assert ex.plan is plan and ex.generation == generation and ex.compiles == compiles + 1
    with pytest.raises(UsageError, match="on Explicit axes JAX refuses") as err:  # synchronously: raised
        ex.choose("params['w1']", P(None, "data"))
    assert " ".join(str(err.value).split()) == refused and ex.plan is plan
    assert ex.compiles == compiles + 1  # the refusal is kept: not compiled again


def test_explorer_operations_leave_the_namespace_alone(cell):
    ex, _ = explore(cell)
    before = snapshot(cell.user_ns)
    ex.choose("params['w1']", P(None, "model"))
    ex.reshape("data=8,model=1")
    ex.submit({"kind": "choose", "name": "x", "spec": [["data"], []]})
    assert ex.wait(120)
    ex.line(), ex.line_names(), ex.tried, ex.best()
    assert snapshot(cell.user_ns) == before


def test_the_view_drives_the_explorer_and_shows_its_states(cell):
    ex, (view,) = explore(cell)
    view._message(view, {"kind": "choose", "name": "params['w1']", "spec": [[], ["model"]]})
    assert ex.wait(120)
    assert view.state["generation"] == 2 and view.state == ex.state()  # set from the worker thread
    view._message(view, {"kind": "unknown"})  # ignored
    text = view.to_text()
    # Every line fits 80 columns but the layouts' lines, each whole on a line of its own, from the first column:
    # a magic's line cannot continue on the next, so copied from a terminal a wrapped one would not run.
    long = [line for line in text.splitlines() if len(line) > 80]
    assert all(line.startswith("%%shard ") for line in long) and long, text
    page = view.to_html()
    for row in ex.tried:
        assert row.line in text.splitlines()
        assert html.escape(row.line) in page
    assert "Tried layouts (2), best first" in text and "Tried layouts (2), best first" in page
    assert "<script" not in page and "style=" in page  # static: inline styles only


def test_explore_cell_is_the_plain_python_twin(cell):
    namespace = dict(cell.user_ns)
    before = snapshot(namespace)
    ex, view = jaxpar_magic.explore_cell(textwrap.dedent(STEP), namespace, in_specs={"x": P("data", None)})
    assert view.state == ex.state() and ex.line() == explore(cell)[0].line()
    ex.choose("params['w2']", P("model", None))
    assert view.state["generation"] == 2 and snapshot(namespace) == before


@pytest.mark.parametrize("magic, line, said", [
    ("shard", "--explore --in x=data,None", "add --plan"),
    ("shard_map", "--plan --explore", "explore this computation as `%%shard --plan --explore"),
    ("pmap", "--plan --explore", "explore this computation as `%%shard --plan --explore"),
    ("shard", "--plan --explore --search x", "use --explore or --search"),
])
def test_explore_elsewhere_is_a_usage_error(cell, magic, line, said):
    before = snapshot(cell.user_ns)
    with pytest.raises(UsageError, match=r"(?s)" + re.escape(said)):
        cell.run_cell_magic(magic, line, STEP)
    assert snapshot(cell.user_ns) == before


def test_a_target_gives_estimates_ranks_by_them_and_can_be_changed(cell):
    ex, (view,) = explore(cell, "--in x=data,None --hardware tpu-v5e")
    state = view.state
    assert state["target"]["hardware"] == "tpu-v5e" and state["target"]["topology"] is None
    assert "tpu-v5p" in state["target"]["options"]["hardware"]
    assert state["plan"]["estimate_s"] == ex.plan.roofline.estimate_s and state["plan"]["bound"] is not None
    assert state["plan"]["capacity_bytes"] == ex.plan.capacity and state["plan"]["fits"] is True
    ex.choose("params['w1']", P(None, "model"))
    assert "estimate " in ex.state()["diff"]
    v5p = ex.retarget(hardware="tpu-v5p")
    assert v5p.hardware.name == "tpu-v5p" and ex.line().split()[:8] == [
        "%%shard", "--plan", "--mesh", "data=4,model=2", "--axis-types", "auto", "--hardware", "tpu-v5p"]
    tried = ex.tried
    assert [r.estimate_s for r in tried] == sorted(r.estimate_s for r in tried)  # with a profile: by estimate
    assert figures(planned_as_cell(cell, ex)) == figures(v5p)


def test_one_unit_per_figure_readable_sizes_and_singular_words(cell):
    """Issue 42: 0.571 ms beside 571 µs, "1 collectives", `--device-memory 50331648`. The summary, the rows
    and the text say each figure with the view's one formatter (views/base.py, the twin of the page's)."""
    from jaxpar_magic.views.base import format_bytes, format_seconds

    ex, (view,) = explore(cell, "--in x=data,None --hardware tpu-v5e --device-memory 50331648")
    ex.choose("params['w1']", P(None, "model"))  # h's rows are cut by model: one all-reduce
    assert " --device-memory 48MiB " in ex.line()
    plan, summary = ex.plan, ex.state()["plan"]["summary"]
    estimate = format_seconds(plan.roofline.estimate_s)
    assert f" · 1 collective · estimate {estimate}, bound by " in summary
    assert f"{format_bytes(plan.total_bytes)} per device (fits in 48.0 MiB)" in summary
    text = view.to_text()
    assert "1 collectives" not in text and "1 collectives" not in view.to_html()
    flat = " ".join(text.split())
    assert f"* 2. data=4,model=2 Auto · peak {format_bytes(plan.total_bytes)} · fits · moves 768 B · {estimate} (" in flat
    assert figures(planned_as_cell(cell, ex)) == figures(plan) and planned_as_cell(cell, ex).capacity == 48 * 2**20


def test_retarget_without_a_target_is_refused(cell):
    ex, _ = explore(cell)
    with pytest.raises(UsageError, match="gave no target; start it with --hardware"):
        ex.retarget(hardware="tpu-v5e")
    assert repr(ex).startswith("<Explorer: 1 layout tried; current: %%shard --plan --mesh data=4,model=2 --axis-types "
                               "auto --in x=P('data',None)")


def test_leaves_of_one_layout_are_one_control_as_sharding_groups_them(cell):
    """An optax-like state: leaves of the same shape, dtype and layout are one row; the view's choice moves
    them together, a choice by path moves one leaf."""
    square = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    cell.push({"state": {"mu": {"a": square, "b": square}, "nu": {"a": square, "b": square}}})
    with capture_output():
        cell.run_cell_magic("shard", "--plan --explore --in x=data,None", "y = x @ (state['mu']['a'] + state['nu']['b'])")
    ex = cell.user_ns["_explorer"]
    (group,) = [i for i in ex.state()["inputs"] if i["group"] == "state"]
    assert group["count"] == 4 and group["paths"] == ["state['mu']['a']", "state['mu']['b']", "state['nu']['a']",
                                                      "state['nu']['b']"]
    ex.submit({"kind": "choose", "name": group["name"], "spec": [["data"], []]})  # the view's control: the group
    assert ex.wait(120)
    (group,) = [i for i in ex.state()["inputs"] if i["group"] == "state"]
    assert group["count"] == 4 and group["spec"] == [["data"], []]
    assert ex.line().endswith("state=P('data',None)")
    ex.choose("state['nu']['b']", P(None, "model"))  # one leaf by its path: the group splits
    rows = {i["name"]: (i["count"], i["spec"]) for i in ex.state()["inputs"] if i["group"] == "state"}
    assert rows == {"state['mu']['a']": (3, [["data"], []]), "state['nu']['b']": (1, [[], ["model"]])}
    assert figures(planned_as_cell(cell, ex, "y = x @ (state['mu']['a'] + state['nu']['b'])")) == \
        figures(ex.plan)



def test_no_show_prints_the_plan_and_a_name_the_user_holds_is_left_alone(cell):
    with capture_output() as captured:
        cell.run_cell_magic("shard", "--plan --explore --no-show --in x=data,None", STEP)
    assert captured.stdout.startswith("planned by XLA:CPU: ") and not captured.outputs
    cell.user_ns["_explorer"] = "mine"
    with capture_output() as captured:
        cell.run_cell_magic("shard", "--plan --explore --in x=data,None", STEP)
    assert cell.user_ns["_explorer"] == "mine" and "`_explorer` holds your own str" in captured.stdout
    assert [type(w).__name__ for w in shown_widgets(captured)] == ["ExplorerView"]


def test_exploring_while_a_cluster_runs_is_a_usage_error(cell, monkeypatch):
    from jaxpar_magic.face import magics

    monkeypatch.setattr(magics, "_running_cluster", lambda: object())  # %%shard would run on every process
    before = snapshot(cell.user_ns)
    with pytest.raises(UsageError, match="Explore before `%cluster start`"):
        cell.run_cell_magic("shard", "--plan --explore --in x=data,None", STEP)
    assert snapshot(cell.user_ns) == before
