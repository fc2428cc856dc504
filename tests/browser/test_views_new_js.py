"""CollectivesView and PlanView in a real Chromium with the fake widget model: rendering,
the movement picture against the Python twin, the step control by mouse and keyboard, the loop
toggle, the red memory bar, re-rendering, cleanup, escaping, the static HTML offline, and
screenshots into test-artifacts/ (look at them)."""

from __future__ import annotations

from typing import Any

import pytest

from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views import collectives, collectives_model, plan
from jaxpar_magic.views.palette import device_color
from sample_states import collective_card, collectives_state, plan_state, unrecorded_card

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"


def every_op_state(n: int = 8, **kw: Any) -> dict[str, Any]:
    return collectives_state(
        [
            collective_card("psum", n),
            collective_card("all_gather", n),
            collective_card("psum_scatter", n, shape=(n, 2)),
            collective_card("all_to_all", n, shape=(n,)),
            collective_card("ppermute", n, perm=[[p, (p + 1) % n] for p in range(n - 1)]),
            collective_card("psum", n, groups=[list(range(0, n, 2)), list(range(1, n, 2))]),
            collective_card("axis_index", n),
            unrecorded_card(),
            collective_card("pmax", n, count=10),
        ],
        n,
        **kw,
    )


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[k : k + 2], 16) for k in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def stage(card: Any) -> Any:
    return card.locator(".jpm-stage")


@pytest.mark.parametrize("view", ["collectives", "plan"])
def test_native_modules_and_bundle_agree(view_page: Any, view: str) -> None:
    state = every_op_state(8) if view == "collectives" else plan_state(fits=False)
    native = view_page.mount(view, state, mode="native")
    bundled = view_page.mount(view, state, mode="bundle")
    assert native.inner_html() == bundled.inner_html()
    assert native.locator(".jpm-view").count() == 1


def test_collective_cards_8_devices(view_page: Any, artifacts: Any) -> None:
    host = view_page.mount("collectives", every_op_state(8))
    cards = host.locator(".jpm-ccard")
    assert cards.count() == 9
    psum = cards.nth(0)
    assert "f32[4] → f32[4]" in psum.locator(".jpm-coll-head").inner_text()
    assert "line 3: y = lax.psum(x, 'i')" in psum.inner_text()
    # Before above after, aligned per device, heads in the palette's colours.
    tiles = psum.locator(".jpm-ctile")
    assert tiles.count() == 16
    for d in range(8):
        before, after = tiles.nth(d), tiles.nth(8 + d)
        assert before.locator(".jpm-tile-head").evaluate("e => e.style.background") == rgb(device_color(d)[0])
        bb, ab = before.bounding_box(), after.bounding_box()
        assert abs(bb["x"] - ab["x"]) < 1 and ab["y"] > bb["y"] + bb["height"]
    assert "[280 288 296 304]" in tiles.nth(8 + 5).inner_text()
    # all-reduce through one combining node; every output block striped with all 8 colours.
    assert psum.locator(".jpm-hub").count() == 1
    assert psum.locator("path.jpm-link").count() == 16  # 8 in, 8 out
    origins = psum.locator("g.jpm-slot").nth(8 + 3).get_attribute("data-origins")
    assert origins == " ".join(f"{e}:0" for e in range(8))
    # all-gather: one curve per (source, destination), each in its source's colour.
    gather = cards.nth(1)
    links = gather.locator("path.jpm-link")
    assert links.count() == 64
    assert links.nth(9).get_attribute("stroke") == device_color(int(links.nth(9).get_attribute("data-src")))[0]
    assert gather.locator(".jpm-ctile canvas.jpm-heat").count() == 8
    # Sub-groups: two groups of columns with a gap, two combining nodes.
    sub = cards.nth(5)
    assert sub.locator(".jpm-group-label").all_inner_texts() == ["group 0: 0,2,4,6", "group 1: 1,3,5,7"]
    assert sub.locator(".jpm-hub").count() == 2
    heads = sub.locator(".jpm-ctile .jpm-tile-head span:first-child").all_inner_texts()[:8]
    assert heads == [f"dev {d}" for d in (0, 2, 4, 6, 1, 3, 5, 7)]
    # Unsupported and no-movement cards say so.
    assert "not recorded: the recorder does not know psum2" in cards.nth(7).inner_text()
    assert cards.nth(6).locator("svg").count() == 0 and "no data moves between devices" in cards.nth(6).inner_text()
    # Bytes: an estimate, beside the compiled figure.
    assert "↑28 B" in psum.locator(".jpm-bytes").nth(0).inner_text()
    assert ("bytes* sent ↑ and received ↓ per device, estimated from the array sizes and the ring algorithm; "
            "the compiled collective's result buffer: 16 B per device (its size, not what it sends)") in psum.inner_text()
    assert psum.locator(".jpm-value").count() == 0  # a card names its value only when it is known
    to_all = cards.filter(has=host.page.locator(".jpm-op", has_text="all_to_all")).first
    assert "pairwise exchange: all-to-all (7 steps)" in to_all.inner_text() and "ring" not in to_all.inner_text()
    # Inspection: hovering a curve fills the detail line.
    gather.locator("path.jpm-link").nth(0).dispatch_event("mouseover")
    assert "device 0 → device 0 block 0" in host.locator(".jpm-detail").inner_text()
    view_page.shot(host, "collectives-8")
    view_page.shot(view_page.mount("collectives", every_op_state(8), theme="dark"), "collectives-8-dark")


