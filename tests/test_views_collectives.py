"""CollectivesView without a browser: the movement picture's data against each collective's
definition, static HTML (escaped, bounded, no script), text, the mime bundle, and the sample
states' values against jax.pmap.

The same states in Chromium: tests/browser/test_views_new_js.py.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import numpy as np
import pytest
from html_tags import parse
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpar_magic.views.inline import inline_styles
from jaxpar_magic.views.textwidth import fit_text, text_width
from jaxpar_magic.views import CollectivesView, base, collectives, collectives_model
from jaxpar_magic.views.collectives_model import hubs, movement_model, slot_text
from jaxpar_magic.views.palette import device_color
from sample_states import collective_card, collectives_state, unrecorded_card

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: Tags the static HTML may hold; anything else means a string got in unescaped.
ALLOWED_TAGS = {"div", "span", "b", "i", "pre", "img", "table", "colgroup", "col", "tr", "td", "th", "br"}


def pictures(out: str) -> list[str]:
    """The movement pictures of a static page, decoded: each an SVG document in an <img>."""
    import base64

    return [base64.b64decode(uri).decode() for uri in re.findall(r'<img class="jpm-move" src="data:image/svg\+xml;base64,([^"]*)"', out)]


def every_op_state(n: int = 8) -> dict[str, Any]:
    return collectives_state(
        [
            collective_card("psum", n),
            collective_card("all_gather", n),
            collective_card("all_gather", n, tiled=True, shape=(2, 3)),
            collective_card("psum_scatter", n, shape=(n, 2)),
            collective_card("all_to_all", n, shape=(n,)),
            collective_card("ppermute", n),
            collective_card("psum", n, groups=[list(range(0, n, 2)), list(range(1, n, 2))]),
            collective_card("axis_index", n),
            unrecorded_card(),
            collective_card("pmax", n, count=10),
        ],
        n,
    )


# --- the movement picture: which device's block lands where -----------------------------


def _group(card: dict[str, Any], d: int) -> list[int]:
    return next(g for g in card["groups"] if d in g)


def test_whole_movement_all_reduce_every_contribution_reaches_every_output() -> None:
    card = collective_card("psum", 8)
    pic = movement_model(card, 0)
    assert pic["columns"] == list(range(8)) and pic["in_slots"] == pic["out_slots"] == 1
    for d, bar in zip(pic["columns"], pic["bottom"]):
        assert bar == [[[e, 0] for e in range(8)]], d
    # Drawn through one combining node: 8 contributions in, 8 outputs out.
    (srcs, dsts), *rest = hubs(pic["links"])[0]
    assert rest == [] and sorted(t["src"] for t in srcs) == list(range(8)) and sorted(t["dst"] for t in dsts) == list(range(8))
    assert hubs(pic["links"])[1] == []  # no link left to draw directly


def test_whole_movement_all_gather_block_j_comes_from_device_j() -> None:
    card = collective_card("all_gather", 8)
    pic = movement_model(card, 0)
    assert (pic["in_slots"], pic["out_slots"]) == (1, 8)
    for bar in pic["bottom"]:
        assert bar == [[[j, 0]] for j in range(8)]
    assert len(pic["links"]) == 64 and hubs(pic["links"])[0] == []


def test_whole_movement_reduce_scatter_block_k_of_every_input_into_device_k() -> None:
    card = collective_card("psum_scatter", 8, shape=(8, 2))
    pic = movement_model(card, 0)
    assert (pic["in_slots"], pic["out_slots"]) == (8, 1)
    for k, bar in zip(pic["columns"], pic["bottom"]):
        assert bar == [[[e, k] for e in range(8)]]
    assert hubs(pic["links"])[0] == []  # every output has its own set of contributions
    assert slot_text(pic["bottom"][3][0], True, "Σ") == "Σ(0–7):3"


def test_whole_movement_all_to_all_is_a_transpose_of_blocks() -> None:
    card = collective_card("all_to_all", 8, shape=(8,))
    pic = movement_model(card, 0)
    assert (pic["in_slots"], pic["out_slots"]) == (8, 8)
    for k, bar in zip(pic["columns"], pic["bottom"]):
        assert bar == [[[j, k]] for j in range(8)]


def test_whole_movement_permute_and_a_device_nobody_sends_to() -> None:
    card = collective_card("ppermute", 8)
    pic = movement_model(card, 0)
    assert [bar[0] for bar in pic["bottom"]] == [[[(d - 1) % 8, 0]] for d in range(8)]
    half = collective_card("ppermute", 8, perm=[[0, 1], [1, 2]])
    bottom = movement_model(half, 0)["bottom"]
    assert bottom[0] == [[]] and bottom[1] == [[[0, 0]]] and bottom[2] == [[[1, 0]]] and bottom[5] == [[]]
    assert slot_text(bottom[0][0], False, "Σ") == "·"


def test_sub_groups_are_separate_groups_of_columns() -> None:
    card = collective_card("psum", 8, groups=[[0, 2, 4, 6], [1, 3, 5, 7]])
    pic = movement_model(card, 0)
    assert pic["groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert pic["columns"] == [0, 2, 4, 6, 1, 3, 5, 7]
    for d, bar in zip(pic["columns"], pic["bottom"]):
        assert bar == [[[e, 0] for e in _group(card, d)]]
    assert len(hubs(pic["links"])[0]) == 2
    width, left, total = collectives_model.stage_geometry(pic["groups"])
    assert left[4] - left[3] == width + collectives_model.GROUP_GAP and total == 8 * width + collectives_model.GROUP_GAP


@pytest.mark.parametrize("groups", [[list(range(8))], [[0, 2, 4, 6], [1, 3, 5, 7]], [list(range(16))], [[0, 1]]])
def test_stage_layout_shrinks_in_proportion_between_bounds(groups: list[list[int]]) -> None:
    width, left, total = collectives_model.stage_geometry(groups)
    layout = collectives_model.stage_layout(groups)
    tracks = layout["template"].split(" minmax")
    assert tracks[0] == f"{collectives_model.LABEL_W}px"  # the row names keep their width
    fr = [float(re.fullmatch(r"\(0, ([\d.]+)fr\)", t).group(1)) for t in tracks[1:]]
    # One track per device and per gap between groups, in proportion to the design widths, so
    # the picture (design units, stretched over all of them) stays under its columns.
    n = sum(len(g) for g in groups)
    assert len(fr) == n + len(groups) - 1 and sum(fr) == total
    assert sorted(set(fr)) == sorted({width} | ({collectives_model.GROUP_GAP} if len(groups) > 1 else set()))
    assert layout["max_width"] == collectives_model.LABEL_W + total
    # At the minimum width a device column is MIN_COL_W wide (rounded up to a whole pixel).
    scale = (layout["min_width"] - collectives_model.LABEL_W) / total
    assert collectives_model.MIN_COL_W <= width * scale < collectives_model.MIN_COL_W + width / total
    assert layout["min_width"] < layout["max_width"]


def test_label_need_is_the_width_where_the_label_fits_its_block() -> None:
    card = collective_card("psum", 8, groups=[[0, 2, 4, 6], [1, 3, 5, 7]])
    width, _, total = collectives_model.stage_geometry(movement_model(card, 0)["groups"])
    w = width - 6
    text = slot_text(movement_model(card, 0)["bottom"][0][0], False, "Σ")
    need = collectives_model.label_need(text, w, total)
    room = len(text) * 6 + 2  # what a label takes, at 6 px a character
    assert w * need / total >= room > w * (need - 1) / total
    assert collectives_model.label_need("0", w, total) < need


def test_static_picture_is_an_image_across_the_device_columns() -> None:
    card = collective_card("psum", 8)
    out = collectives.to_html(collectives_state([card], 8))
    width, _, _ = collectives_model.stage_geometry(movement_model(card, 0)["groups"])
    total = 8 * width  # equal columns in the static table
    # A table of a label column and 8 equal device columns, at most its design width, as narrow as
    # the output area (8 columns fit 320 px); the picture an <img> spanning the 8 columns.
    assert (f'<div class="jpm-stage-scroll"><table class="jpm-stage" style="'
            f'max-width:{collectives_model.LABEL_W + total}px"><colgroup><col style="width:50px">' + "<col>" * 8) in out
    assert f'<td colspan="8" style="padding:0"><img class="jpm-move" src="data:image/svg+xml;base64,' in out
    (svg,) = pictures(out)
    assert svg.startswith(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {total} 92"')
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+">([^<]*)</text>', svg)
    assert [t for _, t in labels] == [str(d) for d in range(8)] + ["Σ(0–7)"] * 8
    assert all(0 < float(x) < total for x, _ in labels)
    assert re.search(rf'<ellipse cx="{total / 2:g}" cy="46" rx="8" ry="8"', svg)


def test_static_ring_steps_as_small_multiples() -> None:
    """An exported page has no step control, so the static card lists the ring's steps: a row per
    step, a column per device, what each device receives."""
    out = collectives.to_html(collectives_state([collective_card("psum", 8)], 8))
    table = out[out.index('<table class="jpm-steps-table"'):]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)
    assert len(rows) == 1 + 2 + 14  # the head, then the reduce-scatter's 7 steps and the all-gather's 7
    assert ">reduce-scatter</th>" in rows[1] and ">all-gather</th>" in rows[9]
    rows = rows[2:9] + rows[10:]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in rows]
    assert all(len(c) == 8 for c in cells)
    # Step 1: each device adds its neighbour's block to its own: sums of two devices.
    assert all(re.fullmatch(r"Σ\(\d,\d\)", c) for c in cells[0]), cells[0]
    # After the reduce-scatter every device holds one complete block, and the all-gather passes
    # complete blocks around.
    assert cells[6] == ["Σ(0–7)"] * 8 and all(c == ["Σ(0–7)"] * 8 for c in cells[7:])
    assert [re.search(r"<th>(\d+) of 7</th>", r).group(1) for r in rows] == [str(k) for k in range(1, 8)] * 2


@pytest.mark.parametrize("op", ["psum", "all_gather", "psum_scatter"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_ring_steps_end_where_the_collective_does(op: str, n: int) -> None:
    """Stepping through the ring (simulated from the steps' transfers alone) ends with what the
    whole movement says, and each step moves one block per device to its ring neighbour."""
    card = collective_card(op, n, shape=(n, 2) if op == "psum_scatter" else (4,))
    steps = card["movement"]["steps"]
    assert len(steps) == {"psum": 2 * (n - 1), "all_gather": n - 1, "psum_scatter": n - 1}[op]
    for k in range(1, len(steps) + 1):
        pic = movement_model(card, k)
        assert len(pic["links"]) == n and all(t["dst"] == (t["src"] + 1) % n for t in pic["links"])
        if k > 1:
            assert pic["top"] == movement_model(card, k - 1)["bottom"]
    final = movement_model(card, len(steps))["bottom"]
    everyone = list(range(n))
    for q, buf in enumerate(final):
        if op == "psum":  # every chunk of every device: all n contributions of that chunk
            assert buf == [[[e, b] for e in everyone] for b in range(n)]
        elif op == "all_gather":  # block j: device j's value
            assert buf == [[[j, 0]] for j in range(n)]
        else:  # device q's block q: the sum of block q over all devices
            assert buf[q] == [[e, q] for e in everyone]
    # Step 1 starts from the inputs: each device holds its own blocks (all-gather: only its own).
    first = movement_model(card, 1)["top"]
    d = n - 1
    if op == "all_gather":
        assert first[d] == [[[d, 0]] if j == d else [] for j in range(n)]
    else:
        assert first[d] == [[[d, b]] for b in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_all_to_all_and_permute_steps_end_with_the_whole_movement(n: int) -> None:
    for card in (collective_card("all_to_all", n, shape=(n,)), collective_card("ppermute", n),
                 collective_card("ppermute", n, perm=[[0, n - 1]])):
        steps = card["movement"]["steps"]
        assert steps, card["op"]
        assert movement_model(card, len(steps))["bottom"] == movement_model(card, 0)["bottom"], (card["op"], n)


def test_model_caps_devices_and_links() -> None:
    card = collective_card("all_to_all", 64, shape=(64,))
    pic = movement_model(card, 0)
    assert len(pic["columns"]) == collectives_model.MAX_DEVICES_DRAWN == 16
    assert len(pic["links"]) <= collectives_model.MAX_LINKS and pic["links_omitted"] == 0
    assert all(t["src"] in pic["columns"] and t["dst"] in pic["columns"] for t in pic["links"])
    assert card["devices_omitted"] == 48
    # The drawn devices' group goes on past them: their blocks say so.
    assert pic["partial"] == [True] * 16
    assert slot_text([], True, "Σ", True) == "…" and slot_text([], True, "Σ", False) == "·"
    psum = movement_model(collective_card("psum", 64), 0)
    assert slot_text(psum["bottom"][0][0], False, "Σ", psum["partial"][0]) == "Σ(0–15,…)"
    assert movement_model(collective_card("psum", 8), 0)["partial"] == [False] * 8
    text = collectives.to_text(collectives_state([collective_card("psum", 64)], 64))
    assert "← [Σ(0–15,…)]" in text and "… from devices not shown" in text


# --- static HTML ---------------------------------------------------------------------------


def hostile_state() -> dict[str, Any]:
    state = every_op_state(8)
    state["title"] = HOSTILE
    state["axes"][0]["name"] = HOSTILE
    for c in state["cards"]:
        c["op"] = HOSTILE + c["op"]
        c["primitive"] = HOSTILE
        c["source"] = HOSTILE
        c["axes"] = [HOSTILE]
        c["in_shape"] = HOSTILE
        c["why_not"] = HOSTILE if c["recorded"] is False else None
        for it in c["iterations"]:
            for t in it["before"] + it["after"]:
                t["text"] = HOSTILE
        for s in c["movement"]["steps"]:
            s["label"] = HOSTILE
    return state


def test_to_html_escapes_hostile_strings() -> None:
    out = collectives.to_html(hostile_state())
    assert "<img src=x" not in out and "window.__xss=1>" not in out.replace(html.escape("window.__xss=1>"), "")
    assert html.escape(HOSTILE) in out
    parsed = parse(out)
    assert set(parsed.tags) <= ALLOWED_TAGS
    assert "script" not in parsed.tags
    assert not [a for a in parsed.attrs if a.startswith("on")]
    # The only images are heat maps and pictures, drawn from data: URIs, their text escaped inside.
    assert all(src.startswith(("data:image/png;base64,", "data:image/svg+xml;base64,"))
               for src in re.findall(r'<img[^>]* src="([^"]*)"', out))
    for svg in pictures(out):
        assert "<img" not in svg and "<script" not in svg


def test_to_text_keeps_hostile_strings_literal() -> None:
    out = collectives.to_text(hostile_state())
    assert HOSTILE in out  # plain text: shown as written, nothing to escape


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_to_html_any_names_stay_text(axis: str, source: str) -> None:
    state = collectives_state([collective_card("psum", 4, axis=axis, source=source), collective_card("all_gather", 4)], 4, axis=axis)
    state["cards"][1]["movement"]["steps"][0]["label"] = source
    parsed = parse(collectives.to_html(state))
    assert set(parsed.tags) <= ALLOWED_TAGS
    assert not [a for a in parsed.attrs if a.startswith("on")]


def test_static_html_draws_each_card() -> None:
    state = every_op_state(8)
    out = collectives.to_html(state)
    assert "<script" not in out and "<style" not in out and "<svg" not in out
    cards = out.split('<div class="jpm-ccard">')[1:]
    assert len(cards) == 10
    # Device colours as the palette says, on tile heads and on curves.
    for d in range(8):
        assert f"background:{device_color(d)[0]}" in cards[0]
    assert f'stroke="{device_color(3)[0]}"' in pictures(cards[1])[0]
    # Every recorded card with movement has one still picture; axis_index and the unrecorded none.
    assert [len(pictures(c)) for c in cards] == [1, 1, 1, 1, 1, 1, 1, 0, 0, 2]  # pmax ran in a loop: first and last
    # all-gather: one curve per (source, destination) pair, 8 sources -> one path each.
    (gather,) = pictures(cards[1])
    curves = re.findall(r'<path fill="none" stroke-width="1.6" stroke="[^"]*" d="([^"]*)"', gather)
    assert len(curves) == 8 and sum(p.count(" C") for p in curves) == 64
    # psum through a combining node; sub-groups: two nodes and two group labels.
    assert pictures(cards[0])[0].count("<ellipse") == 1
    assert pictures(cards[6])[0].count("<ellipse") == 2 and cards[6].count('class="jpm-group-label"') == 2
    # Heat maps for 2-D values (all_gather's f32[8,4] outputs), as small PNGs.
    assert cards[1].count('<img class="jpm-heat') == 8
    assert "not recorded: the recorder does not know psum2" in cards[8]
    assert "first iteration" in cards[9] and "last iteration" in cards[9] and "ran 10×" in cards[9]
    assert "ring algorithm: reduce-scatter (7 steps) → all-gather (7 steps)" in cards[0]
    assert html.escape("bytes* sent ↑ and received ↓ per device, estimated from the array sizes and the ring algorithm; "
                       "the compiled collective's result buffer: 16 B per device (its size, not what it sends)") in cards[0]
    # all_to_all is a pairwise exchange and ppermute direct sends, not a ring.
    (to_all,) = [c for c in cards if ">all_to_all<" in c]
    assert "pairwise exchange: all-to-all (7 steps)" in to_all and "ring" not in to_all
    (permute,) = [c for c in cards if ">ppermute<" in c]
    assert "estimated from the array sizes and the direct sends" in permute and "ring" not in permute


def test_static_html_labels_processes_when_several() -> None:
    one = collectives.to_html(collectives_state([collective_card("psum", 8)], 8, device_process=[0] * 8))
    two = collectives.to_html(collectives_state([collective_card("psum", 8)], 8, device_process=[0] * 4 + [1] * 4))
    assert "<span>p1</span>" not in one and "<span>p0</span>" not in one
    assert two.count("<span>p1</span>") == 8 and two.count("<span>p0</span>") == 8  # before and after rows
    assert "(process 1)" in two


def test_cards_are_capped() -> None:
    cards = [collective_card("psum", 4) for _ in range(70)]
    state = collectives_state(cards, 4)
    assert len(state["cards"]) == 64 and state["omitted_cards"] == 6
    out = collectives.to_html(state)
    assert out.count('<div class="jpm-ccard">') == 64
    assert "… 6 more collective calls not shown" in out
    assert "… 6 more collective calls not shown" in collectives.to_text(state)


# --- text -----------------------------------------------------------------------------------


def test_text_has_the_key_facts() -> None:
    text = collectives.to_text(every_op_state(8))
    lines = text.splitlines()
    assert lines[0] == "collectives of %%pmap -a i  (i=8)"
    assert "[0] psum  f32[4] → f32[4]  over i · 1 group of 8" in lines
    assert "    at line 3: y = lax.psum(x, 'i')" in lines
    assert "[1] all_gather  f32[4] → f32[8,4]  over i · 1 group of 8" in lines
    # One row per device: before, after, and what landed where.
    assert any(re.fullmatch(r"      3 +\[30 31 32 33\] +\[280 288 296 304\] +← \[Σ\(0–7\)\]", line) for line in lines)
    assert any(re.fullmatch(r"      5 +\[50 51 52 53\] +\[0 1 2 3 10 11 …\] +← \[0 \| 1 \| 2 \| 3 \| 4 \| 5 \| 6 \| 7\]", line) for line in lines)
    assert any(line.strip().endswith("← [Σ(0–7):6]") for line in lines)  # reduce-scatter: device 6 gets block 6
    assert any(line.strip().endswith("← [0:5 | 1:5 | 2:5 | 3:5 | 4:5 | 5:5 | 6:5 | 7:5]") for line in lines)  # all-to-all
    assert any(re.fullmatch(r"      0 +\[0 1 2 3\] +\[70 71 72 73\] +← \[7\]", line) for line in lines)  # ppermute
    assert "[7] axis_index  → s32[]  over i · 1 group of 8" in lines
    assert "    not recorded: the recorder does not know psum2" in lines
    assert "[9] pmax  f32[4] → f32[4]  over i · 1 group of 8 · ran 10×" in lines
    assert "    first iteration:" in lines and "    last iteration:" in lines
    assert "    bytes per device (estimate, ring algorithm): sent 28 B, received 28 B" in lines
    assert "    compiled collective's result buffer: 16 B per device (its size, not what it sends)" in lines
    assert "    pairwise exchange: all-to-all (7 steps)" in lines and "    ring algorithm: all-to-all (7 steps)" not in lines
    assert "    ring algorithm: reduce-scatter (7 steps) → all-gather (7 steps)" in lines
    assert "    movement" not in text  # the receives column replaces a separate listing


def test_text_sub_groups_and_processes() -> None:
    state = collectives_state([collective_card("psum", 8, groups=[[0, 2, 4, 6], [1, 3, 5, 7]])], 8, device_process=[0, 0, 0, 0, 1, 1, 1, 1])
    lines = collectives.to_text(state).splitlines()
    rows = [line.split()[0:2] for line in lines if line.startswith("      ") and "←" in line]
    assert [r[0] for r in rows] == ["0", "2", "4", "6", "1", "3", "5", "7"]
    assert rows[2] == ["4", "p1"] and rows[0] == ["0", "p0"]
    assert any(line.endswith("← [Σ(1,3,5,7)]") for line in lines)


# --- sizes, the bundle ------------------------------------------------------------------------


def test_sizes_bounded() -> None:
    def page_of(state: dict[str, Any]) -> str:  # the static HTML as a notebook stores it: styles inline
        return inline_styles(collectives.to_html(state))

    for op, kw in [("psum", {}), ("all_gather", {}), ("psum_scatter", {"shape": (16, 2)}), ("all_to_all", {"shape": (16,)})]:
        state = collectives_state([collective_card(op, 16, **kw)], 16)
        page = page_of(state)
        # A 16-device card (the most drawn) is about a small plot: under 96 KiB, styles included.
        assert len(page.encode()) < 96 * 1024, (op, len(page))
        assert len(collectives.to_text(state).splitlines()) < 40
    # 4,096 devices: still 16 columns per card, whatever the device count.
    state = collectives_state([collective_card("psum", 4096), collective_card("all_gather", 4096)], 4096)
    page = page_of(state)
    assert len(page.encode()) < 2 * 96 * 1024
    assert page.count('class="jpm-ctile"') == 2 * 2 * 16
    assert "4080 more devices not drawn" in page
    assert len(collectives.to_text(state).splitlines()) < 60
    # The tiles' payload does not grow with the array: 64 values and a <= 16 x 16 heat map.
    big = collective_card("all_gather", 8, shape=(300, 300))
    for t in big["iterations"][0]["after"]:
        assert len(t["values"]) == 64 and t["heat"]["rows"] * t["heat"]["cols"] <= 256
    assert len(json.dumps(big)) < 64 * 1024


def test_mimebundle_has_widget_html_and_text() -> None:
    state = every_op_state(8)
    widget = CollectivesView(state=state)
    data, _ = widget._repr_mimebundle_()
    assert set(data) == {WIDGET_MIME, "text/html", "text/plain"}
    assert data["text/html"] == f'<div class="jpm-static jpm-twin-{widget._jpm_twin}">{inline_styles(collectives.to_html(state))}</div>'
    assert data["text/plain"] == fit_text(collectives.to_text(state), text_width())
    assert CollectivesView(state).state == state
    assert repr(widget) == fit_text(collectives.to_text(state), text_width())
    widget.close()


def test_bundle_is_self_contained() -> None:
    esm = CollectivesView._bundle
    assert not re.search(r"^\s*import\b", esm, re.M)
    assert "export default" in esm
    assert "const __jpm_palette = " in esm and "const __jpm_format = " in esm
    src = re.sub(r"/\*.*?\*/|//[^\n]*", "", base.read_asset("collectives.js"), flags=re.S)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in src, sink


def test_empty_state() -> None:
    assert "none: the cell called no collective" in collectives.to_text({})
    assert "none: the cell called no collective" in collectives.to_html({})


# --- the sample states are honest: their values are what jax.pmap computes -------------------


def _pmap(fn: Any, xs: np.ndarray) -> np.ndarray:
    import jax

    return np.asarray(jax.pmap(fn, axis_name="i")(xs))


@pytest.mark.parametrize(
    "op,kwargs,fn",
    [
        ("psum", {}, lambda lax: lambda x: lax.psum(x, "i")),
        ("pmax", {}, lambda lax: lambda x: lax.pmax(x, "i")),
        ("pmean", {}, lambda lax: lambda x: lax.pmean(x, "i")),
        ("psum", {"groups": [[0, 2, 4, 6], [1, 3, 5, 7]]},
         lambda lax: lambda x: lax.psum(x, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]])),
        ("all_gather", {}, lambda lax: lambda x: lax.all_gather(x, "i")),
        ("all_gather", {"tiled": True, "shape": (2, 3)}, lambda lax: lambda x: lax.all_gather(x, "i", tiled=True)),
        ("psum_scatter", {"shape": (8, 2)}, lambda lax: lambda x: lax.psum_scatter(x, "i")),
        ("psum_scatter", {"shape": (8, 2), "tiled": True}, lambda lax: lambda x: lax.psum_scatter(x, "i", tiled=True)),
        ("all_to_all", {"shape": (8,)}, lambda lax: lambda x: lax.all_to_all(x, "i", 0, 0)),
        ("ppermute", {}, lambda lax: lambda x: lax.ppermute(x, "i", [(p, (p + 1) % 8) for p in range(8)])),
        ("ppermute", {"perm": [[0, 1], [1, 2]]}, lambda lax: lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2)])),
    ],
)
def test_sample_cards_match_jax(op: str, kwargs: dict[str, Any], fn: Any) -> None:
    from jax import lax

    card = collective_card(op, 8, **kwargs)
    before = card["iterations"][0]["before"]
    xs = np.stack([np.asarray(t["values"], np.float32).reshape(t["shape"]) for t in before])
    want = _pmap(fn(lax), xs)
    for t in card["iterations"][0]["after"]:
        got = want[t["device"]]
        assert t["shape"] == list(got.shape), (op, t["device"])
        np.testing.assert_allclose(t["values"], got.reshape(-1)[:64], rtol=1e-6)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.data())
def test_heat_pixels_are_heat_rgb_of_every_cell(rows, cols, data):
    """The vectorised heat map equals `_heat_rgb` cell by cell (grey for missing and NaN cells)."""
    from jaxpar_magic.views import collectives as cv

    values = data.draw(st.lists(st.one_of(st.none(), st.just(float("nan")), st.floats(-1e3, 1e3)),
                                max_size=rows * cols))
    finite = [v for v in values if v is not None and v == v]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    expected = [[(128, 128, 128) if k >= len(values) or values[k] is None or values[k] != values[k]
                 else cv._heat_rgb((values[k] - lo) / (hi - lo) if hi > lo else 0.5)
                 for k in range(r * cols, (r + 1) * cols)] for r in range(rows)]
    assert cv._heat_pixels(values, rows, cols, lo, hi) == expected


def test_a_one_phase_movement_does_not_say_its_step_twice() -> None:
    from jaxpar_magic.views.collectives_model import step_label

    assert step_label(1, [{"label": "permute step 1 of 1"}]) == "step 1 of 1: permute"
    ring = [{"label": f"reduce-scatter step {k} of 7"} for k in range(1, 8)] + [
        {"label": f"all-gather step {k} of 7"} for k in range(1, 8)]
    assert step_label(3, ring) == "step 3 of 14: reduce-scatter step 3 of 7"
    assert movement_model(collective_card("ppermute", 8), 1)["label"] == "step 1 of 1: permute"
