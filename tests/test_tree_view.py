"""The tree view: one view per named pytree, its array leaves grouped by layout, bounded.

States are built from real JAX values on the 8 simulated devices and real library objects
(optax, Equinox, Flax NNX); the magic path runs in the real shell. The browser side is in
tests/browser/test_tree_js.py.
"""
from __future__ import annotations

import dataclasses
import html
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from html_tags import parse
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P
from shell_helpers import shown_widgets

import jaxpar_magic
from jaxpar_magic.views.summaries import sharding_state
from jaxpar_magic.views.tree_summary import MAX_ROWS, PATHS_PER_ROW, tree_state
from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views.textwidth import fit_text, text_width
from jaxpar_magic.views import tree as tree_view
from jaxpar_magic.views.tree import TreeView

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
HOSTILE = "<img src=x onerror=window.__xss=1>"
#: The issue's bound: a 1,000-leaf state's output, every mime type (and the widget's state) together.
OUTPUT_BUDGET = 300_000


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"))


def put(mesh, value, spec):
    return jax.device_put(np.asarray(value), NamedSharding(mesh, spec))  # from the host: no compile per shape


def adam_state(mesh, layers: int = 30):
    import optax

    params = {f"layer{i}": {"w": put(mesh, np.ones((64, 32), np.float32), P("data", "model")),
                            "b": put(mesh, np.zeros(32, np.float32), P())} for i in range(layers)}
    return optax.adam(1e-3).init(params)


def output_bytes(state: dict) -> dict[str, int]:
    """What one displayed view costs: each mime type of its output, and its synced state."""
    widget = TreeView(state=state)
    data, _ = widget._repr_mimebundle_()
    sizes = {k: len(json.dumps(v) if not isinstance(v, str) else v.encode()) for k, v in data.items()}
    sizes["state"] = len(json.dumps(widget.state, separators=(",", ":")))
    widget.close()
    return sizes


def rows_by_shape(state: dict) -> dict[tuple, dict]:
    return {tuple(r["shape"]): r for r in state["rows"]}


# --- the state ---------------------------------------------------------------------------------

def test_adam_state_is_three_rows_with_counts_paths_and_pictures(mesh):
    opt_state = adam_state(mesh)
    state = tree_state("opt_state", opt_state)
    assert state["arrays"] == 121 and state["layouts"] == 3 and state["type"] == "tuple"
    w, b, count = rows_by_shape(state)[(64, 32)], rows_by_shape(state)[(32,)], rows_by_shape(state)[()]
    assert (w["count"], b["count"], count["count"]) == (60, 60, 1)
    assert w["spec"] == "P('data', 'model')" and w["where"] == "split dim 0 4× over data, dim 1 2× over model"
    assert b["spec"] == "P()" and b["where"] == "replicated on 8 devices"
    assert count["paths"] == ["[0].count"] and count["dtype"] == "int32"
    # Bytes per device by hand: a (64, 32) float32 cut 4 × 2 is a (16, 16) block; b is whole everywhere.
    assert w["device_bytes"] == 16 * 16 * 4 and b["device_bytes"] == 32 * 4 and w["bytes"] == 64 * 32 * 4
    assert state["bytes"] == 60 * 64 * 32 * 4 + 60 * 32 * 4 + 4
    device0 = 4 if count["where"] == "single device (0)" else 0
    assert state["device_bytes"] == 60 * (16 * 16 * 4 + 32 * 4) + device0
    # Paths: jax.tree_util.keystr of every leaf, a few listed per row, the rest counted.
    every = [jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(opt_state) if leaf.shape == (64, 32)]
    assert w["paths"] == every[:PATHS_PER_ROW] and w["more_paths"] == 60 - PATHS_PER_ROW
    assert "[0].mu['layer0']['w']" in w["paths"] and "[0].nu['layer9']['w']" in every
    # Each row's picture is the sharding view's own state of its first leaf.
    first_w = opt_state[0].mu["layer0"]["w"]
    assert state["pictures"][w["picture"]] == sharding_state("opt_state[0].mu['layer0']['w']", first_w)
    assert sorted(r["picture"] for r in state["rows"]) == [0, 1, 2]


def test_a_bare_array_keeps_its_sharding_view(jx, mesh):
    x = put(mesh, jnp.ones((8, 4)), P("data"))
    from jaxpar_magic.face.actions import sharding_views

    assert sharding_views("x", x) == [("sharding", sharding_state("x", x))]
    assert type(jaxpar_magic.show_sharding(x, "x")).__name__ == "ShardingView"
    tree = jaxpar_magic.show_sharding({"x": x}, "params")
    assert isinstance(tree, TreeView) and tree.state["rows"][0]["paths"] == ["['x']"]


