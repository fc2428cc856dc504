"""`--plan --compare NAME` and `--plan --search BATCH`: one plan per layout, ranked by estimated step
time, each row what planning that layout alone gives; failures are rows; bad input binds nothing."""
from __future__ import annotations

import html
import re
import json
import textwrap

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.stages.plan.compare import engine_spec
from jaxpar_magic.views import plan as plan_view
from jaxpar_magic.views import plan_compare
from jaxpar_magic.views.textwidth import text_width
from shell_helpers import shown_widgets, snapshot

STEP = "g = jax.grad(lambda w: jnp.sum(jnp.square((x @ w).astype(jnp.float32))))(w)\n"


@pytest.fixture
def layouts(jx):
    jx.push({"jaxpar_magic": jaxpar_magic, "P": P})
    jx.run_cell(textwrap.dedent("""
        flat = jaxpar_magic.make_mesh("data=8", axis_types="auto")
        grid = jaxpar_magic.make_mesh("data=4 model=2", axis_types="auto")
        w = jaxpar_magic.plan((1024, 4096), "bfloat16", flat, ())
        x = jaxpar_magic.plan((256, 1024), "bfloat16", flat, ("data", None))
        layouts = {"dp": {"mesh": flat, "in": {"x": P("data", None), "w": P()}},
                   "fsdp": {"mesh": flat, "in": {"x": P("data", None), "w": P("data", None)}},
                   "fsdp_tp": {"mesh": grid, "in": {"x": P("data", None), "w": P("data", "model")}},
                   "broken": {"mesh": grid, "in": {"x": P("nope", None)}}}
    """), store_history=False).raise_error()
    return jx


def compare(ip, line: str, source: str = STEP, magic: str = "shard"):
    with capture_output() as captured:
        ip.run_cell_magic(magic, line, source)
    (widget,) = [w for w in shown_widgets(captured) if type(w).__name__ == "PlanView"]
    text = next(o.data["text/plain"] for o in captured.outputs if "text/plain" in o.data)
    return widget.state, text


def test_rows_are_ranked_and_each_agrees_with_planning_that_layout_alone(layouts):
    before = snapshot(layouts.user_ns)
    state, text = compare(layouts, "--plan --compare layouts --hardware tpu-v5p")
    assert snapshot(layouts.user_ns) == before  # nothing bound: `g` differs per layout
    assert json.loads(json.dumps(state)) == state and state["kind"] == "compare"
    rows = state["rows"]
    assert sorted(r["label"] for r in rows) == ["broken", "dp", "fsdp", "fsdp_tp"]
    timed = [r for r in rows if not r["error"]]
    assert [r["estimate_s"] for r in timed] == sorted(r["estimate_s"] for r in timed)  # best first
    assert rows[-1]["label"] == "broken" and "'nope' is not an axis of the mesh" in rows[-1]["error"]
    ns = layouts.user_ns
    for row in timed:
        mesh, specs = ns["layouts"][row["label"]]["mesh"], ns["layouts"][row["label"]]["in"]
        alone = jaxpar_magic.plan_cell(STEP, dict(ns), magic="shard", mesh=mesh, in_specs=specs,
                                       hardware="tpu-v5p", bind=False)
        assert row["estimate_s"] == pytest.approx(alone.roofline.estimate_s)
        assert row["memory"] == alone.total_bytes and row["fits"] is True
        assert row["collective_bytes"] == sum(c.bytes * (c.count or 1) for c in alone.collectives if c.group_size > 1)
        assert row["bound"] == alone.roofline.bound
    fsdp = next(r for r in rows if r["label"] == "fsdp")
    dp = next(r for r in rows if r["label"] == "dp")
    assert fsdp["memory"] < dp["memory"]  # FSDP shards the weights: less memory, more collective bytes
    assert fsdp["collective_bytes"] > dp["collective_bytes"]
    lines = text.splitlines()
    assert lines[0].startswith("%%shard --plan --compare layouts on tpu-v5p: 4 layouts, best first")
    # The text is fitted to the text width (issue 26): a row wraps, its continuations indented,
    # so each row's first line is the next line that does not start with a space.
    assert all(len(line) <= text_width() for line in lines)
    firsts = [line for line in lines[1:] if not line.startswith(" ")]
    for row, line in zip(rows, firsts[:4], strict=True):
        assert line.startswith(row["label"] + " ")  # each row starts with its label
    assert "failed: UsageError: --in x: 'nope'" in text


def test_a_layout_that_does_not_fit_is_marked_and_ranked_after_those_that_do(layouts):
    state, text = compare(layouts, "--plan --compare layouts --hardware tpu-v5p --device-memory 30MiB")
    fits = [r["fits"] for r in state["rows"] if not r["error"]]
    assert fits == sorted(fits, reverse=True) and False in fits and True in fits
    assert "DOES NOT FIT" in text
    page = plan_view.to_html(state)
    assert 'class="jpm-bad"' in page


