"""The views without a browser: static HTML (escaped, bounded, no script), text renderings,
mime bundles, the ES-module bundler, and the palette's fixed values.

Browser checks of the same views live in tests/browser/test_views_js.py.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import pytest
from html_tags import parse
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpar_magic.views import DevicesView, MeshView, ResultView, ShardingView
from jaxpar_magic.views import base, devices, mesh, results, sharding
from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views.textwidth import fit_text, text_width
from jaxpar_magic.views.palette import device_color
from sample_states import sharding_state

HOSTILE = "<img src=x onerror=window.__xss=1>"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: Tags the static HTML may contain; anything else means a string got in unescaped.
ALLOWED_TAGS = {"div", "span", "code", "b", "i", "pre", "img", "table", "tr", "td", "th", "colgroup", "col", "br"}


# --- sample states (the engines' shapes) ---------------------------------------------------


def devices_state(n: int = 8, kind: str = "cpu", processes: int = 1) -> dict[str, Any]:
    listed = min(n, 64)
    return {
        "devices": [
            {"id": i, "platform": "cpu", "kind": kind, "process": i * processes // n, "coords": None,
             "core": None, "mem_used": None, "mem_limit": None}
            for i in range(listed)
        ],
        "total": n,
        "omitted": n - listed,
        "counts": {"cpu": n, "gpu": 0, "tpu": 0},
        "processes": [{"process": p, "count": n // processes} for p in range(processes)],
        "simulated": True,
        "backend": "cpu",
    }


def mesh_state(sizes: list[int], names: list[str] | None = None) -> dict[str, Any]:
    names = names or ["data", "model", "seq"][: len(sizes)]
    n = 1
    for s in sizes:
        n *= s
    return {"name": "mesh", "axes": [{"name": a, "size": s} for a, s in zip(names, sizes)],
            "device_ids": list(range(n)), "axis_types": ["Auto"] * len(sizes), "abstract": False, "kinds": ["cpu"]}


def result_state(n: int = 8, name: str = "y", axis: str = "i") -> dict[str, Any]:
    ids = list(range(n))
    return {
        "title": f"%%pmap over {n} devices",
        "axes": [{"name": axis, "size": n}],
        "device_ids": ids,
        "outputs": [
            {"name": name, "shape": [3], "dtype": "float32", "same_on_all": False,
             "tiles": [{"devices": [i], "coords": [i], "text": f"[{i}. {i + 1}. {i + 2}.]"} for i in ids[:16]],
             "omitted": max(0, n - 16), "same_text": None},
            {"name": "s", "shape": [], "dtype": "float32", "same_on_all": True,
             "tiles": [{"devices": ids[:64], "coords": None, "text": "28."}], "omitted": 0,
             "same_text": f"same on all {n} devices"},
        ],
        "collectives": [
            {"op": "all-reduce", "shape": "f32[]", "bytes": 4, "groups": [ids], "groups_text": f"1 group of {n}",
             "pairs": [], "pairs_omitted": 0, "source_line": f"s = lax.psum(x, '{axis}')"},
            {"op": "collective-permute", "shape": "f32[3]", "bytes": 12, "groups": [], "groups_text": f"{n} pairs",
             "pairs": [[i, (i + 1) % n] for i in ids][:256], "pairs_omitted": max(0, n - 256), "source_line": None},
            {"op": "all-gather", "shape": "f32[2,3]", "bytes": 24, "groups": [ids[k : k + 2] for k in range(0, n, 2)][:64],
             "groups_text": f"{n // 2} groups of 2", "pairs": [], "pairs_omitted": 0, "source_line": None},
        ],
        "report": {"compile_ms": 12.3, "run_ms": 0.4, "flops": 1234.0, "bytes_accessed": None},
    }


HOSTILE_CASES = {
    "devices": lambda: devices.to_html({**devices_state(8, kind=HOSTILE), "backend": HOSTILE}),
    "results": lambda: results.to_html({**result_state(8, name=HOSTILE, axis=HOSTILE), "title": HOSTILE}),
    "mesh": lambda: mesh.to_html({**mesh_state([2, 4], [HOSTILE, "model"]), "name": HOSTILE, "kinds": [HOSTILE]}),
    "sharding": lambda: sharding.to_html(sharding_state([8, 8], [(HOSTILE, 2), ("m", 2)], [HOSTILE, None], name=HOSTILE)),
}


@pytest.mark.parametrize("view", sorted(HOSTILE_CASES))
def test_to_html_escapes_hostile_strings(view: str) -> None:
    out = HOSTILE_CASES[view]()
    assert HOSTILE not in out
    assert html.escape(HOSTILE) in out
    parsed = parse(out)
    assert "img" not in parsed.tags  # small states draw no images; an <img> here is the injected one
    assert "script" not in parsed.tags
    assert not [a for a in parsed.attrs if a.startswith("on")]


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_to_html_any_names_stay_text(axis: str, var: str) -> None:
    outs = [
        mesh.to_html({**mesh_state([2, 2], [axis, var]), "name": var}),
        results.to_html({**result_state(4, name=var, axis=axis), "title": var}),
        sharding.to_html(sharding_state([4, 4], [(axis, 2), (axis + "_", 2)], [axis, None], name=var)),
        devices.to_html(devices_state(4, kind=var)),
    ]
    for out in outs:
        parsed = parse(out)
        assert set(parsed.tags) <= ALLOWED_TAGS - {"img"}
        assert not [a for a in parsed.attrs if a.startswith("on")]


VIEWS = {
    "devices": (DevicesView, devices, lambda: devices_state(8)),
    "results": (ResultView, results, lambda: result_state(8)),
    "mesh": (MeshView, mesh, lambda: mesh_state([2, 4])),
    "sharding": (ShardingView, sharding, lambda: sharding_state([4000, 10000], [("data", 8)], ["data", None])),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_mimebundle_has_widget_html_and_text(view: str) -> None:
    cls, module, make = VIEWS[view]
    state = make()
    widget = cls(state=state)
    data, _metadata = widget._repr_mimebundle_()
    assert set(data) == {WIDGET_MIME, "text/html", "text/plain"}
    assert data[WIDGET_MIME]["model_id"] == widget.model_id
    # The static HTML: the renderer's page with every style inline, inside the twin's marker.
    assert data["text/html"] == f'<div class="jpm-static jpm-twin-{widget._jpm_twin}">{inline_styles(module.to_html(state))}</div>'
    assert data["text/plain"] == fit_text(module.to_text(state), text_width())
    assert "<script" not in data["text/html"] and "<style" not in data["text/html"]
    assert 'class="jpm-view' in data["text/html"]
    # The widget syncs exactly one state trait, and the positional form works too.
    assert cls(state).state == state
    assert widget.trait_metadata("state", "sync") is True
    widget.close()


def test_css_rules_are_scoped() -> None:
    css = base.read_asset("views.css")
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    css = re.sub(r"@(media|supports)[^{]*\{", "", css)  # conditional groups: their rules are checked
    selectors = [s.strip() for block in re.findall(r"([^{}]+)\{", css) for s in block.split(",")]
    assert selectors
    bad = [s for s in selectors if s and not s.startswith((".jpm-", "table.jpm-"))]
    assert bad == []


def test_a_permute_summary_says_every_device_and_cyclic_only_when_true() -> None:
    """A pipeline's sends 0→4 … 3→7 on 8 devices: half the devices send, and no pair wraps round
    (the training chapter's pipeline was labelled "every device ... (cyclic)")."""
    state = result_state(8)
    state["collectives"] = [{**state["collectives"][1], "pairs": [[i, i + 4] for i in range(4)], "groups_text": "4 pairs"}]
    text = results.to_text(state)
    assert "each of the 4 senders sends to the one 4 places later in mesh order" in text, text
    assert "cyclic" not in text and "every device" not in text
    state["collectives"][0]["pairs"] = [[i, (i + 1) % 8] for i in range(8)]
    assert "every device sends to the next one in mesh order (cyclic)" in results.to_text(state)
    state["collectives"][0]["pairs"] = [[i, i + 1] for i in range(7)]  # a chain, not a ring
    assert "each of the 7 senders sends to the next one in mesh order —" not in results.to_text(state)
    assert "(cyclic)" not in results.to_text(state)


def test_text_renderings() -> None:
    assert mesh.to_text(mesh_state([2, 4])).splitlines() == [
        "Mesh 'mesh': data=2 × model=4 · 8 devices · Auto axes (cpu)",
        "        model →",
        "        0 1 2 3",
        "data 0  0 1 2 3",
        "     1  4 5 6 7",
    ]
    big = mesh.to_text(mesh_state([16, 16, 16]))
    assert "[data=0]" in big and "… 15 more facets over data" in big
    assert len(big.splitlines()) < 25

    text = results.to_text(result_state(8))
    assert "  dev 3 (i=3): [3. 4. 5.]" in text
    assert "  same on all 8 devices: 28." in text
    assert "8 pairs: 0→1, 1→2" in text and "every device sends to the next one in mesh order (cyclic)" in text
    assert "groups: {0–7}" in text
    assert "Cost: compile 12.3 ms · run (waited for its result) 0.4 ms · FLOPs per device 1.23 k" in text

    text = sharding.to_text(sharding_state([4000, 10000], [("data", 4), ("model", 2)], ["data", None], name="v"))
    assert text.splitlines()[0] == "v: float32[4000, 10000] (152.6 MiB) · P('data', None) · replicated over model"
    assert "  block (1, 0) [1000:2000, 0:10000] float32[1000, 10000] → devices 2,3 (2, replicated)" in text

    text = devices.to_text(devices_state(8))
    assert text.splitlines()[:3] == [
        "Devices: 8 cpu devices · backend cpu [simulated]",
        "cpu: 8  gpu: 0  tpu: 0",
        "  devices 0–7 · cpu · process 0",  # devices that differ only in their id: one line
    ]
    two = devices.to_text(devices_state(8, processes=2))
    assert "process 1 (4 devices)" in two and "  devices 4–7 · cpu · process 1" in two
    # Devices that differ (coordinates, memory) keep a line each, up to 16 per process.
    tpus = devices_state(64, kind="TPU v5e")
    for k, d in enumerate(tpus["devices"]):
        d["coords"] = [k % 8, k // 8, 0]
    lines = devices.to_text(tpus).splitlines()
    assert lines[2] == "  device 0 · cpu · TPU v5e · process 0 · coords [0, 0, 0]"
    assert len(lines) == 2 + 16 and lines[-1] == "  … 49 more lines like these"

    # Cards that would show only their name are chips, as js/devices.js draws them: eight simulated
    # devices in one row; cards with more to say (coordinates, memory) or that name their process stay cards.
    assert 'class="jpm-cards jpm-compact"' in devices.to_html(devices_state(64))
    assert 'class="jpm-cards jpm-compact"' in devices.to_html(devices_state(8))
    assert '"jpm-cards jpm-compact"' not in devices.to_html(devices_state(16, processes=2)) + devices.to_html(tpus)
    tall = mesh.to_text(mesh_state([32, 8])).splitlines()
    assert len(tall) == 1 + 2 + 6 + 1 + 2  # title, axis lines, 6 rows, the elision, the last 2 rows
    assert "… rows 6–29 (devices 48…239) not shown" in tall[9] and tall[-1].split()[:2] == ["31", "248"]
    assert "height:11px" in mesh.to_html(mesh_state([32, 8]))  # small cells, not 32 rows of 40 px


def test_formatting_twins() -> None:
    assert base.format_spec(["data", None]) == "P('data', None)"
    assert base.format_spec([["a", "b"], None]) == "P(('a', 'b'), None)"
    assert base.format_spec([["a"]]) == "P(('a',))"
    assert base.format_slices([[0, 500], [0, 10000]]) == "[0:500, 0:10000]"
    assert base.format_ids([0, 1, 2, 3, 4, 5, 6, 7]) == "0–7"
    assert base.format_ids([0, 1]) == "0,1"
    assert base.format_ids([0, 1, 2, 3, 8, 9, 10, 11]) == "0–3,8–11"
    assert base.format_ids(list(range(0, 40, 2)), 3) == "0,2,4,…(+17)"
    assert base.format_bytes(20) == "20 B"
    assert base.format_bytes(160_000_000) == "152.6 MiB"
    assert base.format_si(1234.0) == "1.23 k"
    assert base.format_ms(0.402) == "0.402 ms"


# --- size bounds at 4,096 devices ----------------------------------------------------------
#
# A notebook stores every output's HTML and widget state; a view should weigh about what a
# small plot does. 64 KiB of HTML holds the stylesheet (~10 KiB) plus the drawing, with large
# grids drawn as PNGs of one pixel per device (16 facets of 16x16 cost ~10 KiB). Mesh state is
# 4,096 ids (<= 5 characters each): under 32 KiB.

HTML_LIMIT = 64 * 1024


def test_sizes_bounded_at_4096_devices() -> None:
    cases = {
        "mesh 16x16x16": (mesh_state([16, 16, 16]), mesh.to_html, 32 * 1024),
        "mesh 4096": (mesh_state([4096], ["i"]), mesh.to_html, 32 * 1024),
        # device_ids (~24 KiB) + one all-device replica group (~24 KiB) + 256 pairs + 16 tiles.
        "results 4096": (result_state(4096), results.to_html, 64 * 1024),
        "devices 4096": (devices_state(4096), devices.to_html, 16 * 1024),
        # 4,096 one-device blocks: ids (<= 5 characters each with the comma) and 2 x 65 cut points.
        "sharding 64x64": (sharding_state([64, 64], [("x", 64), ("y", 64)], ["x", "y"]), sharding.to_html, 40_000),
        "sharding replicated": (sharding_state([64, 64], [("x", 64), ("y", 64)], [None, None]), sharding.to_html, 64 * 1024),
    }
    for label, (state, render, state_limit) in cases.items():
        page = render(state)
        assert len(page.encode()) < HTML_LIMIT, (label, len(page))
        if state_limit is not None:
            assert len(json.dumps(state).encode()) < state_limit, label
    # Large grids are images, not thousands of elements.
    page = mesh.to_html(mesh_state([16, 16, 16]))
    assert page.count("<img") == 16 and page.count('class="jpm-cell') == 0
    page = sharding.to_html(sharding_state([64, 64], [("x", 64), ("y", 64)], ["x", "y"]))
    assert page.count("<img") == 1 and page.count('class="jpm-block') == 0
    # The 4,096-device text rendering stays a screenful or two.
    assert len(results.to_text(result_state(4096)).splitlines()) < 40
    assert len(mesh.to_text(mesh_state([4096], ["i"])).splitlines()) < 80


def test_png_is_valid() -> None:
    import base64
    import struct
    import zlib

    uri = base.png_data_uri([[(255, 0, 0), (0, 255, 0)], [(0, 0, 255), (1, 2, 3)]])
    raw = base64.b64decode(uri.split(",", 1)[1])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    assert (width, height) == (2, 2)
    idat_len = struct.unpack(">I", raw[33:37])[0]
    pixels = zlib.decompress(raw[41 : 41 + idat_len])
    assert pixels == b"\x00\xff\x00\x00\x00\xff\x00" + b"\x00\x00\x00\xff\x01\x02\x03"


# --- palette -------------------------------------------------------------------------------


def test_palette_fixed_values() -> None:
    # Pinned: palette.js must produce the same (the browser test compares all 4,096 ids).
    assert device_color(0) == ("#78c1d6", "#111111")  # devices 0-7: the colour-blind-safe set (test_palette_cvd.py)
    assert [device_color(i)[0] for i in (1, 2, 3, 7, 8, 4095)] == ["#eed936", "#aef077", "#5ef0d4", "#d4a16c", "#f6d3c1",
                                                                    "#e8ecac"]
    assert len({device_color(i)[0] for i in range(64)}) == 64
    # Static HTML colours a device exactly as the palette says.
    page = mesh.to_html(mesh_state([2, 4]))
    for i in range(8):
        assert f"background:{device_color(i)[0]}" in page


# --- the ES-module bundler -----------------------------------------------------------------


@pytest.mark.parametrize("cls", [DevicesView, ResultView, MeshView, ShardingView])
def test_bundles_are_self_contained(cls: type) -> None:
    esm = cls._bundle
    assert not re.search(r"^\s*import\b", esm, re.M)
    assert "export default" in esm
    assert "const __jpm_palette = " in esm and "const __jpm_format = " in esm
    # The pieces the library ships rebuild the bundle byte for byte (as js/loader.js joins them).
    assert esm.endswith("".join(esm.helpers.values()) + esm.body) and list(esm.helpers) == ["palette", "format"]


def test_a_view_syncs_what_an_anywidget_syncs() -> None:
    """Views skip AnyWidget.__init__ (it builds a class per instance) and carry anywidget's traits as
    class traits instead: the model must still hold every trait a real AnyWidget sends, with the
    same meaning, and the view stays an instance of its own class."""
    import anywidget

    class Plain(anywidget.AnyWidget):
        _esm = "export default { render() {} };"
        _css = ".x {}"

    plain, view, again = Plain(), ResultView(state={}), ResultView(state={})
    assert set(plain.keys) <= set(view.keys)
    assert set(base.ANYWIDGET_TRAITS) <= set(plain.keys)
    mine, theirs = view.get_state(), plain.get_state()
    for key in ("_model_name", "_model_module", "_model_module_version", "_view_name", "_view_module"):
        assert mine[key] == theirs[key], key
    assert theirs["_anywidget_id"].endswith(".Plain")
    assert mine["_anywidget_id"] == "jaxpar_magic.views.results.ResultView" and mine["_esm"] == base._LOADER
    assert type(view) is type(again) and type(view).__name__ == "ResultView" and isinstance(view, ResultView)
    plain.close(), view.close(), again.close()


@pytest.mark.parametrize("cls", [DevicesView, ResultView, MeshView, ShardingView])
def test_a_views_state_is_what_ipywidgets_own_get_state_makes(cls: type) -> None:
    """ViewBase.get_state reads each trait's writer once per class: for every key, for one key, for
    a list of keys and with drop_defaults, it must give what ipywidgets' Widget.get_state gives for
    the same widget, before and after its state changes."""
    import ipywidgets

    state = sharding_state([8, 4], [("x", 4), ("y", 2)], ["x", None]) if cls is ShardingView else {"title": "t"}
    view = cls(state=state)
    for _ in range(2):
        for key in (None, "state", ["state", "_jpm_twin", "layout"], "_esm"):
            assert view.get_state(key) == ipywidgets.Widget.get_state(view, key), key
        assert view.get_state(drop_defaults=True) == ipywidgets.Widget.get_state(view, drop_defaults=True)
        view.state = {**state, "title": "another"}
    for key in ("no_such_trait", 3):
        with pytest.raises(Exception) as ours:
            view.get_state(key)
        with pytest.raises(Exception) as theirs:
            ipywidgets.Widget.get_state(view, key)
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    view.close()


def test_result_views_with_equal_states_share_their_static_forms_and_differ_in_their_twin(monkeypatch) -> None:
    """A re-run's result view before its values come has the last one's state: its static forms are
    drawn once (base._static_forms), equal to drawing them anew; its twin class is its own."""
    import uuid

    state = {"title": f"t {uuid.uuid4()}", "axes": [{"name": "x", "size": 2}], "device_ids": [0, 1],
             "outputs": [{"name": "y", "shape": [2], "dtype": "float32", "pending": True}]}
    first, second = ResultView(state=state), ResultView(state=json.loads(json.dumps(state)))
    drawings = []
    monkeypatch.setattr(ResultView, "_render_html", staticmethod(lambda st: drawings.append(st) or results.to_html(st)))
    drawn = [first.static_bundle(), second.static_bundle()]
    assert len(drawings) == 1  # the second view's equal state was not drawn again
    monkeypatch.undo()
    assert drawn[0]["text/plain"] == drawn[1]["text/plain"] == second.to_text()
    for view, bundle in zip((first, second), drawn):
        assert bundle["text/html"] == f'<div class="jpm-static jpm-twin-{view._jpm_twin}">{view.to_html()}</div>'
    assert first._jpm_twin != second._jpm_twin
    second.state = {**state, "title": "another"}  # another state: drawn anew
    assert "another" in second.static_bundle()["text/html"] and "another" not in first.static_bundle()["text/html"]
    first.close(), second.close()


def test_every_view_ships_the_loader_and_the_library_holds_the_code_once() -> None:
    views = [cls(state={}) for cls in (DevicesView, ResultView, ResultView, MeshView)]
    lib = base.library()
    for v in views:
        assert v._esm == base._LOADER and v._css == ""  # per model: about 2.4 KB, no stylesheet
        assert v._jpm_lib == f"IPY_MODEL_{lib.model_id}" and v._jpm_view == type(v)._bundle.view
        assert v.layout is views[0].layout  # one Layout model for all views, not one each
    # Every widget model carries the loader: it stays small (2,431 characters with the wait for
    # JupyterLab to attach a view before its twin is hidden).
    assert len(base._LOADER) < 2450 and "/*" not in base._LOADER
    assert lib.css == base.read_asset("views.css")
    assert {"devices", "results", "mesh"} <= set(lib.needs) and lib.needs["results"] == ["palette", "format"]
    assert lib.code["view:results"] == ResultView._bundle.body
    assert lib.code["helper:format"] == ResultView._bundle.helpers["format"]
    before = dict(lib.code)
    ResultView(state={}).close()
    assert lib.code == before  # a kind already shown adds nothing
    for v in views:
        v.close()
    lib.close()
    assert base.library() is not lib and base.library().comm is not None  # a closed library is made again


def test_js_never_uses_html_sinks() -> None:
    folder = base.assets()
    # Code only: comments may (and do) name the sinks they avoid.
    strip = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
    sources = {p.name: strip.sub("", p.read_text()) for p in folder.iterdir() if p.name.endswith(".js")}
    assert set(sources) >= {"palette.js", "format.js", "devices.js", "results.js", "mesh.js", "sharding.js"}
    for name, src in sources.items():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in src, (name, sink)


def test_bundler_rejects_what_it_cannot_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "view.js": 'import { a } from "./helper.js";\nexport default { render() {} };\n',
        "aliased.js": 'import { a as b } from "./helper.js";\nexport default {};\n',
        "missing.js": 'import { nope } from "./helper.js";\nexport default {};\n',
        "bare.js": 'import * as x from "./helper.js";\nexport default {};\n',
        "helper.js": "export function a() { return 1; }\nconst hidden = 2;\n",
        "bad.js": 'import { a } from "./badhelper.js";\nexport default {};\n',
        "badhelper.js": "export default function a() {}\n",
    }
    monkeypatch.setattr(base, "read_asset", lambda name: files[name])
    out = base.bundle_esm("view.js")
    assert "const { a } = __jpm_helper;" in out
    assert "return { a };" in out and "function a()" in out
    for name in ("aliased.js", "missing.js", "bare.js", "bad.js"):
        with pytest.raises(ValueError):
            base.bundle_esm(name)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["float32", "float64", "int32", "int8", "uint16", "float16"]).flatmap(
    lambda dtype: st.tuples(st.just(dtype), st.lists(st.one_of(
        st.integers(-2_000_000, 2_000_000), st.floats(-1e7, 1e7), st.sampled_from([float("nan"), float("inf")]),
        st.floats(-1e9, 1e9), st.floats(-1e-3, 1e-3), st.floats(-10, 10, width=32),
        st.sampled_from([0.0, -0.0, 0.5, 1e-5, 5e-5, 999999.0, 1e6, -3.0, 99999999.0, 1e8, 0.00078125, 1 / 3])),
        min_size=0, max_size=6))))
