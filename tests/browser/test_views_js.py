"""The views' ES modules in a real Chromium: rendering, re-rendering, cleanup, escaping,
colours equal to palette.py, and screenshots into test-artifacts/ (look at them)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jaxpar_magic.views.palette import device_color

pytestmark = pytest.mark.browser


def _contrast(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    def lum(c: tuple[int, ...]) -> float:
        lin = [(v / 255) / 12.92 if v / 255 <= 0.04045 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted([lum(a), lum(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_palette_js_matches_palette_py(view_page: Any) -> None:
    js = view_page.page.evaluate(
        """async () => {
            const mod = await import('/js/palette.js');
            return Array.from({length: 4096}, (_, i) => { const c = mod.deviceColor(i); return [c.bg, c.fg]; });
        }"""
    )
    py = [list(device_color(i)) for i in range(4096)]
    assert js == py
    # Survives 4,096 devices: no short cycle (any 64 consecutive ids get 64 distinct colours),
    # and mesh neighbours (ids 1, 2, 4 apart; 8 and 16 apart in wide grids) differ visibly:
    # RGB distance > 35 and > 10 (the golden angle brings ids 8 apart within 20 degrees of hue;
    # saturation and lightness then differ).
    rgb = [tuple(int(bg[k : k + 2], 16) for k in (1, 3, 5)) for bg, _ in py]
    assert all(len(set(rgb[i : i + 64])) == 64 for i in range(0, 4096 - 64))
    for gap, least in [(1, 35), (2, 35), (4, 35), (8, 10), (16, 10)]:
        assert min(math.dist(rgb[i], rgb[i + gap]) for i in range(4096 - gap)) > least, gap
    # Dark text on every tile keeps at least WCAG AA contrast (4.5:1).
    assert {fg for _, fg in py} == {"#111111"}
    assert min(_contrast(c, (17, 17, 17)) for c in rgb) >= 4.5


@pytest.mark.parametrize("view", ["devices", "results", "mesh", "sharding"])
def test_native_modules_and_bundle_agree(view_page: Any, samples: Any, view: str) -> None:
    """js/*.js load as plain ES modules (relative imports) and as the shipped blob bundle,
    and both draw the same DOM."""
    state = samples.basic(view)
    native = view_page.mount(view, state, mode="native")
    bundled = view_page.mount(view, state, mode="bundle")
    assert native.inner_html() == bundled.inner_html()
    assert native.locator(".jpm-view").count() == 1


def test_rerender_on_change_and_cleanup(view_page: Any, samples: Any) -> None:
    host = view_page.mount("mesh", samples.mesh([2, 4]))
    assert host.locator(".jpm-cell").count() == 8
    view_page.set_state(host, samples.mesh([4, 4]))
    assert host.locator(".jpm-cell").count() == 16
    assert host.locator(".jpm-view").count() == 1
    counts = view_page.page.evaluate(
        """() => { const m = window.jpm.mounted[0]; const before = m.model.listenerCount();
                   m.cleanup(); return [before, m.model.listenerCount(), m.el.childElementCount]; }"""
    )
    assert counts == [1, 0, 0]


@pytest.mark.parametrize("view", ["devices", "results", "mesh", "sharding"])
def test_hostile_strings_are_text(view_page: Any, samples: Any, view: str) -> None:
    bad = samples.HOSTILE
    if view == "devices":
        state = samples.devices(8)
        for d in state["devices"]:
            d["kind"] = bad
        state["backend"] = bad
    elif view == "results":
        state = samples.result(8)
        state["title"] = bad
        state["axes"][0]["name"] = bad
        state["outputs"][0]["name"] = bad
        state["outputs"][0]["tiles"][0]["text"] = bad
        state["collectives"][0]["source_line"] = bad
    elif view == "mesh":
        state = samples.mesh([2, 4], [bad, "model"])
        state["name"] = bad
    else:
        state = samples.sharding([8, 8], [(bad, 2), ("model", 2)], [bad, None], name=bad)
    host = view_page.mount(view, state)
    assert bad in host.inner_text()
    assert host.locator("img").count() == 0
    assert view_page.page.evaluate("window.__xss") is None


def test_result_view_8_devices(view_page: Any, samples: Any) -> None:
    host = view_page.mount("results", samples.result(8))
    tiles = host.locator(".jpm-tile")
    assert tiles.count() == 8
    # Each tile's head carries its device's colour, as palette.py computes it.
    for i in range(8):
        bg = tiles.nth(i).locator(".jpm-tile-head").evaluate("e => e.style.background")
        r, g, b = (int(device_color(i)[0][k : k + 2], 16) for k in (1, 3, 5))
        assert bg == f"rgb({r}, {g}, {b})"
    assert "[0. 1. 2. 3. 4.]" in tiles.nth(0).inner_text()
    assert host.locator(".jpm-same").count() == 1
    assert "same on all 8 devices" in host.locator(".jpm-same").inner_text()
    # The ring: 8 nodes, 8 arrows.
    ring = host.locator("svg.jpm-ring")
    assert ring.locator("circle.jpm-node").count() == 8
    assert ring.locator("path.jpm-arrow").count() == 8
    assert "every device sends to the next one in mesh order (cyclic)" in host.inner_text()
    # A pipeline's 0→4 … 3→7: half the devices send and no pair wraps (not "every device", not cyclic).
    pipeline = samples.result(8)
    pipeline["collectives"] = [{**c, "pairs": [[i, i + 4] for i in range(4)]} for c in pipeline["collectives"]
                               if c["op"] == "collective-permute"]
    said = view_page.mount("results", pipeline).inner_text()
    assert "each of the 4 senders sends to the one 4 places later in mesh order" in said and "cyclic" not in said
    assert "compile 12.3 ms" in host.inner_text()
    # Inspection: hovering a tile fills the detail line.
    tiles.nth(3).hover()
    assert "device 3" in host.locator(".jpm-detail").inner_text()
    view_page.shot(host, "results-8")
    dark = view_page.mount("results", samples.result(8), theme="dark")
    view_page.shot(dark, "results-8-dark")


def test_result_view_draws_pending_values_then_fills_them(view_page: Any, samples: Any) -> None:
    """A shown cell's view before its values came (views/values.py: `pending`), then with them: the
    same model's state set again (views/later.py), as the kernel's comm message sets it."""
    from jaxpar_magic.views.results import to_text

    filled = samples.result(8)
    pending = {**filled, "outputs": [{"name": o["name"], "shape": o["shape"], "dtype": o["dtype"], "pending": True}
                                     for o in filled["outputs"]]}
    host = view_page.mount("results", pending)
    said = host.inner_text()
    assert said.count("values: waiting for the devices…") == len(filled["outputs"])
    assert host.locator(".jpm-tile").count() == 0
    assert to_text(pending).count("values: waiting for the devices…") == len(filled["outputs"])  # its static twin
    view_page.set_state(host, filled)
    assert host.locator(".jpm-tile").count() == 8 and "waiting for the devices" not in host.inner_text()
    failed = {**pending, "outputs": [{**o, "pending": False, "error": "JaxRuntimeError: INTERNAL: it broke"}
                                     for o in pending["outputs"]]}
    view_page.set_state(host, failed)
    assert "values unavailable: JaxRuntimeError: INTERNAL: it broke" in host.inner_text()
    assert host.locator(".jpm-tile").count() == 0


def test_a_result_views_twin_redrawn_with_its_values_stays_hidden(view_page: Any, samples: Any) -> None:
    """views/later.py rewrites a result view's static twin once its values come (update_display_data), which
    JupyterLab draws in a new output box: the drawn view hides that one too. Mounted as a kernel shows it:
    through js/loader.js, in one output area with its twin."""
    page = view_page.page
    view_page.mount("results", samples.result(8), mode="loader", twin="3c4d5e", attach="after", area=True)
    page.locator(".jpm-twin-3c4d5e").wait_for(state="hidden", timeout=5_000)  # js/loader.js: the first twin
    page.evaluate("""twin => {
        const old = document.querySelector(`.jpm-twin-${twin}`).closest('.jp-OutputArea-child');
        const box = document.createElement('div');
        box.className = 'jp-OutputArea-child';
        box.innerHTML = `<div class="jpm-static jpm-twin-${twin}">the twin with its values</div>`;
        old.replaceWith(box);
    }""", "3c4d5e")
    page.locator(".jpm-twin-3c4d5e").wait_for(state="hidden", timeout=5_000)
    assert page.locator(".jpm-twin-3c4d5e").text_content() == "the twin with its values"
    assert page.locator(".jpm-results").is_visible()


def test_result_view_large(view_page: Any, samples: Any) -> None:
    host = view_page.mount("results", samples.result(4096))
    assert host.locator(".jpm-tile").count() == 16
    assert "4080 more devices not shown" in host.inner_text()
    assert host.locator("svg.jpm-ring").count() == 0
    assert "too many to draw the ring" in host.inner_text()
    gather = host.locator(".jpm-coll").nth(2)
    assert gather.locator(".jpm-group").count() == 16
    assert "48 more groups not drawn" in gather.inner_text()
    view_page.shot(host, "results-4096")


def test_devices_view(view_page: Any, samples: Any) -> None:
    host = view_page.mount("devices", samples.devices(8))
    assert host.locator(".jpm-card").count() == 8
    assert host.locator(".jpm-chip.jpm-zero").count() == 2  # gpu 0, tpu 0
    assert "simulated" in host.inner_text().lower()
    view_page.shot(host, "devices-8")
    # 64 simulated devices with nothing but a name: small chips, a few rows, not 13 rows of cards.
    many = view_page.mount("devices", samples.devices(64))
    assert many.locator(".jpm-cards.jpm-compact .jpm-card").count() == 64
    assert many.bounding_box()["height"] < 260
    view_page.shot(many, "devices-64")
    # Eight name-only cards stand in one row; cards that name their process stay cards.
    eight = host.locator(".jpm-card")
    assert len({round(eight.nth(k).bounding_box()["y"]) for k in range(8)}) == 1
    assert view_page.mount("devices", samples.devices(16, processes=2)).locator(".jpm-compact").count() == 0
    multi = view_page.mount("devices", samples.devices(128, processes=2, platform="tpu", kind="TPU v5 lite"))
    assert multi.locator(".jpm-card").count() == 64
    assert multi.locator(".jpm-h").count() == 2
    assert "64 more devices not listed" in multi.inner_text()
    view_page.shot(multi, "devices-tpu-2proc")


def test_mesh_2x4(view_page: Any, samples: Any) -> None:
    host = view_page.mount("mesh", samples.mesh([2, 4]))
    cells = host.locator(".jpm-cell")
    assert cells.count() == 8
    assert cells.nth(5).inner_text() == "5"
    # First axis down, second across: device 5 sits in row 1, column 1.
    box0 = cells.nth(0).bounding_box()
    box5 = cells.nth(5).bounding_box()
    assert box5["y"] > box0["y"] and box5["x"] > box0["x"]
    assert "data" in host.locator(".jpm-axis-y").inner_text()
    assert "model" in host.locator(".jpm-axis-x").inner_text()
    cells.nth(5).click()
    assert "device 5 · data=1, model=1" in host.locator(".jpm-detail").inner_text()
    view_page.shot(host, "mesh-2x4")
    view_page.shot(view_page.mount("mesh", samples.mesh([2, 4]), theme="dark"), "mesh-2x4-dark")


def test_mesh_says_its_axis_types(view_page: Any, samples: Any) -> None:
    """One chip when every axis has the same type, one per axis when they differ (views/mesh.py's twin)."""
    host = view_page.mount("mesh", samples.mesh([2, 4]))
    assert "Auto axes" in host.locator(".jpm-chips").inner_text()
    mixed = dict(samples.mesh([2, 4]), axis_types=["Explicit", "Auto"])
    chips = view_page.mount("mesh", mixed).locator(".jpm-chips").inner_text()
    assert "data: Explicit" in chips and "model: Auto" in chips


def test_mesh_4096(view_page: Any, samples: Any) -> None:
    host = view_page.mount("mesh", samples.mesh([16, 16, 16]))
    assert host.locator(".jpm-cell").count() == 4096
    assert host.locator(".jpm-facet").count() == 16
    # Compact: no per-cell text labels at this size.
    labelled = host.evaluate("e => [...e.querySelectorAll('.jpm-cell')].filter(c => c.textContent).length")
    assert labelled == 0
    assert host.locator(".jpm-facet-title").nth(3).inner_text() == "data=3"
    last = host.locator(".jpm-cell").nth(4095)
    assert last.get_attribute("title") == "device 4095 · data=15, model=15, seq=15"
    box = host.bounding_box()
    assert box["width"] <= 1000 and box["height"] <= 1400
    view_page.shot(host, "mesh-16x16x16")


def test_mesh_tall_is_compact(view_page: Any, samples: Any) -> None:
    """data=32 × model=8: 32 rows of small cells (ids on hover), not 32 rows of 40 px squares."""
    host = view_page.mount("mesh", samples.mesh([32, 8]))
    cells = host.locator(".jpm-cell")
    assert cells.count() == 256 and cells.nth(0).bounding_box()["height"] == 11
    assert cells.nth(255).get_attribute("title") == "device 255 · data=31, model=7"
    assert host.bounding_box()["height"] < 500
    view_page.shot(host, "mesh-32x8")


def test_mesh_1d_and_abstract(view_page: Any, samples: Any) -> None:
    host = view_page.mount("mesh", samples.mesh([8], ["i"]))
    assert host.locator(".jpm-cell").count() == 8
    ys = {round(host.locator(".jpm-cell").nth(k).bounding_box()["y"]) for k in range(8)}
    assert len(ys) == 1  # one row
    view_page.shot(host, "mesh-1d-8")
    wide = view_page.mount("mesh", samples.mesh([256], ["i"]))
    assert "wrapped every 64" in wide.inner_text()
    abstract = view_page.mount("mesh", samples.mesh([2, 2, 2], abstract=True))
    assert abstract.locator(".jpm-cell.jpm-abstract").count() == 8
    assert "position 7" in abstract.locator(".jpm-cell").nth(7).get_attribute("title")
    view_page.shot(abstract, "mesh-abstract-2x2x2")


def test_sharding_2d(view_page: Any, samples: Any) -> None:
    state = samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", None], name="v1s")
    host = view_page.mount("sharding", state)
    blocks = host.locator(".jpm-block")
    assert blocks.count() == 4
    assert "P('data', None)" in host.inner_text()
    assert "replicated over model" in host.inner_text()
    # Replicated blocks are drawn as copies, not a split: one neutral cell that names its devices,
    # with a mark per copy in each device's colour.
    assert "jpm-copies" in blocks.nth(0).get_attribute("class")
    assert blocks.nth(0).locator(".jpm-copy-marks > i").count() == 2
    assert blocks.nth(0).locator(".jpm-blabel").inner_text() == "2 copies: 0,1"
    blocks.nth(1).hover()
    detail = host.locator(".jpm-detail").inner_text()
    assert "[1000:2000, 0:10000]" in detail and "float32[1000, 10000]" in detail
    # Relative sizes: 4 equal rows spanning the full width.
    b0, b1 = blocks.nth(0).bounding_box(), blocks.nth(1).bounding_box()
    assert b1["y"] > b0["y"] and abs(b0["height"] - b1["height"]) < 2
    view_page.shot(host, "sharding-2d")
    both = samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", "model"], name="w")
    host2 = view_page.mount("sharding", both)
    assert host2.locator(".jpm-block").count() == 8
    assert "P('data', 'model')" in host2.inner_text()
    view_page.shot(host2, "sharding-2d-both")


def test_sharding_3d(view_page: Any, samples: Any) -> None:
    state = samples.sharding([8, 1024, 512], [("a", 2), ("b", 2), ("c", 2)], ["a", "b", "c"], name="act")
    host = view_page.mount("sharding", state)
    assert host.locator(".jpm-facet").count() == 2
    assert host.locator(".jpm-block").count() == 8
    assert host.locator(".jpm-facet-title").nth(1).inner_text() == "[4:8, :, :]"
    view_page.shot(host, "sharding-3d")
    many = samples.sharding([64, 64, 64], [("a", 32), ("b", 2)], ["a", "b", None], name="big")
    host2 = view_page.mount("sharding", many)
    assert host2.locator(".jpm-facet").count() == 16
    assert "16 more facets" in host2.inner_text()


def test_sharding_1d_and_tuple_spec(view_page: Any, samples: Any) -> None:
    state = samples.sharding([4096], [("a", 4), ("b", 2)], [["a", "b"]], name="v")
    host = view_page.mount("sharding", state)
    assert "P(('a', 'b'))" in host.inner_text()
    assert host.locator(".jpm-block").count() == 8
    view_page.shot(host, "sharding-1d")
    big = samples.sharding([64, 64], [("x", 64), ("y", 64)], ["x", "y"], name="g")
    host2 = view_page.mount("sharding", big)
    assert host2.locator(".jpm-block").count() == 4096
    labelled = host2.evaluate("e => [...e.querySelectorAll('.jpm-block')].filter(c => c.textContent).length")
    assert labelled == 0
    view_page.shot(host2, "sharding-64x64")


def test_sharding_js_decodes_states_as_python_does(view_page: Any, samples: Any) -> None:
    """js/sharding.js reads `bounds` and `blocks` exactly as summaries.expand_sharding_tiles does,
    for states the package builds (a 4,096-device plan, replicas) and for the samples."""
    import jax.numpy as jnp

    import jaxpar_magic
    from jaxpar_magic.views.summaries import expand_sharding_tiles, sharding_state

    pod = jaxpar_magic.make_mesh("x=16,y=16,z=16", abstract=True)
    big = sharding_state("big", jaxpar_magic.plan((2**20, 2**20), jnp.float32, pod, (("x", "y"), "z")))
    states = [
        big,
        sharding_state("rows", jaxpar_magic.plan((2**20, 8), jnp.float32, pod, ("x",))),
        samples.sharding([8, 1024, 512], [("a", 2), ("b", 2), ("c", 2)], ["a", "b", "c"]),
        samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", None]),
        # Two blocks on no device (what sharding_state writes for a layout with holes).
        {"name": "holes", "shape": [4, 4], "dtype": "float32", "grid": [2, 2], "bounds": [[0, 2, 4], [0, 2, 4]],
         "blocks": [0, [], [], 1], "total_devices": 2},
    ]
    for state in states:
        decoded = view_page.page.evaluate(
            """async (state) => {
                const mod = await import('/js/sharding.js');
                return [...mod.decodeBlocks(state).byBlock.values()];
            }""",
            state,
        )
        assert decoded == expand_sharding_tiles(state), state["name"]
    holes = view_page.mount("sharding", states[-1])
    holes.locator(".jpm-block").nth(1).dispatch_event("click")
    assert "index [0:2, 2:4] · shard float32[2, 2] · no device" in holes.locator(".jpm-detail").inner_text()
    # The last of 4,096 blocks still says where it lies, how big it is and who holds it.
    host = view_page.mount("sharding", big)
    blocks = host.locator(".jpm-block")
    assert blocks.count() == 4096
    assert "4096 distinct blocks on 4096 devices" in host.inner_text()
    blocks.last.dispatch_event("click")
    detail = host.locator(".jpm-detail").inner_text()
    assert "index [1044480:1048576, 983040:1048576]" in detail, detail
    assert "float32[4096, 65536]" in detail and "device 4095" in detail, detail


def test_static_html_renders_offline(view_page: Any, samples: Any) -> None:
    """text/html as an exported notebook shows it: no script, no network; it must still draw."""
    from jaxpar_magic.views import devices, mesh, results, sharding
    from jaxpar_magic.views.inline import inline_styles

    pages = {
        "results-8": inline_styles(results.to_html(samples.result(8))),
        "mesh-2x4": inline_styles(mesh.to_html(samples.mesh([2, 4]))),
        "mesh-16x16x16": inline_styles(mesh.to_html(samples.mesh([16, 16, 16]))),
        "sharding-2d": inline_styles(sharding.to_html(
            samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", None], name="v1s")
        )),
        "sharding-3d": inline_styles(sharding.to_html(
            samples.sharding([8, 1024, 512], [("a", 2), ("b", 2), ("c", 2)], ["a", "b", "c"], name="act")
        )),
        "devices-8": inline_styles(devices.to_html(samples.devices(8))),
    }
    page = view_page.page
    page.set_content(
        '<!doctype html><meta charset="utf-8"><body style="margin:0;padding:12px;font-family:sans-serif">'
        + "".join(f'<div class="out" id="{name}" style="width:940px;margin-bottom:16px">{body}</div>' for name, body in pages.items())
        + "</body>"
    )
    assert page.evaluate("document.scripts.length") == 0
    for name in pages:
        out = page.locator(f"#{name}")
        box = out.locator(".jpm-view").bounding_box()
        assert box["height"] > 40, name
        view_page.shot(out, f"static-{name}")
    # Device colours survive: the 2x4 mesh's cells carry palette colours.
    cell = page.locator("#mesh-2x4 .jpm-cell").nth(5)
    r, g, b = (int(device_color(5)[0][k : k + 2], 16) for k in (1, 3, 5))
    assert cell.evaluate("e => getComputedStyle(e).backgroundColor") == f"rgb({r}, {g}, {b})"
    # The 4,096-device mesh is 16 images, and they decoded.
    imgs = page.locator("#mesh-16x16x16 img")
    assert imgs.count() == 16
    assert imgs.first.evaluate("e => e.complete && e.naturalWidth") == 16


def test_malformed_state_says_so(view_page: Any) -> None:
    # Cut points that do not match the grid (one block needs two), and a block held by "nobody".
    for bad in ({"shape": [4], "grid": [1], "bounds": [[0]], "blocks": [0]},
                {"shape": [4], "grid": [1], "bounds": [[0, 4]], "blocks": ["nobody"]}):
        host = view_page.mount("sharding", bad)
        assert "cannot draw this view" in host.inner_text()
    # An empty state (a widget before its first sync) draws an empty view, not an error.
    for view in ("devices", "results", "mesh", "sharding"):
        assert "cannot draw" not in view_page.mount(view, {}).inner_text()


def test_shard_map_blocks_show_the_slice_each_device_holds(view_page: Any, samples: Any) -> None:
    """A %%shard_map result: each tile names the slice of the global array its block is; the
    static HTML and text say the same."""
    from jaxpar_magic.views.results import to_html, to_text

    state = samples.result(4)
    out = state["outputs"][0]
    out["global_shape"] = [20]
    for k, tile in enumerate(out["tiles"]):
        tile["slice"] = f"[{5 * k}:{5 * k + 5}]"
    host = view_page.mount("results", state)
    slices = host.locator(".jpm-tile-slice").all_text_contents()
    assert slices == ["y[0:5]", "y[5:10]", "y[10:15]", "y[15:20]"]
    assert "blocks of float32[20]" in host.locator(".jpm-out-head").first.inner_text().replace("\n", " ")
    assert 'class="jpm-tile-slice">y[5:10]<' in to_html(state)
    assert "dev 1 (i=1) = y[5:10]:" in to_text(state)


def test_tile_values_keep_their_padding_inside_a_notebook_output(view_page: Any, samples: Any) -> None:
    """JupyterLab and nbconvert style `.jp-OutputArea-output pre { padding: 0 }`; a tile's value
    keeps its own padding inside an output area all the same."""
    page = view_page.page
    page.add_style_tag(content=".jp-OutputArea-output pre { padding: 0; }")
    page.evaluate("() => document.body.classList.add('jp-OutputArea-output')")
    host = view_page.mount("results", samples.result(8))
    pad = host.locator(".jpm-tile-val").first.evaluate("e => getComputedStyle(e).paddingLeft")
    assert pad == "8px", pad


@pytest.mark.parametrize("width", [320, 332])
def test_sharding_shrinks_to_a_narrow_output_area(view_page: Any, samples: Any, width: int) -> None:
    """JupyterLab 700 px wide with the file browser open leaves ~332 px: the blocks shrink to fit,
    none is cut off (they were drawn 520 px wide whatever the room)."""
    state = samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", None], name="v1s")
    host = view_page.mount("sharding", state)
    host.evaluate("(e, w) => { e.style.width = w + 'px'; }", width)
    right = host.evaluate("e => e.getBoundingClientRect().right")
    blocks = host.locator(".jpm-block")
    assert blocks.count() == 4
    for k in range(4):
        box = blocks.nth(k).bounding_box()
        assert box["x"] + box["width"] <= right + 0.5 and box["width"] > 100, (k, box, right)
    view = host.locator(".jpm-view")
    assert view.evaluate("v => v.scrollWidth <= v.clientWidth")
    view_page.shot(host, f"sharding-{width}")


def test_sharding_on_no_device_says_so(view_page: Any) -> None:
    """The twin of views/sharding.py's head line for a layout on no device (issue 33 item 17)."""
    import jax
    import numpy as np

    from jaxpar_magic.views.summaries import sharding_state

    for value, says in ((jax.ShapeDtypeStruct((8, 4), "float32"), "1 distinct block, not laid out on devices"),
                        (np.ones((8, 4)), "1 distinct block in host memory, on no device")):
        host = view_page.mount("sharding", sharding_state("a", value))
        assert says in host.inner_text() and "0 devices" not in host.inner_text()
