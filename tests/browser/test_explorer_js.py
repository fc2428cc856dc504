"""ExplorerView's ES module (js/explorer.js) in a real Chromium with the fake widget model: what it
draws from a state shaped as the contract says (views/explorer.py sends it), the messages its
controls send (an axis toggle, the mesh and target pickers, a tried row), the copy button on both
paths (the clipboard, and selecting the line where the page has no clipboard), focus kept across a
redraw, and escaping: every name a user or the kernel wrote stays literal text."""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"
GIB = 2**30
MIB = 2**20


def explorer_state(*, name: str = "params['w1']", busy: bool = False, message: str | None = None) -> dict[str, Any]:
    """An explorer of a two-input step on a (data=4, model=2) mesh, w1 cut by data on dim 0."""
    line1 = "%%shard --plan --mesh data=4,model=2 --in params=P('data', None) --in x=P('data', None)"
    line2 = "%%shard --plan --mesh data=4,model=2 --in params=P(None, 'model') --in x=P('data', None)"
    return {
        "inputs": [
            {"name": name, "group": "params", "shape": [1024, 4096], "dtype": "float32", "spec": [["data"], []]},
            {"name": "params['b1']", "group": "params", "shape": [4096], "dtype": "float32", "spec": [[]], "count": 3},
            {"name": "x", "group": "x", "shape": [32, 1024], "dtype": "bfloat16", "spec": [["data", "model"], []]},
            {"name": "step", "group": "step", "shape": [], "dtype": "int32", "spec": []},
        ],
        "mesh": {"axes": [["data", 4], ["model", 2]], "types": ["Explicit", "Explicit"],
                 "shapes": ["data=8", "data=4,model=2", "data=2,model=4", "model=8"], "devices": 8},
        "target": {"hardware": "tpu-v5e", "topology": None, "options": {"hardware": ["tpu-v4", "tpu-v5e", "h100"], "topology": []}},
        "status": {"busy": busy, "text": "planning data=4,model=2 w1=P(None,'model')… 4 s" if busy else "planned in 1.2 s"},
        "message": message,
        "plan": {
            "peak_bytes": 3 * GIB, "capacity_bytes": 16 * GIB, "fits": True,
            "largest": [{"what": "params['w1'] (argument)", "bytes": 4 * MIB, "line": "cell:3 h = x @ w1"}],
            "collectives": [{"kind": "all-gather", "bytes": 16 * MIB, "calls": 2, "what": "w1 over data"},
                            {"kind": "all-reduce", "bytes": 4096, "calls": 1, "what": "loss"}],
            "estimate_s": 0.00125, "bound": "ICI", "compiler": "XLA:CPU", "summary": "fits; 2 all-gathers, 1 all-reduce",
        },
        "diff": "peak −1.0 GiB, +2 all-gathers, estimate +0.4 ms",
        "tried": [
            {"rank": 1, "line": line1, "peak_bytes": 3 * GIB, "fits": True, "collective_bytes": 32 * MIB + 4096, "estimate_s": 0.00125,
             "current": True, "mesh": "data=4,model=2 Explicit"},
            {"rank": 2, "line": line2, "peak_bytes": 20 * GIB, "fits": False, "collective_bytes": 0, "estimate_s": 0.004,
             "current": False, "mesh": "data=4,model=2 Explicit"},
        ],
        "generation": 3,
        "compiles": 2,
    }


def sent(view_page: Any, host: Any) -> list[dict[str, Any]]:
    index = int(host.get_attribute("data-index"))
    return view_page.page.evaluate("i => window.jpm.mounted[i].model.sent", index)


def toggle(host: Any, name: str, dim: int, axis: str) -> Any:
    rows = host.locator(".jpm-ex-input")
    row = rows.nth(rows.locator(".jpm-out-name").all_inner_texts().index(name))
    return row.locator(f'.jpm-ex-dim[data-dim="{dim}"] .jpm-ex-axis[data-axis="{axis}"]')


def test_native_module_and_bundle_agree(view_page: Any) -> None:
    native = view_page.mount("explorer", explorer_state(), mode="native")
    bundled = view_page.mount("explorer", explorer_state(), mode="bundle")
    loaded = view_page.mount("explorer", explorer_state(), mode="loader")  # as every view model ships it
    assert native.inner_html() == bundled.inner_html() == loaded.inner_html()
    assert native.locator(".jpm-explorer").count() == 1


