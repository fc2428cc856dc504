"""All-reduces whose result each device only slices: the reduce-scatters a target compiler makes.

XLA:TPU and XLA:GPU run a pass (ReduceScatterCreator) that turns `all-reduce` followed by a
`dynamic-slice` at the device's own offset into one `reduce-scatter`: FSDP's gradient, for one,
where each device keeps only its shard of the summed gradient. XLA:CPU has no such pass, so its
program sums the whole array on every device and then slices it. XLA:TPU prints what it made as
the same all-reduce and dynamic-slice, wrapped in a fusion named `%all-reduce-scatter`.

`reduce_scatters(text, found)` reads either program: an all-reduce (or one element of a combined,
tuple-shaped all-reduce) whose every use ends, through converts, bitcasts, copies, tuple elements
and fusion parameters, in a dynamic-slice that keeps 1/n of it (n devices in its group) becomes a
reduce-scatter of that element. Plain Python over the program text.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from .hlo import Collective, parse_replica_groups
from .hlo_text import ARRAY, Instruction, array_bytes, instructions, ints

_PASS_THROUGH = ("convert", "bitcast", "copy", "reshape", "bitcast-convert")
_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")


def _elements(type_text: str) -> list[int]:
    """Element count of each array in a printed type."""
    return [math.prod(ints(dims) or [1]) for _, dims in ARRAY.findall(type_text)]


class _Graph:
    def __init__(self, text: str, read: list | None = None):
        self.instructions = read if read is not None else instructions(text)
        self.by_name = {i.name: i for i in self.instructions}
        self.users: dict[str, list[Instruction]] = {}
        self.params: dict[tuple[str, int], Instruction] = {}
        self.callers: dict[str, list[Instruction]] = {}
        for ins in self.instructions:
            if ins.callee:
                self.callers.setdefault(ins.callee, []).append(ins)
            for operand in ins.operands:
                self.users.setdefault(operand, []).append(ins)
            if ins.op == "parameter":
                number = re.search(r"parameter\((\d+)\)", ins.line)
                if number:
                    self.params[(ins.computation, int(number.group(1)))] = ins

    def only_sliced(self, value: str, elements: int, n: int, depth: int = 0) -> str | None:
        """The array each device keeps (`bf16[512,1024]`) when every use of `value` (an array of
        `elements`) ends in a dynamic-slice keeping 1/n of it; None otherwise."""
        uses = self.users.get(value, [])
        source = self.by_name.get(value)
        if depth > 16:
            return None
        if source is not None and source.root:  # a fusion's result: follow the fusion's own uses
            callers = self.callers.get(source.computation, [])
            if len(callers) != 1 or source.type.lstrip().startswith("("):
                return None
            return self.only_sliced(callers[0].name, elements, n, depth + 1)
        kept = None
        for use in uses:
            if use.op == "dynamic-slice" and use.operands and use.operands[0] == value:
                found = ARRAY.findall(use.type)
                if not found or math.prod(ints(found[0][1]) or [1]) * n != elements:
                    return None
                here = f"{found[0][0]}[{found[0][1]}]"
            elif use.op in _PASS_THROUGH:
                here = self.only_sliced(use.name, elements, n, depth + 1)
            elif use.op == "fusion" and use.callee:
                positions = [k for k, o in enumerate(use.operands) if o == value]
                params = [self.params.get((use.callee, k)) for k in positions]
                found = [self.only_sliced(p.name, elements, n, depth + 1) if p is not None else None for p in params]
                here = found[0] if found and all(found) else None
            else:
                here = None
            if here is None:
                return None
            kept = kept or here
        return kept

    def sliced(self, ins: Instruction, n: int) -> list[str | None]:
        """Per element of all-reduce `ins`: the slice each device keeps, or None (it uses more)."""
        counts = _elements(ins.type)
        if not ins.type.lstrip().startswith("("):
            return [self.only_sliced(ins.name, counts[0], n)] if counts else []
        flags: list[str | None] = [None] * len(counts)
        by_index: dict[int, list[str]] = {}
        for use in self.users.get(ins.name, []):
            index = re.search(r"index=(\d+)", use.line) if use.op == "get-tuple-element" else None
            if index is None:
                return flags  # the tuple itself is used: leave it an all-reduce
            by_index.setdefault(int(index.group(1)), []).append(use.name)
        for i, names in by_index.items():
            if i < len(counts):
                kept = [self.only_sliced(name, counts[i], n) for name in names]
                flags[i] = kept[0] if all(kept) else None
        return flags


def _group_size(line: str, partitions: int) -> int:
    groups = parse_replica_groups(line)
    return len(groups[0]) if groups and groups[0] else partitions


def reduce_scatters(text: str, found: list[Collective], read: list | None = None,
                    own_only: bool = False) -> list[Collective]:
    """`found` (hlo.collectives of `text`) with each sliced all-reduce, or the sliced elements of a
    combined one, turned into the reduce-scatter the target's compiler makes; the unsliced rest of a
    combined one rides along in the same row (`whole_bytes`): one instruction, one row. Each turned
    one has `sliced_from="all-reduce"`. `read`: hlo_text.instructions(text), when already read. `own_only` (XLA:TPU's program): only the ones
    the compiler made itself, inside its `all-reduce-scatter` fusions; an all-reduce XLA:TPU left
    whole stays one, whatever slices it."""
    candidates = [c for c in found if c.op == "all-reduce" and c.name]
    if not candidates:
        return found
    graph = _Graph(text, read)
    own = {c.name for c in candidates if c.name in graph.by_name
           and graph.by_name[c.name].computation.startswith("all-reduce-scatter")}
    partitions = _PARTITIONS.search(text)
    total = int(partitions.group(1)) if partitions else 1
    out = []
    for c in found:
        ins = graph.by_name.get(c.name) if c.op == "all-reduce" and c.name and (not own_only or c.name in own) else None
        n = _group_size(ins.line, total) if ins is not None else 1
        flags = graph.sliced(ins, n) if ins is not None and n > 1 else []
        if not any(flags):
            out.append(c)
            continue
        parts = ARRAY.findall(c.shape)  # the program's own dtypes, one per element
        if len(parts) != len(flags):
            out.append(c)
            continue
        scattered = [(d, s, f) for (d, s), f in zip(parts, flags) if f]
        kept = [(d, s) for (d, s), f in zip(parts, flags) if not f]
        whole = sum(array_bytes(d, s) for d, s, _ in scattered)
        # the slice's dimensions, in the program's dtype (XLA:CPU may slice its f32 copy)
        shape = ", ".join(f"{d}[{ARRAY.findall(f)[0][1]}]" for d, _, f in scattered)
        # One instruction stays one row (its latency paid once): the elements no device slices ride along,
        # summed whole (costed as the reduce-scatter of everything, then the all-gather of those).
        rest = sum(array_bytes(d, s) for d, s in kept)
        summed = ", ".join(f"{d}[{s}]" for d, s in kept)
        out.append(replace(c, op="reduce-scatter", shape=", ".join(p for p in (shape, summed) if p),
                           bytes=whole // n + rest, operand_bytes=whole + rest, sliced_from="all-reduce",
                           whole_bytes=rest, whole_shape=summed))
    return out