def test_movement_model_js_matches_python(view_page: Any) -> None:
    """js/collectives_model.js and views/collectives_model.py compute the same picture data for every card
    and every step, and lay the columns out identically."""
    state = every_op_state(8)
    state["cards"].append(collective_card("all_to_all", 16, shape=(16,)))
    state["cards"].append(collective_card("psum", 5))
    state["cards"].append(collective_card("psum", 64))  # a group larger than what is drawn
    for card in state["cards"]:
        n_steps = len(card["movement"]["steps"])
        js = view_page.page.evaluate(
            """async ([card, n]) => {
                const mod = await import('/js/collectives_model.js');
                const pics = Array.from({length: n + 1}, (_, k) => mod.movementModel(card, k));
                const labels = pics[0].bottom.map((bar) => bar.map((o) => mod.labelNeed(mod.slotText(o, true, 'Σ'), 97 / bar.length, 824)));
                return {pics, geo: mod.stageGeometry(pics[0].groups), layout: mod.stageLayout(pics[0].groups), labels,
                        texts: pics.map((p) => p.bottom.map((bar) => bar.map((o) => mod.slotText(o, mod.pictureBlocked(p), mod.reduceSymbol(card.op), p.partial[0] || false))))};
            }""",
            [card, n_steps],
        )
        for k in range(n_steps + 1):
            py = collectives_model.movement_model(card, k)
            assert js["pics"][k] == py, (card["op"], k)
            blocked = collectives_model.picture_blocked(py)
            sym = collectives_model.reduce_symbol(card["op"])
            part = bool(py["partial"]) and py["partial"][0]
            assert js["texts"][k] == [[collectives_model.slot_text(o, blocked, sym, part) for o in bar] for bar in py["bottom"]]
        groups = collectives_model.movement_model(card, 0)["groups"]
        width, left, total = collectives_model.stage_geometry(groups)
        assert js["geo"] == {"width": width, "left": left, "total": total}
        assert js["layout"] == collectives_model.stage_layout(groups)
        bottom = collectives_model.movement_model(card, 0)["bottom"]
        assert js["labels"] == [[collectives_model.label_need(collectives_model.slot_text(o, True, "Σ"), 97 / len(bar), 824) for o in bar] for bar in bottom]


def test_step_control_by_mouse(view_page: Any) -> None:
    host = view_page.mount("collectives", every_op_state(8))
    card = host.locator(".jpm-ccard").nth(0)
    label = card.locator(".jpm-step-label")
    assert stage(card).get_attribute("data-step") == "0" and label.inner_text() == "whole movement"
    assert card.locator('[data-action="prev"]').get_attribute("aria-disabled") == "true"
    whole = card.locator("g.jpm-slot").nth(8).get_attribute("data-origins")
    card.locator('[data-action="next"]').click()
    assert stage(card).get_attribute("data-step") == "1"
    assert label.inner_text() == "step 1 of 14: reduce-scatter step 1 of 7"
    # Step 1 of the ring: 8 sends, each to the next device; device 1 now holds chunk 0 of 0 and 1.
    links = card.locator("path.jpm-link")
    assert links.count() == 8
    assert [(links.nth(k).get_attribute("data-src"), links.nth(k).get_attribute("data-dst")) for k in range(8)] == [
        (str(p), str((p + 1) % 8)) for p in range(8)
    ]
    slots = card.locator("g.jpm-slot")
    assert slots.count() == 2 * 8 * 8  # both bars: 8 devices x 8 chunks
    bottom_dev1_chunk0 = slots.nth(8 * 8 + 8 + 0)
    assert bottom_dev1_chunk0.get_attribute("data-device") == "1"
    assert bottom_dev1_chunk0.get_attribute("data-origins") == "0:0 1:0"
    assert card.locator("g.jpm-slot").nth(8).get_attribute("data-origins") != whole
    for _ in range(13):
        card.locator('[data-action="next"]').click()
    assert label.inner_text() == "step 14 of 14: all-gather step 7 of 7"
    assert card.locator('[data-action="next"]').get_attribute("aria-disabled") == "true"
    card.locator('[data-action="next"]').click(force=True)  # past the end (marked aria-disabled): stays
    assert stage(card).get_attribute("data-step") == "14"
    # After the last step every chunk of every device holds all 8 contributions.
    bottom = card.locator("g.jpm-slot").evaluate_all("els => els.slice(64).map(e => e.getAttribute('data-origins'))")
    assert all(len(o.split()) == 8 for o in bottom)
    card.locator('[data-action="prev"]').click()
    assert stage(card).get_attribute("data-step") == "13"
    card.locator('[data-action="whole"]').click()
    assert stage(card).get_attribute("data-step") == "0" and label.inner_text() == "whole movement"
    # The slider drives the same state.
    card.locator("input.jpm-slider").fill("7")
    assert stage(card).get_attribute("data-step") == "7"
    assert label.inner_text() == "step 7 of 14: reduce-scatter step 7 of 7"
    view_page.shot(card, "collectives-psum-step7")