def test_1000_leaves_in_3_layouts_stay_small_and_do_not_grow(mesh):
    def params(n):
        specs = [(np.ones((16, 8), np.float32), P("data")), (np.ones((8,), np.float32), P()),
                 (np.ones((4, 4), jnp.bfloat16), P(None, "model"))]
        made = [(v, s) for v, s in specs]
        return {f"p{i:04d}": put(mesh, *made[i % 3]) for i in range(n)}

    big, small = tree_state("params", params(1000)), tree_state("params", params(30))
    assert big["arrays"] == 1000 and big["layouts"] == 3 and sum(r["count"] for r in big["rows"]) == 1000
    assert all(len(r["paths"]) == PATHS_PER_ROW and r["more_paths"] == r["count"] - PATHS_PER_ROW for r in big["rows"])
    sizes, few = output_bytes(big), output_bytes(small)
    assert sum(sizes.values()) < OUTPUT_BUDGET, sizes
    # Growing from 30 to 1,000 leaves changes counts and digits, nothing that grows per leaf.
    assert sum(sizes.values()) - sum(few.values()) < 200, (sizes, few)


def test_1000_distinct_layouts_are_capped(mesh):
    params = {f"p{i:04d}": put(mesh, np.ones((8, i + 1), np.float32), P("data")) for i in range(1000)}
    state = tree_state("params", params)
    assert state["layouts"] == 1000 and len(state["rows"]) == MAX_ROWS
    assert state["rows_omitted"] == {"layouts": 1000 - MAX_ROWS, "leaves": 1000 - MAX_ROWS}
    assert sum(output_bytes(state).values()) < OUTPUT_BUDGET
    assert f"… {1000 - MAX_ROWS} more layouts ({1000 - MAX_ROWS} leaves) not listed" in tree_view.to_text(state)


def test_long_paths_are_shortened(mesh):
    deep = {"k" * 300: {"inner": jnp.ones(3)}}
    (path,) = tree_state("deep", deep)["rows"][0]["paths"]
    assert len(path) <= 100 and path.startswith("['kkk") and path.endswith("['inner']") and "…" in path


# --- every kind of pytree ------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


def test_registered_dataclass_and_lists(mesh):
    p = Params(w=put(mesh, jnp.ones((8, 3)), P("data")), b=jnp.zeros(8))
    state = tree_state("p", [p, p])
    assert state["type"] == "list" and state["arrays"] == 4 and state["layouts"] == 2
    w = rows_by_shape(state)[(8, 3)]
    assert w["paths"] == ["[0].w", "[1].w"] and w["where"] == "split dim 0 4× over data; replicated over model"
    assert rows_by_shape(state)[(8,)]["where"].startswith("single device (")


def test_equinox_module_lists_its_functions_as_static_leaves():
    import equinox as eqx

    mlp = eqx.nn.MLP(2, 2, 4, 2, key=jax.random.key(0))
    state = tree_state("model", mlp)
    assert state["type"] == "MLP" and state["arrays"] == 6
    assert rows_by_shape(state)[(4,)]["paths"] == [".layers[0].bias", ".layers[1].bias"]
    assert state["static"] == {"count": 2, "groups_omitted": 0, "groups": [
        {"kind": "function", "count": 2, "paths": [".activation", ".final_activation"], "more_paths": 0}]}
    assert "relu" not in json.dumps(state)  # counted, never shipped
    assert "static leaves (not arrays, not shipped): 2 · function ×2 (.activation, .final_activation)" in tree_view.to_text(state)


def test_flax_nnx_state():
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(3, 4, rngs=rngs)
            self.l2 = nnx.Linear(4, 4, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)  # holds a PRNG key array: dtype key<fry>

    state = tree_state("state", nnx.state(Model(nnx.Rngs(0))))
    assert state["type"] == "State" and state["arrays"] == 6 and state["layouts"] == 5
    # An NNX Variable's own `.value` step is left out of the paths.
    assert rows_by_shape(state)[(4,)]["paths"] == ["['l1']['bias']", "['l2']['bias']"]
    assert rows_by_shape(state)[(3, 4)]["paths"] == ["['l1']['kernel']"]
    key = next(r for r in state["rows"] if r["paths"] == ["['drop']['rngs']['key']"])
    assert (key["dtype"], key["shape"], key["bytes"]) == ("key<fry>", [], 8)  # a threefry key is 2 uint32s


def test_a_key_array_has_a_sharding_view(mesh):
    from jaxpar_magic.face.actions import sharding_views

    keys = jax.device_put(jax.random.split(jax.random.key(0), 8), NamedSharding(mesh, P("data")))
    ((kind, state),) = sharding_views("keys", keys)
    assert (kind, state["dtype"], state["nbytes"], state["grid"]) == ("sharding", "key<fry>", 8 * 8, [4])