def test_format_values_says_what_array2string_says(case):
    """format_values' fast paths (whole numbers, fixed-point floats) give NumPy's own text, or step aside."""
    import numpy as np

    from jaxpar_magic.views.summaries import format_values

    import warnings

    dtype, numbers = case
    with warnings.catch_warnings():  # out-of-range numbers wrap or overflow in the cast: fine here
        warnings.simplefilter("ignore")
        vals = np.array(numbers, dtype=np.float64).astype(dtype) if numbers else np.zeros(0, dtype)
    if vals.size == 0:
        return
    expected = np.array2string(vals, precision=4, suppress_small=True, separator=" ", max_line_width=10_000)
    assert format_values(vals, vals.shape, vals.dtype) == "[" + expected[1:-1].strip() + "]"
    scalar = vals[:1].reshape(())
    assert format_values(scalar, (), vals.dtype) == np.array2string(scalar, precision=4, suppress_small=True)


def test_each_view_has_its_own_model_id_and_its_comm_is_opened_under_it() -> None:
    """Model ids come from a counter under a random per-process half (base.new_model_id, not a uuid4
    per view): distinct for every view, 32 hex digits as ipywidgets' own, and the comm's id."""
    views = [ResultView(state={"title": "t", "outputs": []}) for _ in range(3)]
    ids = [view.model_id for view in views]
    assert len(set(ids)) == 3
    for view, model_id in zip(views, ids):
        assert re.fullmatch(r"[0-9a-f]{32}", model_id)
        assert view.comm.comm_id == model_id
        assert view._widget_bundle()[0][base.WIDGET_MIME]["model_id"] == model_id
    assert len({model_id[:16] for model_id in ids}) == 1  # one process, one random half
    for view in views:
        view.close()