def test_step_control_by_keyboard(view_page: Any) -> None:
    host = view_page.mount("collectives", every_op_state(8))
    card = host.locator(".jpm-ccard").nth(1)  # all-gather: 7 ring steps
    page = view_page.page
    card.locator('[data-action="next"]').focus()
    page.keyboard.press("Enter")
    assert stage(card).get_attribute("data-step") == "1"
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert stage(card).get_attribute("data-step") == "3"
    page.keyboard.press("End")
    assert stage(card).get_attribute("data-step") == "7"
    # Focus stays on the control at the end (aria-disabled, not disabled), so keys keep working.
    assert page.evaluate("document.activeElement.dataset.action") == "next"
    page.keyboard.press("ArrowLeft")
    assert stage(card).get_attribute("data-step") == "6"
    page.keyboard.press("Home")
    assert stage(card).get_attribute("data-step") == "0"
    page.keyboard.press("Tab")  # from "next" to the slider
    assert page.evaluate("document.activeElement.classList.contains('jpm-slider')")
    page.keyboard.press("ArrowRight")
    assert stage(card).get_attribute("data-step") == "1"
    # A one-phase movement counts its steps once (stepLabel), the slider says the same as the label.
    assert page.evaluate("document.activeElement.getAttribute('aria-valuetext')") == "step 1 of 7: all-gather"
    # All-gather ring step 1: device 3 receives device 2's block into slot 2.
    assert card.locator("g.jpm-slot[data-device='3']").nth(8 + 2).get_attribute("data-origins") == "2:0"


def test_play_steps_through_and_stops(view_page: Any) -> None:
    host = view_page.mount("collectives", collectives_state([collective_card("psum", 3)], 3))
    card = host.locator(".jpm-ccard")
    play = card.locator('[data-action="play"]')
    play.click()
    assert play.inner_text() == "❚❚ pause"
    # Four steps, one every 0.9 s: polled with a deadline, no sleep.
    view_page.page.wait_for_function(
        "() => document.querySelector('.jpm-ccard .jpm-stage').dataset.step === '4'", timeout=15_000
    )
    view_page.page.wait_for_function(
        "() => document.querySelector('.jpm-ccard [data-action=play]').textContent === '▶ play'", timeout=5_000
    )
    play.click()  # from the end: starts over
    assert stage(card).get_attribute("data-step") == "0" and play.inner_text() == "❚❚ pause"
    play.click()
    assert play.inner_text() == "▶ play"


def test_loop_toggle_first_and_last(view_page: Any) -> None:
    host = view_page.mount("collectives", every_op_state(8))
    card = host.locator(".jpm-ccard").nth(8)
    assert "ran 10×" in card.locator(".jpm-coll-head").text_content()
    first, last = card.locator('button[data-iteration="first"]'), card.locator('button[data-iteration="last"]')
    assert first.get_attribute("aria-pressed") == "true" and last.get_attribute("aria-pressed") == "false"
    assert stage(card).get_attribute("data-iteration") == "first"
    assert "(last)" not in stage(card).inner_text()
    last.click()
    assert last.get_attribute("aria-pressed") == "true" and first.get_attribute("aria-pressed") == "false"
    assert stage(card).get_attribute("data-iteration") == "last"
    assert stage(card).locator(".jpm-ctile").nth(8).inner_text().endswith("(last)")
    last.press("Shift+Tab")
    view_page.page.keyboard.press("Enter")
    assert stage(card).get_attribute("data-iteration") == "first"
    view_page.shot(card, "collectives-loop")


def test_heat_map_pixels(view_page: Any) -> None:
    host = view_page.mount("collectives", collectives_state([collective_card("all_gather", 8)], 8))
    canvas = host.locator(".jpm-ctile canvas.jpm-heat").first
    size, first, last = canvas.evaluate(
        """c => { const x = c.getContext('2d');
                  return [[c.width, c.height], [...x.getImageData(0, 0, 1, 1).data], [...x.getImageData(c.width - 1, c.height - 1, 1, 1).data]]; }"""
    )
    assert size == [4, 8]  # f32[8,4]: 8 rows, 4 columns
    assert first == [68, 1, 84, 255] and last == [253, 231, 37, 255]  # the minimum and maximum of viridis


