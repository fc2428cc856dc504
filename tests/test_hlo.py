"""cell/hlo.py: collectives read from compiled program text, in every spelling XLA prints.

The synthetic lines follow XLA's printed HLO; the last tests read the text JAX really compiles for
a shard_map program over a 2x4 mesh.
"""
from __future__ import annotations

import numpy as np
import pytest

from jaxpar_magic.cell.hlo import collectives, parse_replica_groups

ADD = "to_apply=%add"


def one(text: str, ids=None):
    found = collectives(text, ids)
    assert len(found) == 1, found
    return found[0]


# --- replica groups: three spellings -------------------------------------------------------------

def test_explicit_replica_groups():
    line = (f"  %ar = f32[4]{{0}} all-reduce(f32[4]{{0}} %p), channel_id=1, "
            f"replica_groups={{{{0,1}},{{2,3}}}}, use_global_device_ids=true, {ADD}")
    assert parse_replica_groups(line) == [[0, 1], [2, 3]]
    c = one(line)
    assert (c.op, c.shape, c.bytes, c.groups, c.pairs) == ("all-reduce", "f32[4]", 16, [[0, 1], [2, 3]], [])


def test_iota_replica_groups():
    line = f"  %ar = f32[4]{{0}} all-reduce(%p), channel_id=1, replica_groups=[2,4]<=[8], {ADD}"
    assert parse_replica_groups(line) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_transposed_iota_replica_groups():
    line = f"  %ar = f32[4]{{0}} all-reduce(%p), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), {ADD}"
    expected = np.arange(8).reshape(2, 4).T.reshape(4, 2).tolist()
    assert expected == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert parse_replica_groups(line) == expected


def test_three_dimensional_transposed_iota():
    line = f"  %ag = f32[8]{{0}} all-gather(%p), replica_groups=[4,2]<=[2,2,2]T(2,1,0), dimensions={{0}}"
    assert parse_replica_groups(line) == np.arange(8).reshape(2, 2, 2).transpose(2, 1, 0).reshape(4, 2).tolist()


def test_no_replica_groups_means_all_devices():
    line = f"  %ar = f32[4]{{0}} all-reduce(%p), channel_id=1, replica_groups={{}}, {ADD}"
    assert parse_replica_groups(line) == []
    assert one(line).groups == []


def test_groups_and_pairs_are_mapped_to_device_ids():
    ids = [7, 6, 5, 4, 3, 2, 1, 0]
    text = (
        f"  %ar = f32[2]{{0}} all-reduce(%p), replica_groups=[2,4]<=[8], {ADD}\n"
        "  %cp = f32[2]{0} collective-permute(%p), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}\n"
    )
    ar, cp = collectives(text, ids)
    assert ar.groups == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert cp.pairs == [(7, 6), (6, 5), (5, 4), (4, 7)]


# --- collective-permute pairs ---------------------------------------------------------------------

def test_source_target_pairs():
    line = "  %cp = f32[3]{0} collective-permute(f32[3]{0} %p), channel_id=2, source_target_pairs={{0,1},{1,2},{2,0}}"
    c = one(line)
    assert c.op == "collective-permute"
    assert c.pairs == [(0, 1), (1, 2), (2, 0)]
    assert c.groups == []
    assert c.bytes == 12


# --- async starts ----------------------------------------------------------------------------------