def test_abstract_leaves_with_and_without_sharding_host_data_and_none():
    pod = jax.sharding.AbstractMesh((4, 2), ("data", "model"))
    tree = {"plain": jax.ShapeDtypeStruct((8, 4), jnp.float32),
            "placed": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(pod, P("data"))),
            "host": np.ones((2, 3)), "gone": None, "lr": 0.1}
    state = tree_state("plan", tree)
    assert state["abstract"] is True and state["layouts"] == 3
    by_path = {r["paths"][0]: r for r in state["rows"]}
    plain, placed, host = by_path["['plain']"], by_path["['placed']"], by_path["['host']"]
    assert (plain["where"], plain["device_bytes"], plain["spec"]) == ("abstract, no sharding", None, "")
    assert placed["where"] == "split dim 0 4× over data; replicated over model (abstract)"
    assert placed["spec"] == "P('data')" and placed["device_bytes"] == 2 * 4 * 4
    assert (host["where"], host["device_bytes"], host["kind"]) == ("host memory (NumPy), on no device", None, "host")
    assert state["device_bytes"] == 2 * 4 * 4  # the abstract mesh's every position
    assert [(g["kind"], g["paths"]) for g in state["static"]["groups"]] == [("None", ["['gone']"]), ("float", ["['lr']"])]


def test_an_empty_tree_says_so():
    state = tree_state("nothing", {"a": None})
    assert state["rows"] == [] and state["arrays"] == 0
    assert "no array leaves" in tree_view.to_text(state) and "no array leaves" in tree_view.to_html(state)


# --- text/plain and static HTML ---------------------------------------------------------------

def test_text_is_the_table(mesh):
    text = tree_view.to_text(tree_state("opt_state", adam_state(mesh, layers=3)))
    lines = text.splitlines()
    # 6 w of 8 KiB, 6 b of 128 B and a 4-byte count: 49,924 B; per device 6 × 1 KiB + 6 × 128 B + 4 B = 6,916 B.
    assert lines[0] == "opt_state: tuple · 13 array leaves in 3 layouts · 48.8 KiB · 6.8 KiB per device"
    assert re.split(r"\s{2,}", lines[1].strip()) == ["leaves", "shape", "layout", "per device", "paths"]
    w_row = next(line for line in lines if "float32[64, 32]" in line)
    assert re.split(r"\s{2,}", w_row.strip()) == [
        "6", "float32[64, 32]", "P('data', 'model') · split dim 0 4× over data, dim 1 2× over model", "1.0 KiB",
        "[0].mu['layer0']['w'], [0].mu['layer1']['w'], [0].mu['layer2']['w'], [0].nu['layer0']['w'], "
        "[0].nu['layer1']['w'], [0].nu['layer2']['w']"]


def test_static_html_has_the_same_table_and_bounded_pictures(mesh):
    state = tree_state("opt_state", adam_state(mesh))
    out = tree_view.to_html(state)
    parsed = parse(out)
    assert set(parsed.tags) <= {"div", "span", "code", "b", "i", "table", "thead", "tbody", "tr", "th", "td",
                                "details", "summary", "colgroup", "col"}
    cells = re.findall(r"<tr><td[^>]*>(\d+)</td><td[^>]*>([^<]*)</td><td>([^<]*)</td><td[^>]*>([^<]*)</td>", out)
    assert [(c[0], html.unescape(c[1]), html.unescape(c[2]), c[3]) for c in cells] == [
        (str(r["count"]), f"{r['dtype']}[{', '.join(map(str, r['shape']))}]",
         f"{r['spec']} · {r['where']}" if r["spec"] else r["where"], tree_view.device_bytes_text(r["device_bytes"]))
        for r in state["rows"]]
    # Each distinct layout's picture, drawn by the sharding view's static code, the first one open.
    assert out.count('<details class="jpm-tree-pic"') == 3 and out.count(" open>") == 1
    assert out.count('class="jpm-view jpm-sharding"') == 3


def test_static_html_carries_at_most_a_few_pictures(mesh):
    params = {f"p{i}": put(mesh, np.ones((8, i + 1), np.float32), P("data", "model" if (i + 1) % 2 == 0 else None))
              for i in range(20)}
    out = tree_view.to_html(tree_state("params", params))
    assert out.count('class="jpm-view jpm-sharding"') == tree_view.HTML_PICTURES
    assert f"pictures of {20 - tree_view.HTML_PICTURES} more layouts: in the live view" in out


def test_hostile_names_are_text():
    state = tree_state(HOSTILE, {HOSTILE: jnp.ones(3), "f": {HOSTILE: jax.nn.relu}})
    for out in (tree_view.to_html(state),):
        assert HOSTILE not in out and html.escape(HOSTILE) in out
        parsed = parse(out)
        assert "img" not in parsed.tags and "script" not in parsed.tags
        assert not [a for a in parsed.attrs if a.startswith("on")]