def test_rerender_and_cleanup(view_page: Any) -> None:
    page = view_page.page
    page.evaluate(
        """() => { window.__timers = new Set();
                   const set = window.setInterval.bind(window), clear = window.clearInterval.bind(window);
                   window.setInterval = (f, ms) => { const id = set(f, ms); window.__timers.add(id); return id; };
                   window.clearInterval = (id) => { window.__timers.delete(id); clear(id); }; }"""
    )
    host = view_page.mount("collectives", every_op_state(8))
    host.locator(".jpm-ccard").nth(0).locator('[data-action="next"]').click()
    view_page.set_state(host, collectives_state([collective_card("all_gather", 4), collective_card("ppermute", 4)], 4))
    assert host.locator(".jpm-view").count() == 1
    assert host.locator(".jpm-ccard").count() == 2
    assert stage(host.locator(".jpm-ccard").nth(0)).get_attribute("data-step") == "0"
    host.locator(".jpm-ccard").nth(0).locator('[data-action="play"]').click()
    assert page.evaluate("window.__timers.size") == 1
    # A new state stops the old cards' timers; so does cleanup.
    view_page.set_state(host, every_op_state(8))
    assert page.evaluate("window.__timers.size") == 0
    host.locator(".jpm-ccard").nth(0).locator('[data-action="play"]').click()
    counts = page.evaluate(
        """() => { const m = window.jpm.mounted[0]; const before = m.model.listenerCount();
                   m.cleanup(); return [before, m.model.listenerCount(), m.el.childElementCount, window.__timers.size]; }"""
    )
    assert counts == [1, 0, 0, 0]


def test_a_card_names_the_value_it_moves(view_page: Any) -> None:
    state = collectives_state([collective_card("pmean", 8)], 8)
    state["cards"][0]["value"] = "grads['w1']"
    host = view_page.mount("collectives", state)
    assert host.locator(".jpm-coll-head .jpm-value").inner_text() == "grads['w1']"
    assert "pmean" in host.locator(".jpm-coll-head").inner_text()


def test_hostile_strings_are_text(view_page: Any) -> None:
    state = every_op_state(8)
    state["title"] = HOSTILE
    state["axes"][0]["name"] = HOSTILE
    for c in state["cards"]:
        c["source"] = HOSTILE
        c["op"] = HOSTILE
        c["value"] = HOSTILE  # a leaf path can hold any dict key
        c["axes"] = [HOSTILE]
        c["why_not"] = HOSTILE
        for it in c["iterations"]:
            for t in it["before"] + it["after"]:
                t["text"] = HOSTILE
        for s in c["movement"]["steps"]:
            s["label"] = HOSTILE
    host = view_page.mount("collectives", state)
    assert HOSTILE in host.inner_text()
    host.locator(".jpm-ccard").nth(0).locator('[data-action="next"]').click()
    assert HOSTILE in host.locator(".jpm-step-label").first.inner_text()
    assert host.locator("img").count() == 0
    assert view_page.page.evaluate("window.__xss") is None
    bad = plan_state(fits=False)
    bad["title"] = bad["caveats"][0] = bad["collectives"][0]["source"] = bad["outputs"][0]["name"] = HOSTILE
    bad["hardware"]["name"] = bad["memory"]["capacity_source"] = HOSTILE
    host = view_page.mount("plan", bad)
    assert HOSTILE in host.inner_text()
    assert host.locator("img").count() == 0
    assert view_page.page.evaluate("window.__xss") is None


def test_process_labels_on_tiles(view_page: Any) -> None:
    one = view_page.mount("collectives", every_op_state(8, device_process=[0] * 8))
    assert "p0" not in one.locator(".jpm-ccard").nth(0).locator(".jpm-tile-head").first.inner_text()
    two = view_page.mount("collectives", every_op_state(8, device_process=[0] * 4 + [1] * 4))
    heads = two.locator(".jpm-ccard").nth(0).locator(".jpm-tile-head").all_inner_texts()
    assert heads[5].split() == ["dev", "5", "p1"] and heads[0].split() == ["dev", "0", "p0"]


def test_sixteen_devices_fit_a_notebook(view_page: Any) -> None:
    state = collectives_state([collective_card("all_to_all", 64, shape=(64,)), collective_card("psum", 4096)], 4096)
    host = view_page.mount("collectives", state)
    cards = host.locator(".jpm-ccard")
    assert cards.nth(0).locator(".jpm-ctile").count() == 32
    assert cards.nth(1).locator(".jpm-ctile").count() == 32
    assert "4080 more devices not drawn" in cards.nth(1).inner_text()
    # No ring steps for a 4,096-device group, so no step control.
    assert cards.nth(1).locator(".jpm-steps").count() == 0
    assert cards.nth(0).locator(".jpm-stage").bounding_box()["width"] <= 940
    view_page.shot(host, "collectives-16")


# --- cards fit the width they are given (a notebook's output area is often 560-800 px) --------

#: Every element of every card whose box leaves the card, every stage that scrolls, and whether
#: the view itself scrolls sideways. Zero-size boxes (titles, hidden labels) are skipped.
OVERFLOW_JS = """(root) => {
    const view = root.querySelector('.jpm-view');
    const cards = [...root.querySelectorAll('.jpm-ccard')].map((card, index) => {
        const box = card.getBoundingClientRect();
        const out = [];
        for (const e of card.querySelectorAll('*')) {
            const r = e.getBoundingClientRect();
            if (r.width === 0 || r.height === 0) continue;
            if (r.right > box.right + 0.5 || r.left < box.left - 0.5) {
                out.push(`${e.tagName}.${e.getAttribute('class') || ''} ${r.left.toFixed(1)}..${r.right.toFixed(1)}`);
            }
        }
        const scrolls = [...card.querySelectorAll('.jpm-stage-scroll')].some((s) => s.scrollWidth > s.clientWidth);
        return {index, right: box.right, outside: out, scrolls};
    });
    const host = root.getBoundingClientRect();
    const style = getComputedStyle(root);
    return {view: [view.scrollWidth, view.clientWidth], viewRight: view.getBoundingClientRect().right,
            hostRight: host.right - parseFloat(style.paddingRight), cards};
}"""

