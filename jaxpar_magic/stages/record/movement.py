"""Where a collective's data goes: the groups that talk, which block lands where, the ring steps,
and the bytes each device sends and receives. Pure Python, no JAX.

Blocks, as the collective cards draw them (`movement` of a card, see jpm_schemas.md section 1):
- In `transfers` (the whole movement) `src_block` numbers the blocks of the source's *input* and
  `dst_block` the blocks of the destination's *output*: all-gather sends a device's one input
  block (0) into block k of every output; reduce-scatter sends input block k of every device into
  device k's one output block (0); all-to-all sends input block k of device j into output block j
  of device k.
- In `steps` both number the blocks of the ring's working buffer, n blocks for a group of n: the
  chunks of the array being all-reduced, the output being all-gathered, the input being
  reduce-scattered. Position p of the ring starts with block p of the all-gather buffer.

Rings run in group order: position p sends to position p + 1 (mod n).
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

#: Devices drawn per card (the view draws at most this many columns).
MAX_DEVICES_DRAWN = 16

#: The movement each collective primitive (or the op the user called) draws.
KIND = {
    "psum": "all-reduce", "psum_invariant": "all-reduce", "pmean": "all-reduce", "pmax": "all-reduce",
    "pmin": "all-reduce", "all_gather": "all-gather", "all_gather_invariant": "all-gather",
    "reduce_scatter": "reduce-scatter", "psum_scatter": "reduce-scatter", "all_to_all": "all-to-all",
    "ppermute": "permute", "pshuffle": "permute",
}


# --- who talks to whom ---------------------------------------------------------------------------

def axis_index_order(axes: Sequence[str], mesh_axes: Sequence[str], primitive: str) -> tuple[str, ...]:
    """The axes in the order their linear index is formed (the first one varies slowest).

    JAX forms the index of `('b', 'a')` with 'b' slowest for all_gather, psum_scatter, all_to_all
    and axis_index_groups, but orders ppermute's (and so pshuffle's) axes as the mesh does,
    whatever order the call names them in (measured on JAX 0.10; tests/test_movement.py checks it
    against JAX).
    """
    if primitive == "ppermute":
        return tuple(a for a in mesh_axes if a in axes)
    return tuple(axes)


def groups_of(mesh_axes: Sequence[tuple[str, int]], device_ids: Sequence[int], axes: Sequence[str],
              axis_index_groups: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Device ids of each group that communicates, each in group (linear axis index) order.

    `mesh_axes` are the mesh's (name, size) pairs and `device_ids` its devices, both in mesh
    (row-major) order; `axes` the collective's axes, in index order (`axis_index_order`). The other
    mesh axes each hold one group apart; `axis_index_groups` (lists of linear indices over `axes`)
    split each of those further.
    """
    names = [n for n, _ in mesh_axes]
    sizes = [int(s) for _, s in mesh_axes]
    unknown = [a for a in axes if a not in names]
    if unknown:
        raise ValueError(f"axes {unknown} are not mesh axes {names}")
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    others = [i for i, n in enumerate(names) if n not in axes]
    used = [names.index(a) for a in axes]
    groups = []
    for rest in itertools.product(*(range(sizes[i]) for i in others)):
        base = sum(c * strides[i] for c, i in zip(rest, others))
        members = [device_ids[base + sum(c * strides[i] for c, i in zip(coords, used))]
                   for coords in itertools.product(*(range(sizes[i]) for i in used))]
        if axis_index_groups is None:
            groups.append(members)
        else:
            groups.extend([members[k] for k in sub] for sub in axis_index_groups)
    return groups


# --- the whole movement ----------------------------------------------------------------------------

def _transfer(src: int, src_block: int, dst: int, dst_block: int, reduce: bool) -> dict:
    return {"src": src, "src_block": src_block, "dst": dst, "dst_block": dst_block, "reduce": reduce}


def transfers(kind: str, groups: Sequence[Sequence[int]], perm: Sequence[tuple[int, int]] = ()) -> list[dict]:
    """The whole movement of one call: which block of which device lands in which block of which.

    `perm` (permute only) holds (source, target) positions within each group.
    """
    out = []
    for g in groups:
        n = len(g)
        if kind == "all-reduce":
            out += [_transfer(s, 0, d, 0, True) for d in g for s in g]
        elif kind == "all-gather":
            out += [_transfer(g[k], 0, d, k, False) for d in g for k in range(n)]
        elif kind == "reduce-scatter":
            out += [_transfer(s, k, g[k], 0, True) for k in range(n) for s in g]
        elif kind == "all-to-all":
            out += [_transfer(g[j], k, g[k], j, False) for k in range(n) for j in range(n)]
        elif kind == "permute":
            out += [_transfer(g[s], 0, g[d], 0, False) for s, d in perm if s < n and d < n]
    return out


# --- the ring, one step at a time ------------------------------------------------------------------

