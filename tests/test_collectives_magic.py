"""`--collectives` through the magics: `%%pmap` block and function mode and `%%shard_map` show one
card per collective call, with values equal to JAX's own; without the flag nothing extra is compiled.
(The recorder itself is tested in tests/test_recorder.py, the view in tests/test_views_collectives.py.)
"""
from __future__ import annotations

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax import lax

from shell_helpers import N_DEVICES, shown_widgets

ISSUE_CELL = """\
y = x * 2
total = lax.psum(y, 'i')                  # every device: the sum over all 8
everyone = lax.all_gather(x, 'i')         # every device: all 8 values
mine = lax.psum_scatter(table, 'i')       # device k: the sum of row k over devices
"""


def cards_of(captured) -> list[dict]:
    views = [w for w in shown_widgets(captured) if type(w).__name__ == "CollectivesView"]
    assert len(views) == 1, [type(w).__name__ for w in shown_widgets(captured)]
    return views[0].state["cards"]


def values(tiles) -> np.ndarray:
    return np.array([t["values"] for t in tiles], dtype=float)


@pytest.fixture
def data(jx):
    x = jnp.arange(float(N_DEVICES))
    table = jnp.arange(float(N_DEVICES * N_DEVICES)).reshape(N_DEVICES, N_DEVICES)
    jx.push({"x": x, "table": table})
    return x, table


def test_the_issues_cell_gives_one_card_per_call_in_program_order(jx, data):
    x, table = data
    with capture_output() as captured:
        jx.run_cell_magic("pmap", "-a i --collectives", textwrap.dedent(ISSUE_CELL))
    cards = cards_of(captured)
    assert [c["op"] for c in cards] == ["psum", "all_gather", "psum_scatter"]
    assert [c["line"] for c in cards] == [2, 3, 4]
    assert cards[1]["in_shape"] == "f32[]" and cards[1]["out_shape"] == "f32[8]"
    reference = jax.pmap(lambda x, t: (lax.psum(x * 2, "i"), lax.all_gather(x, "i"), lax.psum_scatter(t, "i")),
                         axis_name="i")(x, table)
    for card, expected in zip(cards, reference):
        (only,) = card["iterations"]
        np.testing.assert_allclose(values(only["after"]).reshape(np.asarray(expected).shape), expected)
    np.testing.assert_allclose(values(cards[0]["iterations"][0]["before"]).ravel(), np.asarray(x) * 2)
    assert cards[2]["movement"]["kind"] == "reduce-scatter"
    json.dumps(cards)  # all JSON-able: it goes to the browser


def test_without_the_flag_nothing_is_recorded_or_recompiled(jx, data, compiles):
    with capture_output() as captured:
        jx.run_cell_magic("pmap", "-a i", textwrap.dedent(ISSUE_CELL))
    assert not [w for w in shown_widgets(captured) if type(w).__name__ == "CollectivesView"]
    before = compiles.count
    with capture_output():
        jx.run_cell_magic("pmap", "-a i", textwrap.dedent(ISSUE_CELL))
    assert compiles.count == before  # the plain program is cached on its own


def test_a_loop_says_how_often_it_ran(jx, data):
    with capture_output() as captured:
        jx.run_cell_magic("pmap", "--collectives", "y = lax.fori_loop(0, 5, lambda k, v: lax.psum(v, 'i') / 8 + 1, x)")
    (card,) = cards_of(captured)
    assert card["count"] == 5 and [it["label"] for it in card["iterations"]] == ["first", "last"]


def test_function_mode_records_the_first_call_and_shows_it_again(jx, data, compiles):
    with capture_output():
        jx.run_cell_magic("pmap", "--collectives", "def step(v):\n    return lax.pmean(v, 'i')\n")
    step = jx.user_ns["step"]
    with pytest.raises(UsageError, match="nothing was recorded"):
        step.collectives()
    x, _ = data
    with capture_output() as captured:
        out = step(x)
    np.testing.assert_allclose(out, np.full(N_DEVICES, 3.5))
    (card,) = cards_of(captured)
    assert card["op"] == "pmean"
    np.testing.assert_allclose(values(card["iterations"][0]["after"]).ravel(), np.full(N_DEVICES, 3.5))
    assert step.collectives().state["cards"] == [card]
    with capture_output() as later:  # later calls run the plain program and show nothing
        step(x)
        before = compiles.count
        step(x)
    assert compiles.count == before and not later.outputs


def test_shard_map_cells_record_too(jx):
    with capture_output():
        jx.run_line_magic("mesh", "x=4 y=2 --no-show")
    a = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    b = jnp.ones((16, 4))
    jx.push({"a": a, "b": b})
    with capture_output() as captured:
        jx.run_cell_magic("shard_map", "--mesh mesh --in a=x,y b=y,None --out c=x,None --collectives --no-show",
                          "c = lax.psum(jnp.dot(a, b), 'y')")
    (card,) = cards_of(captured)
    assert card["op"] == "psum" and card["axes"] == ["y"]
    assert card["groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    np.testing.assert_allclose(jx.user_ns["c"], np.asarray(a) @ np.ones((16, 4)))
    blocks = np.asarray(a).reshape(4, 2, 2, 8).transpose(0, 2, 1, 3).reshape(8, 2, 8) @ np.ones((8, 4))
    before = values(card["iterations"][0]["before"])
    np.testing.assert_allclose(before, blocks.reshape(8, -1)[:, :before.shape[1]])


def test_a_psum_of_an_empty_array(jx):
    """A 0-size collective (issue 33 item 9): plain JAX's empty result, and a card with empty tiles
    (its records have no values to fold by device)."""
    with capture_output() as captured:
        jx.run_cell_magic("pmap", "-a i --collectives", "z = lax.psum(jnp.zeros((0, 3)), 'i')")
    z = jx.user_ns["z"]
    assert z.shape == (N_DEVICES, 0, 3) and z.dtype == jnp.float32
    (card,) = cards_of(captured)
    assert (card["op"], card["in_shape"], card["out_shape"]) == ("psum", "f32[0,3]", "f32[0,3]")
    assert [t["values"] for t in card["iterations"][0]["after"]] == [[]] * N_DEVICES
