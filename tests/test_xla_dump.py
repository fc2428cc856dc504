"""cell/xla_dump.py: XLA's buffer-assignment and live-range dumps, read from a real compile.

These files are XLA's debug output, not an API. If a JAX or XLA upgrade changes them, these tests
fail first and say which file and line no longer read as expected (DumpFormatError), instead of a
plan silently listing the wrong buffers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxpar_magic.cell.xla_dump import (BUFFER_FILE, LIVE_RANGE_FILE, DumpFormatError, compile_with_dump,
                                        parse_buffer_assignment, parse_live_range, read_dump)
from jaxpar_magic.engines.shard import make_mesh, plan


@pytest.fixture(scope="module")
def compiled():
    mesh = make_mesh("data=4 model=2")
    x = plan((256, 128), "float32", mesh, ("data", None))
    w = plan((128, 512), "bfloat16", mesh, (None, "model"))

    def step(x, w):
        h = jnp.tanh(x @ w.astype(jnp.float32))
        return h.sum(axis=0), (h * 2).astype(jnp.bfloat16)

    lowered = jax.jit(step).lower(x, w)
    return compile_with_dump(lowered)


def test_allocations_add_up_to_what_memory_analysis_reports(compiled):
    program, dump = compiled
    memory = program.memory_analysis()
    sizes = {}
    for allocation in dump.allocations.values():
        sizes[allocation.kind] = sizes.get(allocation.kind, 0) + allocation.size
    assert sizes["parameter"] == memory.argument_size_in_bytes
    assert sizes["output"] == memory.output_size_in_bytes
    assert sizes.get("temp", 0) == memory.temp_size_in_bytes
    parameters = sorted(a.parameter for a in dump.allocations.values() if a.kind == "parameter")
    assert parameters == [0, 1]


def test_every_counted_value_has_a_live_range_within_the_schedule(compiled):
    _, dump = compiled
    counted = [v for v in dump.values if dump.allocations[v.allocation].counted]
    assert counted and all(v.key in dump.ranges for v in counted)
    assert all(0 <= first <= last <= dump.steps for first, last in dump.ranges.values())
    assert len(dump.sequence) >= 2 and dump.steps >= len(dump.sequence) - 1
    for v in counted:  # each value fits inside its allocation
        assert 0 <= v.offset and v.offset + v.size <= dump.allocations[v.allocation].size


def test_a_changed_format_fails_loudly_naming_the_file_and_line(tmp_path):
    good = "BufferAssignment:\nallocation 0: size 16, parameter 0, shape |f32[4]| at ShapeIndex {}:\n" \
           " value: <0 p @0> (size=16,offset=0): f32[4]{0}\n"
    allocations, values = parse_buffer_assignment(good)
    assert allocations[0].kind == "parameter" and values[0].key == "p{}"
    with pytest.raises(DumpFormatError, match="first line"):
        parse_buffer_assignment("Buffers:\n" + good.split("\n", 1)[1])
    with pytest.raises(DumpFormatError, match=r"line 3: unreadable"):
        parse_buffer_assignment(good.replace("(size=16,offset=0)", "[size 16 at 0]"))
    with pytest.raises(DumpFormatError, match="line 2: a parameter allocation without its number"):
        parse_buffer_assignment(good.replace(", shape |f32[4]| at ShapeIndex {}", ""))
    ranges = "HloLiveRange (max 1):\n  InstructionSequence:\n    0:p\n  BufferLiveRange:\n    p{}:0-1\n"
    assert parse_live_range(ranges) == (["p"], {"p{}": (0, 1)}, 1)
    with pytest.raises(DumpFormatError, match="HloLiveRange"):
        parse_live_range(ranges.replace("HloLiveRange (max 1):", "LiveRanges:"))
    with pytest.raises(DumpFormatError, match=r"line 5: expected 'name\{index\}:first-last'"):
        parse_live_range(ranges.replace("p{}:0-1", "p{} from 0 to 1"))
    with pytest.raises(DumpFormatError, match=f"no \\*{BUFFER_FILE}"):
        read_dump(str(tmp_path))
    (tmp_path / f"m.{BUFFER_FILE}").write_text(good)
    with pytest.raises(DumpFormatError, match=LIVE_RANGE_FILE):
        read_dump(str(tmp_path))
