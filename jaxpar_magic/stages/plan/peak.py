"""What fills a device's memory at the peak, and its live bytes over the program's schedule.

From XLA's own buffer assignment and live ranges for the compile (cell/xla_dump.py) and the
compiled program's text (its instructions, their JAX op names and source frames):

- each value in the allocations compiled.memory_analysis() counts as arguments, outputs and
  temporaries, in the device's main memory (HBM; XLA:TPU also places small temporaries in on-chip
  VMEM, which memory_analysis() does not count and a plan reports apart, as `elsewhere`) becomes a buffer:
  values at the same place in the same allocation whose live ranges touch are one buffer (XLA's
  in-place updates and aliases), so no byte is counted twice;
- the timeline is the bytes of the buffers live at each step of the schedule, and the peak is its
  busiest step;
- every buffer live there is one row: its size, dtype and shape, what it is (an argument with its
  input's name and leaf path, an output with its name, or a temporary with the operation that makes
  it) and the user's line that made it. The smallest are grouped as "other", and what the plan reports
  beyond the live buffers (outputs written later, free space in the temporary arena) is one last row,
  so the rows add up to the reported peak. Where the buffers live at the busiest step add up to more
  than the reported figure, the rows are not stretched to it: `disagreement` says by how much.

Plain Python; no JAX.
"""
from __future__ import annotations

import linecache
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ...cell.hlo_text import ARRAY, Instruction, type_bytes
from ...cell.loops import BODY
from ...cell.xla_dump import BufferDump
from .buffer_roles import group, is_backward, loop_stack, role_of, stack_role
from .mesh_collectives import is_user_file, origin_of

MAX_ROWS = 10  # buffers named one by one; the rest are "other"
MIN_SHARE = 0.005  # ... and each of those at least this share of the peak
TIMELINE_POINTS = 120  # the timeline's resolution in the view (each point the busiest step of its stretch)
_ARG_PATH = re.compile(r"^args\[(\d+)\]\[(\d+)\]$")
# What moves a value without computing it: the value keeps the name of what computed it.
_MOVES = ("copy", "copy-start", "copy-done", "bitcast", "get-tuple-element", "async-start", "async-done",
          "async-update")


@dataclass(frozen=True)
class PeakBuffer:
    bytes: int
    dtype: str
    shape: tuple[int, ...]
    kind: str  # "argument" | "output" | "temporary"
    name: str | None  # an argument's or output's label (`params['w1']`)
    op: str | None  # a temporary's operation: the JAX op (`dot_general`), else XLA's (`fusion`)
    instruction: str  # XLA's name for the value (`fusion.4`)
    line: int | None = None  # the cell's line
    source: str | None = None
    origin: dict | None = None  # the line inside a function the cell calls (as collectives carry it)
    space: str | None = None  # the memory space, where the program uses more than one ("vmem" on XLA:TPU)
    role: str | None = None  # what a temporary is for (buffer_roles.role_of): "all-gather of params['w1']", ...
    count: int = 1  # buffers in this row (more than one: grouped by what they are and their line)
    members: tuple = field(default=(), repr=False, compare=False)  # a group's buffers
    index: str = field(default="{}", repr=False, compare=False)  # which element of the instruction's (tuple) result

    def state(self) -> dict:
        return {"bytes": self.bytes, "dtype": self.dtype, "shape": list(self.shape), "kind": self.kind,
                "name": self.name, "op": self.op, "instruction": self.instruction, "line": self.line,
                "source": self.source, "origin": self.origin, "space": self.space, "role": self.role,
                "count": self.count}


