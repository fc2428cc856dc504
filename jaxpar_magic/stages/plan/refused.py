"""The step that does not fit: a plan made from what XLA wrote before it refused the compile.

XLA:TPU refuses a program whose buffers exceed the chip's HBM (RESOURCE_EXHAUSTED: "the total memory
required for HLO temporaries (16.00G) exceeds available HBM (15.75G)"), after assigning every buffer
(cell/xla_dump.RefusedForMemory). The plan is then made from that assignment as from a compiled
program: the figures memory_analysis() would give, summed from its allocations in HBM, the peak's
buffers with their lines, the timeline, the collectives of the optimized program; no FLOPs (XLA's cost
analysis needs the executable). XLA's "G" is GiB (measured: 16.00G for 17,179,889,664 bytes).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...cell.xla_dump import BufferDump, RefusedForMemory
from .compiled_plans import CompiledPlan

_AVAILABLE = re.compile(r"exceeds available (\w+) \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
HBM = 0  # the default memory space (color 0): HBM on XLA:TPU; the others (vmem, smem) are on-chip


@dataclass(frozen=True)
class DumpMemory:
    """compiled.memory_analysis()'s figures, summed from XLA's buffer assignment in HBM."""

    argument_size_in_bytes: int
    output_size_in_bytes: int
    temp_size_in_bytes: int
    alias_size_in_bytes: int


def dump_memory(dump: BufferDump) -> DumpMemory:
    """Arguments (parameter allocations), outputs (output allocations, and parameters reused for an
    output: donated), temporaries: in HBM, as memory_analysis() counts them."""
    parts = {"parameter": 0, "output": 0, "temp": 0}
    aliased = 0
    for a in dump.allocations.values():
        if a.color != HBM or not a.counted:
            continue
        parts[a.kind] += a.size
        if a.kind == "parameter" and a.live_out:
            aliased += a.size
    return DumpMemory(parts["parameter"], parts["output"] + aliased, parts["temp"], aliased)


def refused_program(refused: RefusedForMemory) -> CompiledPlan:
    """A CompiledPlan without an executable: what XLA wrote before refusing."""
    return CompiledPlan(None, dump_memory(refused.dump), {}, refused.text, refused.dump, 0.0,
                        getattr(refused, "said_by_partitioner", ()))


def available(said: str) -> tuple[int | None, str | None]:
    """(bytes, memory) XLA said the program may use: "exceeds available HBM (15.75G)" -> (16911433728, "HBM")."""
    m = _AVAILABLE.search(said)
    if m is None:
        return None, None
    return int(float(m.group(2)) * _UNITS[m.group(3)]), m.group(1)