def test_async_all_reduce_start_counts_once_with_its_result():
    text = (
        f"  %ars = f32[4]{{0}} all-reduce-start(f32[4]{{0}} %p), channel_id=1, replica_groups=[2,4]<=[8], {ADD}\n"
        "  %ard = f32[4]{0} all-reduce-done(f32[4]{0} %ars)\n"
    )
    c = one(text)
    assert (c.op, c.shape, c.bytes, c.groups) == ("all-reduce", "f32[4]", 16, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_async_all_gather_start_reports_the_gathered_result():
    text = (
        "  %ags = (f32[2]{0}, f32[16]{0}) all-gather-start(f32[2]{0} %p), channel_id=2, "
        "replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true\n"
        "  %agd = f32[16]{0} all-gather-done((f32[2]{0}, f32[16]{0}) %ags)\n"
    )
    c = one(text)
    assert (c.op, c.shape, c.bytes) == ("all-gather", "f32[16]", 64)
    assert c.groups == [list(range(8))]


def test_async_collective_permute_start_without_context_buffers():
    text = (
        "  %cps = (f32[2,16]{1,0}, f32[2,16]{1,0}) collective-permute-start(f32[2,16]{1,0} %p), channel_id=1, "
        "source_target_pairs={{0,1},{1,0}}\n"
        "  %cpd = f32[2,16]{1,0} collective-permute-done((f32[2,16]{1,0}, f32[2,16]{1,0}) %cps)\n"
    )
    c = one(text)
    assert (c.op, c.shape, c.bytes, c.pairs) == ("collective-permute", "f32[2,16]", 128, [(0, 1), (1, 0)])


def test_async_collective_permute_start_with_u32_context_buffers():
    # XLA's GPU pipeline prints the start as (operand, result, u32[], u32[]): the two scalars are
    # synchronisation contexts, not data the permute moves.
    text = (
        "  %cps = (f32[128,32]{0,1}, f32[128,32]{0,1}, u32[], u32[]) collective-permute-start(f32[128,32]{0,1} %in), "
        "source_target_pairs={{0,1},{1,2},{2,3}}\n"
        "  %cpd = f32[128,32]{0,1} collective-permute-done((f32[128,32]{0,1}, f32[128,32]{0,1}, u32[], u32[]) %cps)\n"
    )
    c = one(text)
    assert c.op == "collective-permute"
    assert c.shape == "f32[128,32]"
    assert c.bytes == 128 * 32 * 4
    assert c.pairs == [(0, 1), (1, 2), (2, 3)]


def test_reduce_scatter_and_all_to_all_are_collectives():
    text = (
        f"  %rs = bf16[2,8]{{1,0}} reduce-scatter(bf16[8,8]{{1,0}} %p), replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, {ADD}\n"
        "  %a2a = s32[4,4]{1,0} all-to-all(s32[4,4]{1,0} %q), replica_groups={{0,1,2,3}}, dimensions={0}\n"
        "  %add = f32[4]{0} add(f32[4]{0} %x, f32[4]{0} %y)\n"
    )
    rs, a2a = collectives(text)
    assert (rs.op, rs.shape, rs.bytes) == ("reduce-scatter", "bf16[2,8]", 32)
    assert (a2a.op, a2a.bytes) == ("all-to-all", 64)


# --- byte sizes from dtypes -----------------------------------------------------------------------

@pytest.mark.parametrize(
    "result_type, expected",
    [
        ("f32[]", 4),
        ("bf16[4,4]", 32),
        ("f16[3]", 6),
        ("pred[3]", 3),
        ("s8[10]", 10),
        ("u8[2,5]", 10),
        ("s64[2]", 16),
        ("f64[2,2]", 32),
        ("c64[2]", 16),
        ("c128[1]", 16),
    ],
)
def test_bytes_follow_the_dtype(result_type, expected):
    line = f"  %ar = {result_type}{{0}} all-reduce(%p), replica_groups={{}}, {ADD}"
    c = one(line)
    assert c.shape == result_type
    assert c.bytes == expected


def test_tuple_results_add_up():
    line = f"  %ar = (f32[4]{{0}}, bf16[2]{{0}}) all-reduce(%p, %q), replica_groups={{}}, {ADD}"
    c = one(line)
    assert c.bytes == 16 + 4
    assert c.shape == "f32[4], bf16[2]"


def test_text_without_collectives_gives_nothing():
    assert collectives("HloModule m\n  %a = f32[4]{0} add(%x, %y)\n  ROOT %t = (f32[4]) tuple(%a)\n") == []


# --- real compiled text -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mesh_program():
    import jax
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P

    # Devices in reverse order: replica-group positions differ from device ids, which catches a
    # parser that forgets to map positions to ids.
    mesh = Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("x", "y"))

    def per_device(a):
        s = lax.psum(a, "y")
        g = lax.all_gather(a, "x")
        p = lax.ppermute(a, "y", perm=[(j, (j + 1) % 4) for j in range(4)])
        return s, g, p

    spec = P("x", "y")
    fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=(spec, spec, spec), check_vma=False))
    a = jax.numpy.arange(32.0).reshape(4, 8)
    text = fn.lower(a).compile().as_text()
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    return text, ids


def _by_op(found):
    ops = {}
    for c in found:
        ops.setdefault(c.op, []).append(c)
    return ops


def test_real_program_groups_are_the_mesh_rows_and_columns(mesh_program):
    text, ids = mesh_program
    ops = _by_op(collectives(text, ids.reshape(-1).tolist()))
    assert set(ops) == {"all-reduce", "all-gather", "collective-permute"}
    rows = sorted(sorted(r) for r in ids.tolist())  # psum over 'y': devices sharing an 'x' coordinate
    cols = sorted(sorted(c) for c in ids.T.tolist())  # all_gather over 'x': devices sharing a 'y' coordinate
    (psum,) = ops["all-reduce"]
    (gather,) = ops["all-gather"]
    assert sorted(sorted(g) for g in psum.groups) == rows
    assert sorted(sorted(g) for g in gather.groups) == cols
    assert psum.shape == "f32[2,2]" and psum.bytes == 16
    assert gather.shape == "f32[2,2,2]" and gather.bytes == 32


def test_real_program_ppermute_pairs_follow_each_row_of_the_mesh(mesh_program):
    text, ids = mesh_program
    (permute,) = _by_op(collectives(text, ids.reshape(-1).tolist()))["collective-permute"]
    expected = {(int(row[j]), int(row[(j + 1) % 4])) for row in ids for j in range(4)}
    assert set(permute.pairs) == expected
    assert len(permute.pairs) == 8