def test_draws_the_state(view_page: Any, artifacts: Any) -> None:
    host = view_page.mount("explorer", explorer_state(busy=True), mode="native")
    rows = host.locator(".jpm-ex-input")
    assert rows.count() == 4
    # One toggle per mesh axis per dimension, pressed where that axis cuts the dimension.
    assert rows.nth(0).locator(".jpm-ex-axis").count() == 4
    assert toggle(host, "params['w1']", 0, "data").get_attribute("aria-pressed") == "true"
    assert toggle(host, "params['w1']", 0, "model").get_attribute("aria-pressed") == "false"
    assert toggle(host, "x", 0, "model").get_attribute("aria-pressed") == "true"
    assert rows.nth(0).locator(".jpm-ex-spec").inner_text() == "P('data', None)"
    assert rows.nth(2).locator(".jpm-ex-spec").inner_text() == "P(('data', 'model'), None)"
    assert "float32[1024, 4096]" in rows.nth(0).inner_text()
    assert "nothing to cut" in rows.nth(3).inner_text()
    assert rows.nth(1).locator(".jpm-ex-count").inner_text() == "and 2 more leaves like it"
    assert rows.nth(0).locator(".jpm-ex-count").count() == 0
    # 4096 / (data=4 * model=2) divides; 4096 // 4 then ×... a 1024 dim cut by both divides too.
    assert "jpm-ex-nodiv" not in (toggle(host, "params['b1']", 0, "data").get_attribute("class") or "")
    assert host.locator(".jpm-ex-group").first.inner_text() == "params"
    # The pickers show the current mesh, types and target.
    assert host.locator(".jpm-ex-shape").input_value() == "data=4,model=2"
    assert host.locator(".jpm-ex-types").input_value() == "Explicit"
    assert host.locator(".jpm-ex-hardware").input_value() == "tpu-v5e"
    assert host.locator(".jpm-ex-topology").count() == 0  # no topology given, none offered
    assert host.locator(".jpm-ex-largest thead th").all_inner_texts() == ["bytes", "what", "where"]
    # The plan's figures.
    assert host.locator(".jpm-ex-fit").inner_text() == "fits: peak 3.0 GiB per device of 16.0 GiB (19%)"
    assert host.locator(".jpm-ex-peak b").inner_text() == "3.0 GiB"
    assert host.locator(".jpm-ex-moved b").inner_text() == "32.0 MiB"  # 16 MiB × 2 calls + 4 KiB
    assert host.locator(".jpm-ex-estimate").inner_text() == "estimate 1.25 ms bound by ICI"
    colls = host.locator(".jpm-ex-collectives tbody tr")
    assert colls.count() == 2 and colls.nth(0).inner_text().split("\t") == ["all-gather", "16.0 MiB", "2", "w1 over data"]
    assert "cell:3 h = x @ w1" in host.locator(".jpm-ex-largest").inner_text()
    assert host.locator(".jpm-ex-diff").inner_text() == "since the previous layout: peak −1.0 GiB, +2 all-gathers, estimate +0.4 ms"
    # The status while busy, no message.
    status = host.locator(".jpm-ex-status")
    assert "jpm-ex-busy" in status.get_attribute("class") and status.inner_text().startswith("planning data=4,model=2")
    assert host.locator(".jpm-ex-message").count() == 0
    # The tried layouts, ranked, the current one marked, "no" in the fits column of the other.
    tried = host.locator(".jpm-ex-tried tbody tr")
    assert tried.count() == 2
    assert tried.nth(0).get_attribute("aria-current") == "true" and tried.nth(1).get_attribute("aria-current") is None
    assert tried.nth(1).locator("td").nth(4).inner_text() == "no"
    assert tried.nth(1).locator(".jpm-ex-rowmesh").inner_text() == "data=4,model=2 Explicit"
    assert tried.nth(1).locator(".jpm-ex-line").inner_text().startswith("%%shard --plan --mesh data=4,model=2 --in params=P(None, 'model')")
    view_page.shot(host, "explorer_light")
    dark = view_page.mount("explorer", explorer_state(message="model is used twice in params['w1']: P('model', 'model')"), mode="native", theme="dark")
    view_page.shot(dark, "explorer_dark")