#: Each top-bar block of the first picture of a card, paired with the before tile of its device:
#: the stretched picture must stay under the tiles.
ALIGN_JS = """(card) => {
    const tiles = new Map([...card.querySelectorAll('.jpm-ctile')].slice(0, 16).map((t) => [t.querySelector('.jpm-tile-head span').textContent, t.getBoundingClientRect()]));
    const bars = card.querySelectorAll('g.jpm-slot').length ? [...card.querySelectorAll('g.jpm-slot')] : [...card.querySelectorAll('rect.jpm-hit')];
    const cols = [...new Set([...card.querySelectorAll('.jpm-ctile .jpm-tile-head span:first-child')].map((s) => s.textContent))];
    return bars.filter((b) => b.getBoundingClientRect().top < bars[0].getBoundingClientRect().bottom).map((b, i) => {
        const r = b.getBoundingClientRect();
        const dev = b.dataset.device !== undefined ? `dev ${b.dataset.device}` : cols[i];
        const t = tiles.get(dev);
        return [dev, r.left + r.width / 2, t.left, t.right];
    });
}"""

#: The labels drawn on blocks and whether each fits the block under it (at the block's height).
LABELS_JS = """(card) => {
    const blocks = [...card.querySelectorAll('g.jpm-slot rect.jpm-slot-edge, rect.jpm-hit')].map((e) => e.getBoundingClientRect());
    return [...card.querySelectorAll('.jpm-labels text')].map((t) => {
        const r = t.getBoundingClientRect();
        const shown = parseFloat(getComputedStyle(t).fontSize) > 0;
        const cy = r.top + r.height / 2, cx = r.left + r.width / 2;
        const b = blocks.find((b) => b.left <= cx && cx <= b.right && b.top <= cy && cy <= b.bottom);
        return {text: t.textContent, shown, fits: !!b && r.left >= b.left - 1.5 && r.right <= b.right + 1.5};
    });
}"""


def assert_fits(root: Any, *, scrolling: set[int] = frozenset()) -> dict[str, Any]:
    """No element of a card leaves the card, the view does not scroll sideways, and only the
    stages of the cards in `scrolling` scroll (inside their card)."""
    got = root.evaluate(OVERFLOW_JS)
    scroll_width, client_width = got["view"]
    assert scroll_width <= client_width, got["view"]
    assert got["viewRight"] <= got["hostRight"] + 0.5
    for card in got["cards"]:
        assert card["right"] <= got["hostRight"] + 0.5, card
        assert card["scrolls"] == (card["index"] in scrolling), card
        if card["index"] not in scrolling:
            assert card["outside"] == [], card
    return got


def fit_state() -> dict[str, Any]:
    return every_op_state(8, device_process=[0] * 4 + [1] * 4)


@pytest.mark.parametrize("width", [320, 332, 560, 760])
def test_cards_fit_a_narrow_output_area(view_page: Any, width: int) -> None:
    host = view_page.mount("collectives", fit_state())
    host.evaluate("(e, w) => { e.style.width = w + 'px'; }", width)
    assert_fits(host)
    cards = host.locator(".jpm-ccard")
    # Every card is as wide as the output area allows: the drawing shrank instead of spilling.
    view_width = host.locator(".jpm-view").bounding_box()["width"]
    assert all(abs(cards.nth(k).bounding_box()["width"] - view_width) < 1 for k in range(cards.count()))
    for k in (0, 1, 2, 4, 5):  # psum, all_gather (heat maps), psum_scatter, ppermute, sub-groups
        card = cards.nth(k)
        # The stretched picture stays aligned with the columns of tiles.
        for dev, centre, left, right in card.evaluate(ALIGN_JS):
            assert left < centre < right, (k, dev, centre, left, right)
        labels = card.evaluate(LABELS_JS)
        assert all(lab["fits"] for lab in labels if lab["shown"]), (k, labels)
    # Sub-groups: the combined labels need ~535 px of picture, so they show at 760 and not at 560.
    sub = [lab for lab in cards.nth(5).evaluate(LABELS_JS) if lab["text"].startswith("Σ")]
    assert len(sub) == 8 and all(lab["shown"] == (width == 760) for lab in sub), sub
    # Every device column is drawn, device 7 included, inside the card.
    psum = cards.nth(0)
    assert psum.locator(".jpm-ctile").count() == 16 and psum.locator(".jpm-ctile").nth(7).is_visible()
    # The step control still works in a narrow card, and a step's picture fits too.
    psum.locator("input.jpm-slider").fill("7")
    assert stage(psum).get_attribute("data-step") == "7"
    assert psum.locator("g.jpm-slot").count() == 2 * 8 * 8
    assert_fits(host)
    view_page.shot(host, f"collectives-fit-{width}")
    view_page.shot(psum, f"collectives-fit-{width}-psum-step7")
    dark = view_page.mount("collectives", fit_state(), theme="dark")
    dark.evaluate("(e, w) => { e.style.width = w + 'px'; }", width)
    assert_fits(dark)
    view_page.shot(dark.locator(".jpm-ccard").nth(5), f"collectives-fit-{width}-dark")