@dataclass
class MemoryPeak:
    """One device's memory at the peak (every device runs the same program on its own shards)."""

    reported: int  # the peak the plan reports; the rows below add up to it
    live: int  # bytes of the buffers live at the busiest step
    step: int  # that step
    steps: int  # steps in the schedule
    buffers: list[PeakBuffer]  # the largest live buffers, largest first
    other_bytes: int = 0  # the smaller live buffers, grouped
    other_count: int = 0
    reserved_bytes: int = 0  # reported - live: what the compiler holds beyond the live buffers
    reserve: list = field(default_factory=list)  # [(bytes, what)]: that, in parts (they add up to reserved_bytes)
    at: dict | None = None  # the operation the peak step runs: {"op", "instruction", "line", "source", "origin"}
    timeline: list[dict] = field(default_factory=list)  # [{"step", "bytes", "at"}]: "at" indexes `places`
    places: list[dict] = field(default_factory=list)  # [{"op", "instruction", "line", "source", "origin"}], once each
    elsewhere: dict = field(default_factory=dict)  # other memory spaces (XLA:TPU's "vmem"): their busiest live bytes
    disagreement: str | None = None  # where the live buffers exceed the reported figure: by how much, and why
    upcast_bytes: int = 0  # live at the peak: XLA:CPU's f32 copies of arrays the program holds in bf16/f16
    upcast_count: int = 0
    live_rows: list = field(default_factory=list, repr=False)  # every buffer live at the peak, ungrouped (advice.py)
    start_bytes: int = 0  # the arguments live when the program starts (before its first step: no step's rise)

    @property
    def largest(self) -> PeakBuffer | None:
        return self.buffers[0] if self.buffers else None

    def state(self) -> dict:
        return {"reported": self.reported, "live": self.live, "step": self.step, "steps": self.steps,
                "buffers": [b.state() for b in self.buffers], "other_bytes": self.other_bytes,
                "other_count": self.other_count, "reserved_bytes": self.reserved_bytes,
                "reserve": [{"bytes": n, "note": note} for n, note in self.reserve], "at": self.at,
                "timeline": self.timeline, "places": self.places, "elsewhere": self.elsewhere,
                "disagreement": self.disagreement, "upcast_bytes": self.upcast_bytes,
                "upcast_count": self.upcast_count, "start_bytes": self.start_bytes}


@dataclass
class _Buffer:
    allocation: int
    size: int
    first: int
    last: int
    values: list  # (first step, Value)


MAIN = 0  # the device's main memory (HBM): XLA's memory space 0, the one memory_analysis() counts


def _buffers(dump: BufferDump, color: int = MAIN) -> list[_Buffer]:
    """Values in one memory space grouped into buffers: same allocation, offset and size, live ranges touching."""
    places: dict[tuple, list] = {}
    for v in dump.values:
        allocation = dump.allocations.get(v.allocation)
        span = dump.ranges.get(v.key)
        if allocation is None or not allocation.counted or allocation.color != color or span is None or v.size <= 0:
            continue
        places.setdefault((v.allocation, v.offset, v.size), []).append((span, v))
    found = []
    for (allocation, _, size), entries in places.items():
        entries.sort(key=lambda e: e[0])
        current = None
        for (first, last), value in entries:
            if current is not None and first <= current.last:
                current.last = max(current.last, last)
                current.values.append((first, value))
            else:
                current = _Buffer(allocation, size, first, last, [(first, value)])
                found.append(current)
    return found


def _timeline(buffers: list[_Buffer], steps: int) -> list[int]:
    delta = [0] * (steps + 2)
    for b in buffers:
        delta[max(0, b.first)] += b.size
        delta[min(steps, b.last) + 1] -= b.size
    live, total = [], 0
    for d in delta[:steps + 1]:
        total += d
        live.append(total)
    return live