def _reduce_scatter_ring(g: Sequence[int]) -> list[list[dict]]:
    """n-1 steps after which position p holds block p summed over the whole group.

    Step s: position p sends block p-s-1 to p+1, which combines it into its own copy; block c
    starts at c+1 and travels once around the ring, picking up every contribution on the way.
    """
    n = len(g)
    return [[_transfer(g[p], (p - s - 1) % n, g[(p + 1) % n], (p - s - 1) % n, True) for p in range(n)]
            for s in range(n - 1)]


def _all_gather_ring(g: Sequence[int]) -> list[list[dict]]:
    """n-1 steps from "position p holds block p" to every position holding every block.

    Step s: position p forwards block p-s (its own at first, then the one it just received).
    """
    n = len(g)
    return [[_transfer(g[p], (p - s) % n, g[(p + 1) % n], (p - s) % n, False) for p in range(n)]
            for s in range(n - 1)]


def _all_to_all_pairwise(g: Sequence[int]) -> list[list[dict]]:
    """Pairwise exchange: at each step devices swap in pairs, p sends its block q to q and gets
    q's block p back into the slot it just emptied (so the steps also work in place).

    Partners are p XOR s for s = 1..n-1 when n is a power of two (n-1 steps, nobody idle), else
    (s - p) mod n for s = 0..n-1 (n steps, one device idle in each when n is odd).
    """
    n = len(g)
    if n & (n - 1) == 0:
        partners = [[p ^ s for p in range(n)] for s in range(1, n)]
    else:
        partners = [[(s - p) % n for p in range(n)] for s in range(n)]
    rounds = [[_transfer(g[p], q, g[q], p, False) for p, q in enumerate(row) if q != p] for row in partners]
    return [r for r in rounds if r]


def steps(kind: str, groups: Sequence[Sequence[int]], perm: Sequence[tuple[int, int]] = ()) -> list[dict]:
    """The movement as the lecture draws it, one step at a time; every group steps together."""
    def merged(per_group: list[list[list[dict]]], label: str) -> list[dict]:
        count = max((len(s) for s in per_group), default=0)
        return [{"label": f"{label} step {i + 1} of {count}",
                 "transfers": [t for s in per_group if i < len(s) for t in s[i]]} for i in range(count)]

    if kind == "all-reduce":
        return (merged([_reduce_scatter_ring(g) for g in groups], "reduce-scatter")
                + merged([_all_gather_ring(g) for g in groups], "all-gather"))
    if kind == "all-gather":
        return merged([_all_gather_ring(g) for g in groups], "all-gather")
    if kind == "reduce-scatter":
        return merged([_reduce_scatter_ring(g) for g in groups], "reduce-scatter")
    if kind == "all-to-all":
        return merged([_all_to_all_pairwise(g) for g in groups], "all-to-all")
    if kind == "permute":
        moves = transfers("permute", groups, perm)
        return [{"label": "permute step 1 of 1", "transfers": moves}] if moves else []
    return []


def movement(kind: str, groups: Sequence[Sequence[int]], perm: Sequence[tuple[int, int]] = (),
             drawn: Sequence[int] | None = None) -> dict:
    """A card's `movement`: kind, blocks per device, the whole movement and the steps.

    Only transfers between `drawn` devices are kept (all when None), and steps only for groups
    drawn whole: a ring half off the picture teaches nothing.
    """
    seen = set(drawn) if drawn is not None else None
    shown_groups = [g for g in groups if seen is None or all(d in seen for d in g)]
    moves = [t for t in transfers(kind, groups, perm) if seen is None or (t["src"] in seen and t["dst"] in seen)]
    size = max((len(g) for g in groups), default=1)
    blocks = 1 if kind in ("all-reduce", "permute", "none") else size
    return {"kind": kind, "blocks": blocks, "transfers": moves, "steps": steps(kind, shown_groups, perm)}


# --- bytes ------------------------------------------------------------------------------------------

def estimated_bytes(kind: str, groups: Sequence[Sequence[int]], device_ids: Sequence[int], in_bytes: int,
                    out_bytes: int, perm: Sequence[tuple[int, int]] = ()) -> dict:
    """Bytes each device sends and receives in one call, by the ring algorithm, in `device_ids` order.

    all-reduce 2(n-1)/n of the input, all-gather (n-1)/n of the output, reduce-scatter and
    all-to-all (n-1)/n of the input, permute the whole input per send to another device.
    """
    sent = {d: 0 for d in device_ids}
    received = {d: 0 for d in device_ids}
    for g in groups:
        n = len(g)
        if kind == "permute":
            for s, d in perm:
                if s < n and d < n and s != d:
                    sent[g[s]] = sent.get(g[s], 0) + in_bytes
                    received[g[d]] = received.get(g[d], 0) + in_bytes
            continue
        share = {"all-reduce": 2 * (n - 1) * in_bytes, "all-gather": (n - 1) * out_bytes,
                 "reduce-scatter": (n - 1) * in_bytes, "all-to-all": (n - 1) * in_bytes}.get(kind, 0)
        for d in g:
            sent[d] = received[d] = round(share / n)
    return {"sent": [sent[d] for d in device_ids], "received": [received[d] for d in device_ids], "estimate": True}