def test_sixteen_devices_scroll_inside_the_card(view_page: Any) -> None:
    state = collectives_state([collective_card("all_to_all", 16, shape=(16,)), collective_card("psum", 8)], 16)
    host = view_page.mount("collectives", state)
    # Columns shrink to 30 px (MIN_COL_W), so 16 of them fit 560 px since 4ddaa9c; at 332 px they
    # do not: the 16-column stage keeps its readable minimum and scrolls within its card; the card,
    # its head, controls and notes stay inside; the 8-device card beside it does not scroll.
    host.evaluate("(e) => { e.style.width = '332px'; }")
    got = assert_fits(host, scrolling={0})
    card = host.locator(".jpm-ccard").nth(0)
    scroller = card.locator(".jpm-stage-scroll")
    box, sbox = card.bounding_box(), scroller.bounding_box()
    assert sbox["x"] >= box["x"] and sbox["x"] + sbox["width"] <= box["x"] + box["width"]
    assert stage(card).bounding_box()["width"] > sbox["width"]
    # Whatever leaves the card is inside the scrolled stage (and the stage did leave it).
    assert got["cards"][0]["outside"]
    escaped = card.evaluate(
        """c => [...c.querySelectorAll('*')].filter((e) => {
                 const r = e.getBoundingClientRect(), b = c.getBoundingClientRect();
                 return r.width && r.height && r.right > b.right + 0.5 && !e.closest('.jpm-stage-scroll');
               }).map((e) => e.tagName + '.' + e.getAttribute('class'))"""
    )
    assert escaped == []
    # Scrolled to the end, device 15 is in view, and the row names stay put (sticky).
    label = card.locator(".jpm-row-label").first.bounding_box()
    scroller.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    last = card.locator(".jpm-ctile").nth(15).bounding_box()
    assert last["x"] + last["width"] <= sbox["x"] + sbox["width"] + 0.5
    assert card.locator(".jpm-row-label").first.bounding_box()["x"] == label["x"]
    view_page.shot(host, "collectives-fit-16-332")


#: Each device column's before tile and the picture's <img> that spans the device columns.
STATIC_ALIGN_JS = """(card) => {
    const img = card.querySelector('img.jpm-move');
    if (!img) return null;
    const tiles = [...card.querySelectorAll('tr')[card.querySelector('.jpm-group-label') ? 1 : 0].querySelectorAll('.jpm-ctile')];
    const r = img.getBoundingClientRect();
    return {img: [r.left, r.right], first: tiles[0].getBoundingClientRect().left, last: tiles[tiles.length - 1].getBoundingClientRect().right};
}"""


@pytest.mark.parametrize("width", [320, 332, 560, 760])
def test_static_html_fits_a_narrow_output_area(view_page: Any, width: int) -> None:
    """The static cards as a notebook stores them (styles inline) shrink with the output area down
    to 320 px without scrolling, and the picture stays over its device columns."""
    page = view_page.page
    html_text = inline_styles(collectives.to_html(fit_state()))
    for scheme, background in (("light", "#ffffff"), ("dark", "#1e1e1e")):
        page.emulate_media(color_scheme=scheme)
        page.set_content(
            f'<!doctype html><meta charset="utf-8"><body style="margin:0;padding:12px;background:{background}">'
            f'<div class="out" style="width:{width}px;padding:0">{html_text}</div></body>'
        )
        out = page.locator(".out")
        got = out.evaluate(OVERFLOW_JS)
        assert got["view"][0] <= got["view"][1], got["view"]
        for card in got["cards"]:
            assert card["right"] <= got["hostRight"] + 0.5, card
            assert not card["scrolls"], card  # 8 device columns shrink to fit 320 px: no scrolling
        cards = out.locator(".jpm-ccard")
        for k in range(cards.count()):
            spans = cards.nth(k).evaluate(STATIC_ALIGN_JS)
            if spans is not None:
                assert abs(spans["img"][0] - spans["first"]) < 4 and abs(spans["img"][1] - spans["last"]) < 4, (k, spans)
        view_page.shot(out, f"static-collectives-fit-{width}" + ("-dark" if scheme == "dark" else ""))