def _array(type_text: str) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of an array type; ("tuple", ()) for a tuple (its buffer holds pointers, not its
    elements' data, so it takes none of their dtypes or shapes)."""
    found = ARRAY.findall(type_text)
    if not found or type_text.lstrip().startswith("("):
        return "tuple", ()
    dtype, dims = found[0]
    return dtype, tuple(int(d) for d in dims.split(",") if d)


class _Sources:
    """An instruction's JAX op and the user's line, from the compiled program's metadata. A fusion
    without metadata of its own takes its fused computation's root's, else its largest operation's
    that has some; one with none at all (XLA:CPU's converts to f32) the value it converts or moves."""

    def __init__(self, program: list[Instruction], filename: str | None, line_text, parameters=None):
        self.parameters = parameters or {}  # parameter instruction -> its argument's label
        self.by_name = {i.name: i for i in program}
        self.roots = {i.computation: i for i in program if i.root}
        self.fused: dict[str, list[Instruction]] = {}  # computation -> its instructions with metadata
        self.ops: dict[str, set] = {}  # computation -> the operations in it
        for i in program:
            self.ops.setdefault(i.computation, set()).add(i.op)
            if i.key is not None:
                self.fused.setdefault(i.computation, []).append(i)
        self.has_backward = any(is_backward(i.op_name) for i in program)  # a grad: forward values are saved for it
        self.filename = filename
        self.line_text = line_text
        self.program = None  # cell/loops.Program of `program`, made when a loop's trips are asked for
        self._body_lines: dict[str, dict | None] = {}

    def keyed(self, name: str) -> Instruction | None:
        ins = self.by_name.get(name)
        for _ in range(8):
            if ins is None or ins.key is not None:
                return ins
            called = ins.callee and self.roots.get(ins.callee)
            if called and called.key is not None:
                return called
            inside = self.fused.get(ins.callee, []) if ins.callee else []
            if inside:
                return max(inside, key=lambda i: type_bytes(i.type))
            if ins.op in ("parameter", "while", "call", "conditional") or not ins.operands:
                return None
            ins = self.by_name.get(ins.operands[0])  # a bare convert or copy: what it converts
        return None

    def body_line(self, loop: str, outside: dict) -> dict | None:
        """The line most of a loop's body comes from (the scan's body function), other than `outside`
        (the loop's own line); None where its body names none. XLA may sink an operation from after
        the loop into its body, so the first line found is not always the body's."""
        if loop not in self._body_lines:
            found = BODY.search(self.by_name[loop].line) if loop in self.by_name else None
            places: dict[tuple, list] = {}
            for ins in self.fused.get(found.group(1), []) if found else []:
                place = self.describe(ins.name)
                key = (place["line"], repr(place["origin"]))
                if place["line"] is not None and key != (outside["line"], repr(outside["origin"])):
                    places.setdefault(key, []).append(place)
            self._body_lines[loop] = max(places.values(), key=len)[0] if places else None
        return self._body_lines[loop]

    def producer(self, name: str) -> str:
        """The instruction that computed a value, through the copies, async moves and tuple
        elements XLA adds around it (XLA:TPU moves buffers between memory spaces)."""
        seen = 0
        ins = self.by_name.get(name)
        while ins is not None and ins.op in _MOVES and ins.operands and seen < 16:
            ins = self.by_name.get(ins.operands[0]) or ins
            seen += 1
        return ins.name if ins is not None else name

    def describe(self, name: str) -> dict:
        own = self.by_name.get(name)
        keyed = self.keyed(name)
        op = short_op(keyed.op_name) if keyed is not None else None
        if own is not None and own.op == "parameter":
            op = self.parameters.get(name, "parameter")
        elif keyed is not None and keyed.op == "parameter":  # a copy or conversion of an argument: its label
            op = self.parameters.get(keyed.name, "parameter")
        if op is None and own is not None:
            op = own.op
        line, source, origin = None, None, None
        chain = keyed.frames if keyed is not None else ()
        if self.filename:
            line = next((n for f, n, _ in chain if f == self.filename), None)
        inner = next((f for f in chain if f[0] and is_user_file(f[0])), None)
        if inner is not None and inner[0] != self.filename:
            origin = origin_of(inner)
        if line is not None:
            text = self.line_text(line) if self.line_text is not None else linecache.getline(self.filename, line)
            source = text.strip() or None
        elif inner is not None and origin is None:
            line, source = inner[1], None
        if origin is not None and line is None and self.filename is None:
            line, source, origin = origin["line"], origin["source"], None  # a plain function: its own file's line
        return {"op": op, "instruction": name, "line": line, "source": source, "origin": origin}


def short_op(op_name: str | None) -> str | None:
    """JAX's op name without its path: `jit(step)/transpose(jvp())/dot_general` -> `dot_general`,
    `jit(f)/transpose(jvp(reduce_sum))` -> `reduce_sum`."""
    if not op_name:
        return None
    depth, last = 0, 0
    for i, ch in enumerate(op_name):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "/" and depth == 0:
            last = i + 1
    found = re.search(r"([A-Za-z_][\w.\-]*)\)*$", op_name[last:])
    return found.group(1) if found else op_name[last:] or None


def _parameter_names(program: list[Instruction], entry: str | None) -> dict[int, str]:
    names = {}
    for ins in program:
        if ins.op == "parameter" and ins.computation == entry and ins.op_name:
            number = re.search(r"parameter\((\d+)\)", ins.line)
            if number:
                names[int(number.group(1))] = ins.op_name
    return names


def argument_labels(program: list[Instruction], entry: str | None, leaf_labels=None) -> dict[str, str]:
    """Each entry parameter instruction's argument label (`params['w1']`), by the instruction's name."""
    parameters = _parameter_names(program, entry)
    by_number = {int(re.search(r"parameter\((\d+)\)", i.line).group(1)): i.name for i in program
                 if i.op == "parameter" and i.computation == entry}
    return {by_number[n]: _argument_label(parameters.get(n), leaf_labels, _Param(n)) for n in by_number}


_INDEX = re.compile(r"\bindex=(\d+)")


def _output_values(program: list[Instruction], entry: str | None) -> dict[tuple[str, str], int]:
    """(value name, shape index) -> the index of the program's output it is: the entry's ROOT tuple's
    operands, each read through the bitcasts and tuple elements that define no buffer of their own, so an
    output a multi-output fusion writes (`fusion.3{1}`, the ROOT's `get-tuple-element(fusion.3), index=1`)
    is an output too."""
    root = next((i for i in program if i.root and i.computation == entry), None)
    if root is None:
        return {}
    by_name = {i.name: i for i in program if i.computation == entry}
    if root.op != "tuple":
        elements = len(ARRAY.findall(root.type)) if root.type.lstrip().startswith("(") else 0
        found = {(root.name, "{}"): 0}
        found.update({(root.name, "{%d}" % k): k for k in range(elements)})
        return found
    found = {(root.name, "{}"): -1}  # the tuple itself: its table of pointers to the outputs
    for k, operand in enumerate(root.operands):
        name, index = operand, []
        for _ in range(8):
            found.setdefault((name, "{" + ",".join(map(str, index)) + "}"), k)
            ins = by_name.get(name)
            if ins is None or not ins.operands or ins.op not in ("bitcast", "get-tuple-element"):
                break
            if ins.op == "get-tuple-element":
                element = _INDEX.search(ins.line)
                if element is None:
                    break
                index.insert(0, int(element.group(1)))
            name = ins.operands[0]
        found.setdefault((name, "{" + ",".join(map(str, index)) + "}"), k)
    return found


def memory_peak(dump: BufferDump, program: list[Instruction], entry: str | None, reported: int, *,
                leaf_labels=None, output_labels: list[str] | None = None, filename: str | None = None,
                line_text: Callable[[int], str] | None = None, rest_note: str = "",
                shadows: dict | None = None, counted_temp: int | None = None) -> MemoryPeak:
    """The peak of one compile. `program`: hlo_text.instructions of compiled.as_text(); `entry` its
    ENTRY computation; `reported` the peak the plan reports. `leaf_labels[i][j]` names leaf j of
    input i (the engines' arguments `args[i][j]`); `output_labels[k]` output k. What the plan
    reports beyond the buffers live at the peak is the output buffers not yet written there, and
    the rest, which `rest_note` says what it is. `counted_temp`: memory_analysis()'s temporaries, to say
    why live buffers may exceed `reported`. `shadows` (cell/hlo_dtypes.upcasts): XLA:CPU's f32 values
    the program holds in a 16-bit float; those live at the peak are counted as `upcast_bytes`."""
    buffers = _buffers(dump)
    live = _timeline(buffers, dump.steps)
    elsewhere = {}
    for color, name in sorted(dump.spaces.items()):
        busiest = max(_timeline(_buffers(dump, color), dump.steps), default=0) if color != MAIN else 0
        if busiest:
            elsewhere[name] = busiest
    step = max(range(len(live)), key=live.__getitem__) if live else 0
    peak_live = live[step] if live else 0
    parameters = _parameter_names(program, entry)
    labels = argument_labels(program, entry, leaf_labels)
    sources = _Sources(program, filename, line_text, labels)
    outputs = _output_values(program, entry)
    argument_shapes: dict[tuple, list] = {}
    for name, label in labels.items():
        argument_shapes.setdefault(_array(sources.by_name[name].type), []).append(label)
    at_name = dump.sequence[step] if step < len(dump.sequence) else None
    at_keyed = sources.keyed(at_name) if at_name else None
    in_backward = is_backward(at_keyed.op_name if at_keyed is not None else None)
    rows, live_allocations, upcast = [], set(), []
    for b in buffers:
        if not b.first <= step <= b.last:
            continue
        live_allocations.add(b.allocation)
        _, value = max((e for e in b.values if e[0] <= step), key=lambda e: e[0])
        allocation = dump.allocations[b.allocation]
        dtype, shape = _array(value.type)
        producer = sources.producer(value.name)
        described = sources.describe(producer)
        low_copy = shadows.get(value.name, shadows.get(producer)) if shadows and dtype == "f32" else None
        low_copy = low_copy if isinstance(low_copy, str) else None
        if low_copy:
            upcast.append(b.size)
        if allocation.kind == "parameter":
            kind, name = "argument", _argument_label(parameters.get(allocation.parameter), leaf_labels, allocation)
            described.update(op=None, line=None, source=None, origin=None)
        elif (value.name, value.index) in outputs:
            k = outputs[value.name, value.index]
            kind = "output"
            name = ("the outputs' tuple (its pointers)" if k < 0 else
                    output_labels[k] if output_labels is not None and k < len(output_labels) else f"output {k}")
        else:
            kind, name = "temporary", None
        role = role_of(sources, producer, (dtype, shape), argument_shapes, in_backward) if kind == "temporary" else None
        stack = loop_stack(sources, value.name, value.index) if kind == "temporary" else None
        if stack is not None:  # a loop's stacked result: named by what its body writes each trip, and that line
            trips, update, loop = stack
            looped = sources.keyed(loop)
            saved = in_backward or sources.has_backward  # a forward loop's stack outlives it only for the backward pass
            role = stack_role(trips, not is_backward(looped.op_name if looped else None), saved, role)
            written = sources.describe(sources.producer(update)) if update is not None else None
            if written is None or (written["line"], written["origin"]) in ((None, None), (described["line"],
                                                                                           described["origin"])):
                written = sources.body_line(loop, described)  # a carry it passes on, or one fusion writing several
            described = written or described
        if low_copy:  # XLA:CPU widened a 16-bit value: say so, and what the value is
            of = f" of {_lower_first(role.removeprefix('copy of '))}" if role else ""
            role = f"XLA:CPU's f32 copy ({low_copy} in the program){of}"
        rows.append(PeakBuffer(b.size, dtype, shape, kind, name, described["op"], value.name, described["line"],
                               described["source"], described["origin"], role=role, index=value.index))
    rows.sort(key=lambda r: -r.bytes)
    largest = len([r for r in rows[:MAX_ROWS] if r.bytes >= MIN_SHARE * max(reported, 1)]) or 1
    named, other = group(rows, largest, reported)
    later = [a for a in dump.allocations.values() if a.kind == "output" and a.index not in live_allocations]
    written_later = min(sum(a.size for a in later), max(0, reported - peak_live))
    reserve = []
    if written_later:
        reserve.append((written_later, f"outputs written after this step ({len(later)} buffer{'s' if len(later) != 1 else ''})"))
    if reported - peak_live - written_later > 0:
        reserve.append((reported - peak_live - written_later, rest_note or "held by the compiler beyond these buffers"))
    disagreement = None
    if peak_live > reported:
        assigned = sum(a.size for a in dump.allocations.values() if a.kind == "temp" and a.color == MAIN)
        why = (f"XLA's buffer assignment holds {assigned:,} bytes of temporaries in this memory, and "
               f"memory_analysis() counts {counted_temp:,}" if counted_temp is not None and assigned > counted_temp
               else "XLA places some values in the same bytes at once (in-place updates, aliases) that its buffer "
                    "assignment lists apart")
        disagreement = (f"the buffers live at this step add up to {peak_live - reported:,} bytes more than the "
                        f"{reported:,} reported: {why}")
    peak = MemoryPeak(
        reported=reported, live=peak_live, step=step, steps=len(live), buffers=named,
        other_bytes=sum(r.bytes for r in other), other_count=len(other),
        reserved_bytes=max(0, reported - peak_live), reserve=reserve,
        at=sources.describe(at_name) if at_name else None, elsewhere=elsewhere, disagreement=disagreement,
        upcast_bytes=sum(upcast), upcast_count=len(upcast), live_rows=rows,
        start_bytes=sum(b.size for b in buffers if b.first <= 0 and dump.allocations[b.allocation].kind == "parameter"),
    )
    peak.timeline, peak.places = _sampled(live, dump.sequence, sources)
    return peak


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if not text.startswith("XLA") else text


@dataclass(frozen=True)
class _Param:
    parameter: int
    shape_index: str = "{}"


def _argument_label(op_name: str | None, leaf_labels, allocation) -> str:
    """An argument's name: the input's label and leaf path (`params['w1']`), from JAX's op name for
    the parameter (`args[0][1]` in the engines' programs, the argument's own path in a function)."""
    if op_name is None:
        return f"argument {allocation.parameter}"
    m = _ARG_PATH.match(op_name)
    if m and leaf_labels is not None:
        i, j = int(m.group(1)), int(m.group(2))
        if i < len(leaf_labels) and j < len(leaf_labels[i]):
            return leaf_labels[i][j]
    return op_name + ("" if allocation.shape_index == "{}" else allocation.shape_index)


def _sampled(live: list[int], sequence: list[str], sources: _Sources) -> tuple[list[dict], list[dict]]:
    """At most TIMELINE_POINTS points, each the busiest step of its stretch of the schedule, and the
    places (operation and line) they name, each place once: a step is `{"step", "bytes", "at"}`."""
    if not live:
        return [], []
    stretch = max(1, -(-len(live) // TIMELINE_POINTS))
    points, places, index = [], [], {}
    for start in range(0, len(live), stretch):
        step = max(range(start, min(len(live), start + stretch)), key=live.__getitem__)
        name = sequence[step] if step < len(sequence) else None
        place = sources.describe(name) if name is not None else {"op": "end of the program", "instruction": "",
                                                                   "line": None, "source": None, "origin": None}
        key = (place["op"], place["line"], place["source"], repr(place["origin"]))
        if key not in index:
            index[key] = len(places)
            places.append(place)
        points.append({"step": step, "bytes": live[step], "at": index[key]})
    return points, places