def test_an_axis_toggle_sends_the_new_spec(view_page: Any) -> None:
    host = view_page.mount("explorer", explorer_state(), mode="native")
    toggle(host, "params['w1']", 1, "model").click()  # add model on dim 1
    toggle(host, "params['w1']", 0, "data").click()  # take data off dim 0
    toggle(host, "x", 0, "model").click()  # x: ('data', 'model') -> ('data',)
    toggle(host, "params['b1']", 0, "model").click()
    assert sent(view_page, host) == [
        {"kind": "choose", "name": "params['w1']", "spec": [["data"], ["model"]]},
        {"kind": "choose", "name": "params['w1']", "spec": [[], []]},
        {"kind": "choose", "name": "x", "spec": [["data"], []]},
        {"kind": "choose", "name": "params['b1']", "spec": [["model"]]},
    ]
    # The view draws the kernel's state, not its own guess: nothing changed until a state comes.
    assert toggle(host, "params['w1']", 1, "model").get_attribute("aria-pressed") == "false"


def test_a_dimension_the_axes_do_not_divide_is_marked_but_still_sent(view_page: Any) -> None:
    state = explorer_state()
    state["inputs"][1]["shape"] = [6]  # 6 is not a multiple of data=4
    host = view_page.mount("explorer", state, mode="native")
    data = toggle(host, "params['b1']", 0, "data")
    assert "jpm-ex-nodiv" in data.get_attribute("class")
    assert "does not divide 6" in data.get_attribute("title")
    assert "jpm-ex-nodiv" not in toggle(host, "params['b1']", 0, "model").get_attribute("class")
    data.click()  # the kernel says why in one line; the view does not refuse for it
    assert sent(view_page, host) == [{"kind": "choose", "name": "params['b1']", "spec": [["data"]]}]


def test_a_target_without_topology_offers_none(view_page: Any) -> None:
    state = explorer_state()
    state["target"]["options"]["topology"] = ["1x1", "2x2", "4x4"]
    state["plan"]["largest"] = [{"what": "output y, line 3: y = x @ w", "bytes": MIB, "line": "line 3: y = x @ w"}]
    host = view_page.mount("explorer", state, mode="native")
    topology = host.locator(".jpm-ex-topology")
    assert topology.input_value() == "" and topology.locator("option:checked").inner_text() == "none"
    topology.select_option("2x2")
    assert sent(view_page, host) == [{"kind": "retarget", "hardware": "tpu-v5e", "topology": "2x2"}]
    # The buffer's description already names its line: no "where" column repeating it.
    assert host.locator(".jpm-ex-largest thead th").all_inner_texts() == ["bytes", "what"]


def test_the_pickers_send_reshape_and_retarget(view_page: Any) -> None:
    host = view_page.mount("explorer", explorer_state(), mode="native")
    host.locator(".jpm-ex-shape").select_option("data=2,model=4")
    host.locator(".jpm-ex-hardware").select_option("h100")
    host.locator(".jpm-ex-types").select_option("Auto")
    assert sent(view_page, host) == [
        {"kind": "reshape", "mesh": "data=2,model=4"},
        {"kind": "retarget", "hardware": "h100", "topology": None},
        {"kind": "reshape", "mesh": "data=4,model=2", "axis_types": "auto"},
    ]


def test_tried_rows_restore_and_copy(view_page: Any) -> None:
    host = view_page.mount("explorer", explorer_state(), mode="native")
    rows = host.locator(".jpm-ex-tried tbody tr")
    line2 = explorer_state()["tried"][1]["line"]
    rows.nth(0).click()  # the current layout: nothing to go back to
    rows.nth(1).locator(".jpm-ex-line").click()
    rows.nth(1).focus()
    view_page.page.keyboard.press("Enter")
    assert sent(view_page, host) == [{"kind": "restore", "line": line2}] * 2
    # No clipboard on this (insecure) made-up origin: the copy button selects the line instead.
    assert view_page.page.evaluate("() => navigator.clipboard === undefined")
    rows.nth(1).locator(".jpm-ex-copy").click()
    assert view_page.page.evaluate("() => String(window.getSelection())") == line2
    assert rows.nth(1).locator(".jpm-ex-copied").inner_text().startswith("selected")
    # With a clipboard, the line goes there; copying never restores.
    view_page.page.evaluate(
        "() => { window.__copied = []; Object.defineProperty(navigator, 'clipboard', "
        "{ configurable: true, value: { writeText: async (t) => { window.__copied.push(t); } } }); }"
    )
    rows.nth(0).locator(".jpm-ex-copy").click()
    view_page.page.wait_for_function("() => window.__copied.length === 1")
    assert view_page.page.evaluate("() => window.__copied") == [explorer_state()["tried"][0]["line"]]
    assert rows.nth(0).locator(".jpm-ex-copied").inner_text() == "copied"
    assert len(sent(view_page, host)) == 2