def test_mimebundle_has_widget_html_and_text(mesh):
    state = tree_state("opt_state", adam_state(mesh, layers=2))
    widget = TreeView(state=state)
    data, _ = widget._repr_mimebundle_()
    assert set(data) == {WIDGET_MIME, "text/html", "text/plain"}
    assert data["text/html"] == f'<div class="jpm-static jpm-twin-{widget._jpm_twin}">{inline_styles(tree_view.to_html(state))}</div>'
    assert data["text/plain"] == fit_text(tree_view.to_text(state), text_width())
    assert widget.trait_metadata("state", "sync") is True
    widget.close()


# --- the magic path ------------------------------------------------------------------------------

def shown_kinds(captured) -> list[tuple[str, str]]:
    return [(type(w).__name__, w.state["name"]) for w in shown_widgets(captured)]


def test_sharding_magic_on_an_adam_state_is_one_view(jx, mesh):
    jx.user_ns["opt_state"] = adam_state(mesh)
    jx.user_ns["x"] = put(mesh, jnp.ones((8, 4)), P("data"))
    with capture_output() as captured:
        assert jx.run_line_magic("sharding", "opt_state x") is None
    assert shown_kinds(captured) == [("TreeView", "opt_state"), ("ShardingView", "x")]
    tree = shown_widgets(captured)[0]
    assert tree.state == tree_state("opt_state", jx.user_ns["opt_state"])
    assert sum(len(json.dumps(o.data)) for o in captured.outputs[:1]) < 40_000  # was 121 widgets, 2.2 MB


def test_a_shard_cell_shows_one_view_per_name(jx):
    jx.user_ns["x"] = jnp.arange(16.0).reshape(8, 2)
    with capture_output() as captured:
        jx.run_line_magic("mesh", "data=8 --no-show")
        jx.run_cell_magic("shard", "--in x=data", "grads = {'w': x * 2, 'b': x.sum(axis=1)}\ny = x + 1\n")
    assert shown_kinds(captured) == [("ShardingView", "x"), ("TreeView", "grads"), ("ShardingView", "y")]
    grads = shown_widgets(captured)[1].state
    assert [(r["paths"], r["where"]) for r in grads["rows"]] == [
        (["['b']"], "split dim 0 8× over data"), (["['w']"], "split dim 0 8× over data")]


# --- the bundle: tree.js imports the sharding view's drawing ------------------------------------

def test_a_view_importing_a_view_is_inlined_once_with_its_helpers(monkeypatch):
    from jaxpar_magic.views import base

    esm = TreeView._bundle  # the module the loader assembles (views/base.py)
    assert esm.count("const __jpm_sharding = ") == 1 and esm.count("const __jpm_format = ") == 1
    assert esm.index("const __jpm_format = ") < esm.index("const __jpm_sharding = ")  # helpers first
    assert "const { draw } = __jpm_sharding;" in esm and "\nimport " not in esm
    files = {
        "top.js": 'import { f } from "./helper.js";\nimport { g } from "./mid.js";\nexport default {};\n',
        "mid.js": 'import { f } from "./helper.js";\nexport function g() { return f(); }\nexport default {};\n',
        "helper.js": "export function f() { return 1; }\n",
        "loop.js": 'import { a } from "./loop2.js";\nexport default {};\n',
        "loop2.js": 'import { b } from "./loop.js";\nexport function a() {}\n',
    }
    monkeypatch.setattr(base, "read_asset", lambda name: files[name])
    out = base.bundle_esm("top.js")
    assert out.count("const __jpm_helper = ") == 1 and "const __jpm_default = {}" in out
    assert out.index("__jpm_helper = ") < out.index("__jpm_mid = ") < out.index("const { g } = __jpm_mid;")
    with pytest.raises(ValueError, match="cycle"):
        base.bundle_esm("loop.js")


def test_sharding_magic_on_library_objects(jx):
    import equinox as eqx
    import optax
    from flax import nnx

    model = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
    jx.user_ns.update(mlp=eqx.nn.MLP(2, 2, 4, 2, key=jax.random.key(0)), p=Params(w=jnp.ones((8, 3)), b=jnp.zeros(8)),
                      model=model, opt=nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param))
    with capture_output() as captured:
        jx.run_line_magic("sharding", "mlp p model opt")
    assert shown_kinds(captured) == [("TreeView", n) for n in ("mlp", "p", "model", "opt")]
    mlp, p, model_view, opt = (w.state for w in shown_widgets(captured))
    assert (mlp["type"], mlp["arrays"], mlp["static"]["count"]) == ("MLP", 6, 2)
    assert [r["paths"] for r in p["rows"]] == [[".w"], [".b"]]
    assert sorted(path for r in model_view["rows"] for path in r["paths"]) == [".bias", ".kernel"]
    assert ".step" in [path for r in opt["rows"] for path in r["paths"]]