def test_without_hardware_rows_rank_by_memory(layouts):
    state, text = compare(layouts, "--plan --compare layouts")
    memory = [r["memory"] for r in state["rows"] if not r["error"]]
    assert memory == sorted(memory) and all(r.get("estimate_s") is None for r in state["rows"])
    assert "ranked by memory per device" in text


def test_labels_are_escaped(layouts):
    hostile = "<img src=x onerror=alert(1)>"
    layouts.user_ns["layouts"] = {hostile: layouts.user_ns["layouts"]["dp"]}
    state, text = compare(layouts, "--plan --compare layouts --hardware tpu-v5e")
    page = plan_view.to_html(state)
    assert "<img" not in page and html.escape(hostile) in page and text.splitlines()[1].startswith(hostile)


@pytest.mark.parametrize("setup, says", [
    ("del layouts", "no variable 'layouts'"),
    ("layouts = [1, 2]", "expected a dict mapping each label to a layout"),
    ("layouts = {}", "(empty)"),
    ("layouts = {'dp': {'in': {}}}", "expected a dict with \"mesh\""),
    ("layouts = {'dp': {'mesh': flat, 'inputs': {}}}", "expected a dict with \"mesh\""),
    ("layouts = {'dp': {'mesh': 'data=8', 'in': {}}}", "expected a jax.sharding.Mesh"),
    ("layouts = {'dp': {'mesh': flat, 'in': [P()]}}", "expected a dict from input names to PartitionSpecs"),
    ("layouts = {1: {'mesh': flat, 'in': {}}}", "is not a string"),
    ("layouts = {'dp': {'mesh': flat, 'in': {}, 0: P()}}", "is ['in', 'mesh', 0]; expected"),  # int and str keys
])
def test_a_layout_dict_of_the_wrong_shape_says_what_was_expected(layouts, setup, says):
    layouts.run_cell(setup, store_history=False).raise_error()
    before = snapshot(layouts.user_ns)
    with pytest.raises(UsageError, match="--compare layouts") as err:
        layouts.run_cell_magic("shard", "--plan --compare layouts --hardware tpu-v5e", STEP)
    assert says in str(err.value)
    assert snapshot(layouts.user_ns) == before


@pytest.mark.parametrize("line, says", [
    ("--plan --compare layouts --hardware tpu-v9", "no such profile"),
    ("--plan --compare layouts --hardware tpu-v5e --topology 3x3", "does not divide the mesh's 8"),
    ("--plan --compare layouts --hardware tpu-v5e --topology 2x2x2", "expected a 2-axis ICI slice"),
    ("--plan --compare layouts --topology 2x4", "add --hardware"),
    ("--compare layouts", "add --plan"),
    ("--plan --compare layouts --search x", "use one of them"),
    ("--plan --compare 'not a name'", "is not a Python name"),
])
def test_bad_lines_are_usage_errors_and_bind_nothing(layouts, line, says):
    before = snapshot(layouts.user_ns)
    with pytest.raises(UsageError) as err:
        layouts.run_cell_magic("shard", line, STEP)
    assert says in str(err.value)
    assert snapshot(layouts.user_ns) == before


def test_a_topology_that_does_not_match_the_mesh_fails_every_row_with_its_reason(layouts):
    # 8 devices laid on a 2x4 slice work; a 1x8 v5e slice is a valid slice too: all rows plan
    state, _ = compare(layouts, "--plan --compare layouts --hardware tpu-v5e --topology 2x4")
    assert [r["label"] for r in state["rows"] if r["error"]] == ["broken"]


def test_search_proposes_the_standard_layouts(layouts):
    state, text = compare(layouts, "--plan --search x --mesh flat --hardware tpu-v5p")
    labels = {r["label"] for r in state["rows"]}
    assert labels == {"dp", "fsdp", "tp", "fsdp2xtp4", "fsdp4xtp2"}  # the factorisations of 8
    assert all(not r["error"] for r in state["rows"])
    assert "--search proposed DP, FSDP, TP" in state["caveats"][0] and "first cut" in text
    dp = next(r for r in state["rows"] if r["label"] == "dp")
    alone = jaxpar_magic.plan_cell(STEP, dict(layouts.user_ns), magic="shard", mesh=layouts.user_ns["flat"],
                                   in_specs={"x": P("data", None), "w": P(None, None)}, hardware="tpu-v5p", bind=False)
    assert dp["estimate_s"] == pytest.approx(alone.roofline.estimate_s)


def test_pmap_has_no_layouts_to_compare(layouts):
    with pytest.raises(UsageError, match="compare layouts with `%%shard --plan --compare"):
        layouts.run_cell_magic("pmap", "--plan --compare layouts", "y = x * 2\n")


def test_shard_map_compares_layouts_too(layouts):
    layouts.user_ns["per_device"] = {"a": {"mesh": layouts.user_ns["flat"], "in": {"x": P("data", None)},
                                           "out": {"y": P("data", None)}}}
    state, text = compare(layouts, "--plan --compare per_device --hardware tpu-v5e",
                          "y = jax.lax.psum(x, 'data')\n", magic="shard_map")
    assert [r["label"] for r in state["rows"]] == ["a"]
    assert state["rows"][0]["error"] is None and state["rows"][0]["collectives"] == 1