def test_a_new_state_redraws_and_keeps_the_focus(view_page: Any) -> None:
    host = view_page.mount("explorer", explorer_state(), mode="native")
    button = toggle(host, "params['w1']", 1, "model")
    button.focus()
    after = explorer_state(message="the compiler refused P('model', 'model'): model is used twice")
    after["inputs"][0]["spec"] = [["data"], ["model"]]
    after["plan"]["peak_bytes"] = 2 * GIB
    view_page.set_state(host, after)
    assert toggle(host, "params['w1']", 1, "model").get_attribute("aria-pressed") == "true"
    assert host.locator(".jpm-ex-peak b").inner_text() == "2.0 GiB"
    assert host.locator(".jpm-ex-message").inner_text() == "the compiler refused P('model', 'model'): model is used twice"
    assert view_page.page.evaluate("() => document.activeElement.dataset.focus") == "axis:0:1:model"
    # Keyboard: the focused toggle still sends.
    view_page.page.keyboard.press("Enter")
    assert sent(view_page, host)[-1] == {"kind": "choose", "name": "params['w1']", "spec": [["data"], []]}


def test_no_plan_yet(view_page: Any) -> None:
    state = explorer_state(busy=True)
    state.update(plan=None, diff=None, tried=[], target=None)
    host = view_page.mount("explorer", state, mode="native")
    assert host.locator(".jpm-ex-noplan").inner_text() == "planning the first layout…"
    assert "none yet" in host.locator(".jpm-ex-tried").inner_text()
    assert host.locator(".jpm-ex-hardware").count() == 0


def test_does_not_fit(view_page: Any) -> None:
    state = explorer_state()
    state["plan"].update(peak_bytes=20 * GIB, fits=False, estimate_s=None, bound=None, collectives=[])
    host = view_page.mount("explorer", state, mode="native")
    assert host.locator(".jpm-ex-fit").inner_text() == "does not fit: peak 20.0 GiB per device, 4.0 GiB over the 16.0 GiB of device memory"
    assert "jpm-bad" in host.locator(".jpm-membar").get_attribute("class")
    assert host.locator(".jpm-ex-estimate").inner_text() == "no estimate (give --hardware)"
    assert "moves no data" in host.locator(".jpm-ex-collectives").inner_text()


def test_names_stay_text(view_page: Any) -> None:
    state = explorer_state(name=HOSTILE, message=HOSTILE)
    state["mesh"]["axes"] = [[HOSTILE, 4], ["model", 2]]
    state["inputs"][0]["spec"] = [[HOSTILE], []]
    state["plan"]["largest"][0].update(what=HOSTILE, line=HOSTILE)
    state["plan"]["collectives"][0]["what"] = HOSTILE
    state["plan"]["summary"] = HOSTILE
    state["status"]["text"] = HOSTILE
    state["diff"] = HOSTILE
    state["tried"][1]["line"] = HOSTILE
    state["target"]["hardware"] = HOSTILE
    state["mesh"]["shapes"].append(HOSTILE)
    host = view_page.mount("explorer", copy.deepcopy(state), mode="native")
    assert host.locator("img").count() == 0
    assert view_page.page.evaluate("() => window.__xss") is None
    assert host.locator(".jpm-ex-message").inner_text() == HOSTILE
    assert host.locator(".jpm-ex-input").nth(0).locator(".jpm-out-name").inner_text() == HOSTILE
    assert host.locator(".jpm-ex-spec").nth(0).inner_text() == f"P('{HOSTILE}', None)"
    assert host.locator(".jpm-ex-tried .jpm-ex-line").nth(1).inner_text() == HOSTILE
    assert host.locator(".jpm-ex-hardware").input_value() == HOSTILE
    text = host.inner_text()
    assert text.count(HOSTILE) >= 8
    # The hostile names travel back to the kernel unchanged.
    toggle(host, HOSTILE, 0, "model").click()
    host.locator(".jpm-ex-tried tbody tr").nth(1).click()
    assert sent(view_page, host) == [
        {"kind": "choose", "name": HOSTILE, "spec": [[HOSTILE, "model"], []]},
        {"kind": "restore", "line": HOSTILE},
    ]


