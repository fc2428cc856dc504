"""`--collectives` cards name each call's compiled collective (its result buffer) when one line of the
cell issues several calls: a mixture-of-experts layer's two all_to_alls and a ring's ppermutes in a
`lax.fori_loop`, written in a function of an earlier cell, as the course's examples write them."""
from __future__ import annotations

import textwrap

from IPython.utils.capture import capture_output

from shell_helpers import N_DEVICES, shown_widgets

HELPERS = """\
import jax.numpy as jnp
from jax import lax

ring = [(k, (k + 1) % 8) for k in range(8)]

def moe_layer(dispatched):                       # [experts, capacity, d] on each device
    expert_in = lax.all_to_all(dispatched, 'i', 0, 0, tiled=True)
    hidden = jnp.concatenate([expert_in, expert_in], axis=-1)   # d -> 2d
    return lax.all_to_all(hidden, 'i', 0, 0, tiled=True)

def ring_attention(q, k, v):
    def step(j, carry):
        k, v, acc = carry
        acc = acc + (q * k).sum() * v
        k = lax.ppermute(k, 'i', perm=ring)
        v = lax.ppermute(v, 'i', perm=ring)
        return k, v, acc
    return lax.fori_loop(0, 8, step, (k, v, jnp.zeros_like(v)))[2]

def ring_attention_pairs(q, k, v):
    def step(j, carry):
        k, v, acc = carry
        acc = acc + (q * k).sum() * v
        k, v = lax.ppermute((k, v), 'i', perm=ring)
        return k, v, acc
    return lax.fori_loop(0, 8, step, (k, v, jnp.zeros_like(v)))[2]
"""


def cards_of(jx, line: str, cell: str) -> list[dict]:
    with capture_output() as captured:
        jx.run_cell_magic("pmap", line, textwrap.dedent(cell))
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "CollectivesView"]
    return view.state["cards"]


def test_a_mixture_of_experts_layers_two_all_to_alls_each_find_their_compiled_buffer(jx):
    assert N_DEVICES == 8
    jx.run_cell(HELPERS, store_history=False)
    jx.run_cell("tokens = jnp.ones((8, 8 * 2, 4))", store_history=False)  # 8 experts, capacity 2, d = 4
    cards = cards_of(jx, "-a i --collectives --no-show", "out = moe_layer(tokens)")
    assert [c["op"] for c in cards] == ["all_to_all", "all_to_all"]
    # XLA:CPU compiles each as a tuple of 8 blocks, f32[2,4] then f32[2,8]: 8 × 32 B and 8 × 64 B.
    assert [c["bytes"]["compiled"] for c in cards] == [256, 512]


def test_a_rings_ppermutes_in_a_fori_loop_each_find_their_compiled_buffer(jx):
    jx.run_cell(HELPERS, store_history=False)
    jx.run_cell("q = jnp.ones((8, 4))\nk = jnp.ones((8, 4))\nv = jnp.ones((8, 2, 4))", store_history=False)
    for function in ("ring_attention", "ring_attention_pairs"):
        cards = cards_of(jx, "-a i --collectives --no-show", f"out = {function}(q, k, v)")
        assert [c["op"] for c in cards] == ["ppermute", "ppermute"], function
        assert [c["count"] for c in cards] == [8, 8], function
        # K is f32[4] on each device (16 B), V f32[2,4] (32 B).
        assert [c["bytes"]["compiled"] for c in cards] == [16, 32], function