def test_search_needs_its_batch_inputs_defined(layouts):
    with pytest.raises(UsageError, match="'batch' is not defined"):
        layouts.run_cell_magic("shard", "--plan --search batch --hardware tpu-v5e", STEP)


def test_engine_spec_converts_partition_specs_and_carries_pytrees_whole():
    assert engine_spec(P("data", None)) == ("data", None)
    assert engine_spec(("data",)) == ("data",)
    tree = {"w": P("model"), "b": P()}
    assert engine_spec(tree).tree is tree  # one spec per leaf, matched against the input by the engine


def test_pytree_layouts_one_spec_per_leaf_or_one_for_all(jx):
    """A layout's `in` value is one PartitionSpec for every leaf of a pytree input, or a pytree of
    them; each row agrees with planning that layout alone."""
    jx.push({"jaxpar_magic": jaxpar_magic, "P": P})
    jx.run_cell(textwrap.dedent("""
        flat = jaxpar_magic.make_mesh("data=8")
        params = {"w1": jaxpar_magic.plan((1024, 2048), "float32", flat, ()),
                  "w2": jaxpar_magic.plan((2048, 1024), "float32", flat, ())}
        x = jaxpar_magic.plan((256, 1024), "float32", flat, ("data", None))
        layouts = {"dp": {"mesh": flat, "in": {"x": P("data", None), "params": P()}},
                   "fsdp": {"mesh": flat, "in": {"x": P("data", None),
                                                 "params": {"w1": P("data", None), "w2": P("data", None)}}}}
    """), store_history=False).raise_error()
    step = "g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p['w1']) @ p['w2']))(params)\n"
    state, text = compare(jx, "--plan --compare layouts --hardware tpu-v5p", step)
    rows = {r["label"]: r for r in state["rows"]}
    assert set(rows) == {"dp", "fsdp"} and not any(r["error"] for r in rows.values())
    alone = jaxpar_magic.plan_cell(step, jx.user_ns, magic="shard", mesh=jx.user_ns["flat"],
                                   in_specs={"x": P("data", None), "params": {"w1": P("data", None),
                                                                            "w2": P("data", None)}},
                                   hardware="tpu-v5p", bind=False)
    assert rows["fsdp"]["memory"] == alone.total_bytes and rows["fsdp"]["estimate_s"] == alone.roofline.estimate_s
    assert rows["fsdp"]["memory"] < rows["dp"]["memory"]  # FSDP holds an eighth of the weights


def test_each_row_carries_its_peak_and_its_largest_buffer_with_its_line(layouts):
    state, text = compare(layouts, "--plan --compare layouts --hardware tpu-v5e")
    ns = layouts.user_ns
    for row in (r for r in state["rows"] if not r["error"]):
        layout = ns["layouts"][row["label"]]
        alone = jaxpar_magic.plan_cell(STEP, dict(ns), magic="shard", mesh=layout["mesh"], in_specs=layout["in"],
                                       hardware="tpu-v5e", bind=False)
        assert row["peak"] == alone.total_bytes == alone.peak.reported
        largest = alone.peak.buffers[0]
        assert row["largest"]["bytes"] == largest.bytes == max(b.bytes for b in alone.peak.buffers)
        assert row["largest"]["line"] == largest.line
    dp = next(r for r in state["rows"] if r["label"] == "dp")
    said = " ".join(text.split())  # the text wraps at 80 columns
    assert f"largest buffer {plan_compare.largest_text(dp['largest'])}" in said
    assert "Every layout compiled by XLA:CPU for 8 simulated CPU devices." in said


@pytest.mark.parametrize("value, says", [
    ("jnp.ones(3)", "'bad' is a ArrayImpl; expected a dict mapping each label to a layout"),
    ("{0: {'mesh': flat}, 'a': {'mesh': flat}}", "the label 0 is not a string"),
    ("{'dp': {'mesh': flat, 'in': {0: P()}}}", "layout 'dp' has 'in' = dict; expected a dict from input names"),
])
def test_a_compare_name_that_is_not_a_dict_of_layouts_is_a_usage_error(layouts, value, says):
    layouts.run_cell(f"import jax.numpy as jnp\nbad = {value}", store_history=False).raise_error()
    before = snapshot(layouts.user_ns)
    with pytest.raises(UsageError, match=re.escape(says)):
        layouts.run_cell_magic("shard", "--plan --compare bad", STEP)
    assert snapshot(layouts.user_ns) == before


def test_search_over_an_abstract_mesh_says_what_to_do(layouts):
    layouts.run_cell("from jax.sharding import AbstractMesh\npod = AbstractMesh((4, 2), ('data', 'model'))",
                     store_history=False).raise_error()
    with pytest.raises(UsageError, match=r"--search: the mesh \(data=4, model=2\) is an AbstractMesh"):
        layouts.run_cell_magic("shard", "--plan --search x --mesh pod", STEP)