def test_at_900_px_the_figures_stay_in_sight_and_axis_types_tell_rows_apart(view_page: Any) -> None:
    """Issue 42: at 900 px the largest buffers' bytes scrolled out of sight behind their descriptions; two
    tried layouts that differed only in axis types looked the same."""
    view_page.page.set_viewport_size({"width": 900, "height": 900})
    state = explorer_state()
    long = ("temporary from dot_general, line 7: logits = jnp.einsum('bsd,dv->bsv', hidden_states, embedding_table, "
            "preferred_element_type=jnp.float32)")
    state["plan"]["largest"] = [{"what": long, "bytes": 96 * MIB, "line": "line 7: logits = jnp.einsum(...)"},
                                {"what": "argument params['transformer']['layers'][11]['mlp']['w_out']",
                                 "bytes": 48 * MIB, "line": None}]
    auto = state["tried"][0]["line"].replace("data=4,model=2", "data=4,model=2 --axis-types auto")
    state["tried"].append({**state["tried"][0], "rank": 3, "line": auto, "current": False,
                           "mesh": "data=4,model=2 Auto"})
    host = view_page.mount("explorer", state, mode="native")
    # JupyterLab's output area in a 900 px window (a prompt column and the side bar's tabs beside it).
    host.evaluate("el => { el.style.maxWidth = '780px'; }")
    table = host.locator(".jpm-ex-largest .jpm-scroll")
    shown = table.bounding_box()
    assert shown["width"] <= 780
    for cell in host.locator(".jpm-ex-largest tbody td.jpm-num").all():
        box = cell.bounding_box()
        assert shown["x"] <= box["x"] and box["x"] + box["width"] <= shown["x"] + shown["width"] + 0.5, (box, shown)
    assert host.locator(".jpm-ex-largest tbody td.jpm-num").all_inner_texts() == ["96.0 MiB", "48.0 MiB"]
    rows = host.locator(".jpm-ex-tried tbody tr")
    assert rows.nth(0).locator(".jpm-ex-rowmesh").inner_text() != rows.nth(2).locator(".jpm-ex-rowmesh").inner_text()
    assert rows.nth(0).locator(".jpm-ex-line").inner_text() != rows.nth(2).locator(".jpm-ex-line").inner_text()
    view_page.shot(host, "explorer_900px")


def test_a_twin_the_kernel_updates_is_hidden_again(view_page: Any) -> None:
    """The kernel keeps the explorer's static twin current (update_display_data, the notebook's record of the
    tried layouts): JupyterLab draws the update in a new output box, which the drawn explorer hides too. The
    view is mounted as a kernel shows it: through js/loader.js, in one output area with its twin."""
    page = view_page.page
    view_page.mount("explorer", explorer_state(), mode="loader", twin="0a1b2c", attach="after", area=True)
    page.locator(".jpm-twin-0a1b2c").wait_for(state="hidden", timeout=5_000)  # js/loader.js: the first twin
    page.evaluate("""twin => {
        const old = document.querySelector(`.jpm-twin-${twin}`).closest('.jp-OutputArea-child');
        const box = document.createElement('div');
        box.className = 'jp-OutputArea-child';
        box.innerHTML = `<div class="jpm-static jpm-twin-${twin}">updated twin ${twin}</div>`;
        old.replaceWith(box);
    }""", "0a1b2c")
    page.locator(".jpm-twin-0a1b2c").wait_for(state="hidden", timeout=5_000)
    assert page.locator(".jpm-twin-0a1b2c").text_content() == "updated twin 0a1b2c"
    assert page.locator(".jpm-explorer").is_visible()