def test_plan_view_fits(view_page: Any) -> None:
    host = view_page.mount("plan", plan_state())
    bar = host.locator(".jpm-membar")
    assert "jpm-bad" not in bar.get_attribute("class")
    assert host.locator(".jpm-mem-over").count() == 0
    assert "fits: 768.0 MiB is 4.7% of the 16.0 GiB of device memory" in host.locator(".jpm-fit").inner_text()
    # Stacked parts in proportion: arguments and outputs a sixth of the temporaries' width each... of the total.
    widths = [host.locator(f".jpm-mem-{k}").first.bounding_box()["width"] for k in ("argument", "output", "temp")]
    assert abs(widths[2] - 4 * widths[0]) < 2 and abs(widths[0] - widths[1]) < 1
    rows = host.locator(".jpm-roof-name")
    assert rows.all_inner_texts() == ["compute", "memory", "collectives"]
    assert "jpm-bound" in rows.nth(0).get_attribute("class")
    assert "bounds the estimate" in host.locator(".jpm-roof-val").nth(0).inner_text()
    table = host.locator("table.jpm-plan-table").first
    assert table.locator("tbody tr").count() == 2
    assert table.locator("th").all_inner_texts() == ["op", "shape", "bytes / device", "groups", "source", "time"]
    assert "64.0 MiB" in table.locator("tbody tr").nth(0).inner_text()
    assert "P(None, 'model')" in host.locator("table.jpm-plan-table").nth(1).inner_text()
    assert host.locator(".jpm-caveats li").count() == 2 and host.locator(".jpm-caveats").is_visible()
    view_page.shot(host, "plan-fits")


def test_plan_view_red_when_it_does_not_fit(view_page: Any) -> None:
    host = view_page.mount("plan", plan_state())
    view_page.set_state(host, plan_state(fits=False))  # re-render on change
    bar = host.locator(".jpm-membar")
    assert "jpm-bad" in bar.get_attribute("class")
    r, g, b = (int(v) for v in bar.evaluate("e => getComputedStyle(e).borderTopColor").strip("rgba()").split(",")[:3])
    assert r > 150 and g < 90 and b < 90, (r, g, b)
    fit = host.locator(".jpm-fit")
    assert "does not fit: 768.0 MiB needs 256.0 MiB more than the 512.0 MiB of device memory" in fit.inner_text()
    # The capacity mark sits at 512/768 of the bar; the hatched overshoot runs from it to the end.
    box = bar.bounding_box()
    cap = host.locator(".jpm-mem-cap").bounding_box()
    over = host.locator(".jpm-mem-over").bounding_box()
    assert abs((cap["x"] - box["x"]) / box["width"] - 2 / 3) < 0.01
    assert abs(over["x"] + over["width"] - (box["x"] + box["width"])) < 3
    host.locator(".jpm-mem-over").hover()
    assert "over the device memory by 256.0 MiB" in host.locator(".jpm-detail").inner_text()
    view_page.shot(host, "plan-does-not-fit")
    dark = view_page.mount("plan", plan_state(fits=False), theme="dark")
    view_page.shot(dark, "plan-does-not-fit-dark")
    bare = view_page.mount("plan", plan_state(hardware=False))
    assert bare.locator(".jpm-roof").count() == 0 and "no step-time estimate" in bare.inner_text()
    view_page.shot(bare, "plan-no-hardware")


def test_static_html_renders_offline(view_page: Any) -> None:
    pages = {
        "collectives": inline_styles(collectives.to_html(every_op_state(8))),
        "plan": inline_styles(plan.to_html(plan_state(fits=False))),
    }
    page = view_page.page
    page.set_content(
        '<!doctype html><meta charset="utf-8"><body style="margin:0;padding:12px;font-family:sans-serif">'
        + "".join(f'<div class="out" id="{k}" style="width:940px;margin-bottom:16px">{v}</div>' for k, v in pages.items())
        + "</body>"
    )
    assert page.evaluate("document.scripts.length") == 0
    for name in pages:
        out = page.locator(f"#{name}")
        assert out.locator(".jpm-view").bounding_box()["height"] > 100, name
        view_page.shot(out, f"static-{name}")
    coll = page.locator("#collectives")
    assert coll.locator(".jpm-ccard").count() == 9
    assert coll.locator("img.jpm-move").count() == 8
    heat = coll.locator("img.jpm-heat").first
    assert heat.evaluate("e => e.complete && e.naturalWidth") == 4
    head = coll.locator(".jpm-ctile .jpm-tile-head").nth(3)
    assert head.evaluate("e => getComputedStyle(e).backgroundColor") == rgb(device_color(3)[0])
    # Same columns as the live view: before above after for each device.
    tiles = coll.locator(".jpm-ccard").first.locator(".jpm-ctile")
    assert abs(tiles.nth(2).bounding_box()["x"] - tiles.nth(10).bounding_box()["x"]) < 1
    assert "jpm-bad" in page.locator("#plan .jpm-membar").get_attribute("class")


def test_empty_states(view_page: Any) -> None:
    for view in ("collectives", "plan"):
        host = view_page.mount(view, {})
        assert "cannot draw" not in host.inner_text()
    assert "none: the cell called no collective" in view_page.mount("collectives", {}).inner_text()


# --- processes in the existing views (jpm_schemas.md section 3) ----------------------------------


