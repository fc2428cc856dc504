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
    assert collectives_model.MIN_COL_W - 1e-9 <= width * scale < collectives_model.MIN_COL_W + width / total
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
    # The head; the reduce-scatter's 7 steps; the all-gather's first step, then the 6 more that
    # look the same here (complete sums passed around), folded into one row.
    assert len(rows) == 1 + 1 + 7 + 1 + 1 + 1, rows
    assert ">reduce-scatter</th>" in rows[1] and ">all-gather</th>" in rows[9]
    assert "6 more steps like the one above" in rows[11]
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in rows[2:9] + rows[10:11]]
    assert all(len(c) == 8 for c in cells)
    # Step 1: each device adds its neighbour's block to its own: sums of two devices.
    assert all(re.fullmatch(r"Σ\(\d,\d\)", c) for c in cells[0]), cells[0]
    # After the reduce-scatter every device holds one complete block, and the all-gather passes
    # complete blocks around.
    assert cells[6] == ["Σ(0–7)"] * 8 and cells[7] == ["Σ(0–7)"] * 8
    assert [re.search(r"<th>(\d+) of 7</th>", r).group(1) for r in rows[2:9] + rows[10:11]] == [str(k) for k in range(1, 8)] + ["1"]
    # Only the all-reduce family lists its ring: the other pictures say it all.
    gather = collectives.to_html(collectives_state([collective_card("all_gather", 8)], 8))
    assert "jpm-steps-table" not in gather


def test_a_one_phase_movement_does_not_say_its_step_twice() -> None:
    from jaxpar_magic.views.collectives_model import step_label

    assert step_label(1, [{"label": "permute step 1 of 1"}]) == "step 1 of 1: permute"
    ring = [{"label": f"reduce-scatter step {k} of 7"} for k in range(1, 8)] + [
        {"label": f"all-gather step {k} of 7"} for k in range(1, 8)]
    assert step_label(3, ring) == "step 3 of 14: reduce-scatter step 3 of 7"
    assert movement_model(collective_card("ppermute", 8), 1)["label"] == "step 1 of 1: permute"