def test_processes_devices_view_names_hosts(view_page: Any, samples: Any) -> None:
    state = samples.devices(8, processes=2)
    state["hosts"] = {"0": {"host": "node-a", "pid": 101}, "1": {"host": HOSTILE, "pid": 202}}
    host = view_page.mount("devices", state)
    heads = host.locator(".jpm-h").all_text_contents()
    assert heads == ["process 0 · 4 devices · host node-a · pid 101", f"process 1 · 4 devices · host {HOSTILE} · pid 202"]
    host.locator(".jpm-card").nth(1).hover()
    assert host.locator(".jpm-detail").inner_text() == "device 1 · cpu · process 0 · host node-a · pid 101"
    assert host.locator("img").count() == 0 and view_page.page.evaluate("window.__xss") is None
    view_page.shot(host, "devices-2proc-hosts")


def test_processes_results_tiles_labelled(view_page: Any, samples: Any) -> None:
    state = samples.result(8)
    plain = view_page.mount("results", dict(state, device_process=[0] * 8))
    assert plain.locator(".jpm-proc").count() == 0
    state["device_process"] = [0, 0, 0, 0, 1, 1, 1, 1]
    host = view_page.mount("results", state)
    labels = host.locator(".jpm-tile .jpm-proc").all_inner_texts()
    assert labels == ["p0"] * 4 + ["p1"] * 4
    host.locator(".jpm-tile").nth(6).hover()
    assert "y on device 6 (i=6) · process 1: float32[5]" in host.locator(".jpm-detail").inner_text()
    assert host.locator(".jpm-same-strip i").nth(5).get_attribute("title").startswith("total on device 5 (process 1)")
    view_page.shot(host, "results-2proc")


def test_processes_sharding_legend_and_tooltips(view_page: Any, samples: Any) -> None:
    state = samples.sharding([4000, 10000], [("data", 4), ("model", 2)], ["data", None], name="v")
    state["device_process"] = {str(d): d // 4 for d in range(8)}
    host = view_page.mount("sharding", state)
    assert host.locator(".jpm-procs").all_inner_texts() == [
        "process 0: devices 0–3 · holds 2 blocks",
        "process 1: devices 4–7 · holds 2 blocks",
    ]
    host.locator(".jpm-block").nth(3).hover()
    assert host.locator(".jpm-detail").inner_text().endswith("devices 6,7 (2, replicated) · process 1")
    view_page.shot(host, "sharding-2proc")
    # The same in the static HTML the live view's twin writes.
    from jaxpar_magic.views import sharding

    assert "process 1: devices 4–7 · holds 2 blocks" in sharding.to_html(state)


def test_the_wire_state_draws_what_the_state_does(view_page: Any) -> None:
    """What the widget receives (views/collectives.py's wire_state: packed transfers, no tile values)
    draws exactly what the full state draws, at the whole movement and at every ring step."""
    from jaxpar_magic.views.collectives import wire_state

    state = every_op_state(8)
    packed = wire_state(state)
    assert all(isinstance(t, list) for c in packed["cards"] for t in (c.get("movement") or {}).get("transfers") or [])
    full, wired = view_page.mount("collectives", state), view_page.mount("collectives", packed)
    assert full.inner_html() == wired.inner_html()
    for host in (full, wired):
        host.locator('.jpm-ccard[data-op="psum"] button[data-action="next"]').first.click()
    assert full.inner_html() == wired.inner_html()
    assert "step 1 of 14" in wired.locator('.jpm-ccard[data-op="psum"] .jpm-step-label').first.inner_text()


@pytest.mark.parametrize("width", [320, 332])
def test_plan_view_fits_a_narrow_output_area(view_page: Any, width: int) -> None:
    """At 320 px (JupyterLab 700 px wide with its file browser open) no roofline figure is cut off:
    names and values wrap; only the tables scroll, inside their own scroller."""
    host = view_page.mount("plan", plan_state())
    host.evaluate("(e, w) => { e.style.width = w + 'px'; }", width)
    right = host.evaluate("e => e.getBoundingClientRect().right")
    for cls in ("jpm-roof-name", "jpm-roof-val", "jpm-roof-track", "jpm-estimate", "jpm-fit"):
        boxes = host.locator(f".{cls}")
        for k in range(boxes.count()):
            assert boxes.nth(k).bounding_box()["x"] + boxes.nth(k).bounding_box()["width"] <= right + 0.5, (cls, k)
    assert "bounds the estimate" in host.locator(".jpm-roof").inner_text()
    view_page.shot(host, f"plan-{width}")


def test_plan_view_says_what_was_donated_and_that_the_compiler_refused(view_page: Any) -> None:
    """The memory notes (--donate, the advice of a step that does not fit) and what the time beside
    the title measured are drawn as the static form writes them (views/plan.py's twins)."""
    state = plan_state(fits=False)
    state["memory"]["notes"] = ["donated: params, opt (as jax.jit's donate_argnums): 1.0 MiB of outputs are "
                                "written into their buffers, counted once.", "To make it fit: recompute activations"]
    state["compiled"] = "refused"
    host = view_page.mount("plan", state)
    notes = host.locator(".jpm-section .jpm-note").all_inner_texts()
    assert state["memory"]["notes"][0] in notes and state["memory"]["notes"][1] in notes
    assert "the compiler refused it after" in host.locator(".jpm-head").inner_text()
    static = plan.to_html(state)
    assert "the compiler refused it after" in static and state["memory"]["notes"][1] in static
