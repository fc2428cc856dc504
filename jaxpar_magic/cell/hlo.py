"""Collectives read from a compiled program's text (`jitted.lower(...).compile().as_text()`).

XLA spells replica groups four ways: explicit `{{0,1},{2,3}}`, iota `[2,2]<=[4]`, transposed
iota `[2,2]<=[2,2]T(1,0)`, and over mesh axes, `mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0))
{'axis_0'}` (what jit's automatic partitioning prints); `source_target_pairs` list a
collective-permute's sends. Ids there are positions in the program's device assignment, which
callers map to device ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .hlo_text import ARRAY as _ARRAY, FRAME as _FRAME
from .hlo_text import array_bytes as _array_bytes, frames as _frames, ints as _ints
from .hlo_text import COLLECTIVE_OPS, OPERATION as _OPERATION, computation_name
from .hlo_dtypes import program_shape
from .loops import Program, calls

OPS = COLLECTIVE_OPS
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(OPS) + r")(?P<start>-start)?\("
)
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
    r"(?:,\s*device_ids=\((?P<ids>[^()]*(?:\([\d,]*\))?[^()]*)\))?"
    r"\s*\{(?P<refs>[^}]*)\}"
)
_MESH_AXIS = re.compile(r"'?([^'=,\s]+)'?\s*=\s*(\d+)")
_AXIS_REF = re.compile(r"'?([^':,\s]+)'?(?::\((\d+)\)(\d+))?")
_IOTA_IDS = re.compile(r"^\[([\d,]+)\](?:T\(([\d,]+)\))?$")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+[\w\-]+\(")


@dataclass
class Collective:
    op: str
    shape: str  # the result type as XLA prints it, layouts dropped: "f32[8,4]"
    bytes: int  # size of the result on one device
    groups: list[list[int]] = field(default_factory=list)  # device ids; [] means all devices together
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (source, target) device ids
    line: int | None = None  # line of the user's cell that issued it, when known
    operand_bytes: int | None = None  # size of its operands on one device (a reduce-scatter's input), when known
    count: int | None = 1  # times one run of the program issues it (inside loops); None: a loop of unknown length
    upcast_from: str | None = None  # the program's dtype where XLA:CPU moves it as f32 (shape and bytes are the program's)
    origin: tuple | None = None  # (file, line, function): the innermost user frame, where it is not the cell's own line
    reduction: str | None = None  # what an all-reduce or reduce-scatter combines with: "sum", "max", "min", ...
    name: str | None = None  # the instruction's name in the compiled program
    sliced_from: str | None = None  # "all-reduce": an all-reduce each device only slices (cell/scatter.py)
    frames: tuple = ()  # (file, line, function) of the Python frames that issued it, innermost first, when read
    windowed: str | None = None  # a permute of XLA:TPU's windowed einsum: what it does ("all-gather", "reduce-scatter")
    windowed_calls: int | None = None  # the permutes per step of that windowed einsum, all its instructions together
    over_dcn: bool = False  # a Megascale transfer: the cross-slice (DCN) stage of a collective; groups left empty
    backward: bool = False  # issued by the backward pass (JAX names its operations `transpose(jvp(...))`)
    operands: int = 1  # arrays the one instruction moves (XLA combines several gradients' all-reduces into one)
    whole_bytes: int = 0  # a combined all-reduce shown as the target's reduce-scatter: its elements still summed whole
    whole_shape: str = ""  # ... and their types ("f32[64]")
    computation: str | None = None  # the computation it is in
    # In a loop XLA cannot bound (count None): its calls per trip of that loop (counted as its FLOPs are),
    # and the most per run where the loop's condition bounds it (`i < 1000`).
    per_trip: int | None = None
    at_most: int | None = None
    # The compiled schedule: True for an asynchronous collective (a `-start`/`-done` pair, XLA's async
    # wrappers, XLA:TPU's async collective fusions), whose time can hide behind compute; False for one the
    # device waits for.
    overlapped: bool | None = None
    op_name: str | None = None  # JAX's name for the operation that needs it (`jit(f)/dot_general`)
    dimensions: tuple = ()  # the array dimensions it gathers, scatters or exchanges along (`dimensions={0}`)
    operand_type: str | None = None  # its (first) operand's type, as compiled ("f32[64,1024]")
    operand: str | None = None  # the instruction computing that operand


def operands_text(c) -> str:
    """What a row adds after its groups for one instruction over several arrays ("" for one array)."""
    if (c.operands or 1) <= 1:
        return ""
    if c.whole_bytes:
        return f", one all-reduce of {c.operands} operands ({c.whole_shape} summed whole, the rest reduce-scattered)"
    return f", one instruction of {c.operands} operands"


def _iota(dims: list[int], perm: list[int] | None, shape: list[int]) -> np.ndarray:
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if perm:
        ids = ids.transpose(perm)
    return ids.reshape(shape)


def _mesh_axis_dims(full: int, subs: list[tuple[int, int] | None]) -> tuple[list[int], list[int]]:
    """How one mesh axis splits for its axis references: (reshape dims, the dims each reference
    groups over, in the references' order), following XLA's MeshAxesReplicaGroupList.

    A sub-axis `a:(pre)size` is the `size` devices that vary after the first `pre` along `a`.
    """
    if subs == [None]:
        return [full], [0]
    if len(subs) == 1:
        pre, size = subs[0]
        return [pre, size, full // (pre * size)], [1]
    order = sorted(range(len(subs)), key=lambda i: subs[i][0])
    dims, grouped_sorted, prefix = [], [], 1
    for i in order:
        pre, size = subs[i]
        if pre != prefix:  # the part of the axis before this sub-axis
            dims.append(pre // prefix)
            prefix = pre
        grouped_sorted.append(len(dims))
        dims.append(size)
        prefix *= size
    if prefix != full:
        dims.append(full // prefix)
    grouped = [0] * len(subs)
    for rank, i in enumerate(order):
        grouped[i] = grouped_sorted[rank]
    return dims, grouped


def _mesh_replica_groups(m: re.Match) -> list[list[int]]:
    axes = [(name, int(size)) for name, size in _MESH_AXIS.findall(m.group("axes"))]
    names = [name for name, _ in axes]
    sizes = [size for _, size in axes]
    total = int(np.prod(sizes)) if sizes else 0
    ids_text = (m.group("ids") or "").strip()
    iota = _IOTA_IDS.match(ids_text)
    if not ids_text:
        ids = np.arange(total).reshape(sizes)
    elif iota:
        ids = _iota(_ints(iota.group(1)), _ints(iota.group(2)) if iota.group(2) else None, sizes)
    else:  # an explicit device list, possibly after its dimensions
        listed = [int(t) for t in re.findall(r"\d+", ids_text)]
        ids = np.array(listed[-total:]).reshape(sizes)
    refs: list[tuple[int, tuple[int, int] | None]] = []
    for name, pre, size in _AXIS_REF.findall(m.group("refs")):
        if name in names:
            refs.append((names.index(name), (int(pre), int(size)) if pre else None))
    per_axis: dict[int, list] = {}
    for axis, sub in refs:
        per_axis.setdefault(axis, []).append(sub)
    reshape, offsets, grouped_of = [], {}, {}
    for axis, full in enumerate(sizes):
        offsets[axis] = len(reshape)
        if axis in per_axis:
            dims, grouped_of[axis] = _mesh_axis_dims(full, per_axis[axis])
            reshape.extend(dims)
        else:
            reshape.append(full)
    used = {axis: 0 for axis in per_axis}
    grouped = []
    for axis, _ in refs:
        grouped.append(offsets[axis] + grouped_of[axis][used[axis]])
        used[axis] += 1
    rest = [d for d in range(len(reshape)) if d not in grouped]
    size = int(np.prod([reshape[d] for d in grouped])) if grouped else 1
    return ids.reshape(reshape).transpose(rest + grouped).reshape(-1, size).tolist()


def parse_replica_groups(line: str) -> list[list[int]]:
    """Replica groups of one instruction in any of XLA's four spellings ([] when absent)."""
    m = _MESH_GROUPS.search(line)
    if m:
        return _mesh_replica_groups(m)
    m = _EXPLICIT_GROUPS.search(line)
    if m:
        return [_ints(g) for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    m = _IOTA_GROUPS.search(line)
    if m:
        return _iota(_ints(m.group(2)), _ints(m.group(3)) if m.group(3) else None, _ints(m.group(1))).tolist()
    return []


def _types(text: str) -> dict[str, str]:
    """Instruction name -> its result type as printed, for operands printed by name only."""
    types = {}
    for line in text.splitlines():
        m = _DEFINITION.match(line)
        if m:
            types[m.group("name")] = m.group("type")
    return types


def _operand_bytes(line: str, start: int, types: dict[str, str]) -> int | None:
    """Bytes of the operands of the instruction whose argument list opens at `start`."""
    depth, end = 1, start
    while end < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        end += 1
    pieces = line[start:end - 1].split("%")
    if len(pieces) < 2:
        return None
    total, typed_text = 0, pieces[0]  # the text before each `%name` is that operand's type, if printed
    for piece in pieces[1:]:
        name = re.match(r"[\w.\-]*", piece).group(0)
        typed = _ARRAY.findall(typed_text)
        if not typed:
            if name not in types:
                return None
            typed = _ARRAY.findall(types[name])
        total += sum(_array_bytes(d, s) for d, s in typed)
        typed_text = piece[len(name):]
    return total


def _computation_counts(text: str, read: list | None = None) -> tuple[list[str | None], dict[str, int | None]]:
    """The computation each line belongs to, and how many times one run of the program enters each
    computation (cell/loops.py: trip counts of the loops around it, multiplied; None: unknown)."""
    owner: list[str | None] = []
    current = None
    for line in text.splitlines():
        opened = computation_name(line)
        if opened is not None:
            current = opened
        elif line.startswith("}"):
            current = None
        owner.append(current)
    return owner, calls(Program(text, read))


def runs_outside_loops(text: str, pattern: re.Pattern, read: list | None = None) -> bool:
    """Whether an instruction whose line matches `pattern` runs once per run of the program, not in the
    body of a loop (scan, fori_loop, while), nor in one a loop calls: by the computation it is in.
    `read`: hlo_text.instructions(text), when already read."""
    owner, counts = _computation_counts(text, read)
    return any(counts.get(comp) == 1 for comp, line in zip(owner, text.splitlines()) if comp and pattern.search(line))


#: The root operation of a reduction's computation (``to_apply``), in the words the views write.
_REDUCTION_WORDS = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "product", "and": "and", "or": "or",
                    "xor": "xor"}
_TO_APPLY = re.compile(r"\bto_apply=%?([\w.\-]+)")


def _reductions(text: str) -> dict[str, str]:
    """Each computation's root operation, by the computation's name (``%region_0.4 -> "add"``)."""
    roots: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        opened = computation_name(line)
        if opened is not None:
            current = opened
        elif current is not None and line.lstrip().startswith("ROOT"):
            op = _OPERATION.match(line)
            if op:
                roots[current] = op.group("op")
    return roots


def collectives(text: str, device_ids: list[int] | None = None, filename: str | None = None,
                shadows: dict[str, str] | None = None, is_user=None, read: list | None = None) -> list[Collective]:
    """Every collective in the compiled program, in program order, with device ids and bytes.

    `shadows` (`upcasts(...).shadows`): instructions XLA:CPU computes in f32 whose values the
    program holds in bf16/f16; those collectives get the program's dtype, shape and bytes.
    `is_user(file)`: whether a frame's file is the user's code (not a library's); the innermost
    such frame is the collective's `origin` (the line inside a function that needs it). `read`:
    hlo_text.instructions(text), when already read."""
    def to_device(i: int) -> int:
        return device_ids[i] if device_ids is not None and i < len(device_ids) else i

    frames = _frames(text) if filename else {}
    types = counts = roots = None  # read only when a program has collectives (roots: with reductions)
    found, windowed = [], []
    for index, line in enumerate(text.splitlines()):
        m = _INSTRUCTION.match(line)
        if not m:
            dcn = _MEGASCALE_SEND.match(line) if "megascale" in line else None
            if dcn is not None:
                owner, counts = _computation_counts(text, read) if counts is None else (owner, counts)
                found.append(_dcn_stage(dcn, line, counts.get(owner[index], 1) if owner[index] is not None else 1))
                found[-1].computation = owner[index]
            continue
        if types is None:
            types = _types(text)
            owner, counts = _computation_counts(text, read) if counts is None else (owner, counts)
            callers = _caller_frames(text)
            continued = async_continuations(text)
            asynchronous = async_starts(text)
        arrays = _ARRAY.findall(m.group("type"))
        if m.group("start"):
            # Async starts return (operands, results[, u32[] context buffers]): keep the results.
            while len(arrays) > 2 and arrays[-1][1] == "" and arrays[-1][0] in ("u32", "s32", "token"):
                arrays.pop()
            if len(arrays) > 1:
                arrays = arrays[len(arrays) // 2:]
        shape = ", ".join(f"{d}[{s}]" for d, s in arrays)
        size = sum(_array_bytes(d, s) for d, s in arrays)
        if owner[index] in continued:
            continue  # XLA:TPU prints one async collective again in its middle and done fusions
        groups = [[to_device(i) for i in g] for g in parse_replica_groups(line)]
        pairs_m = _PAIRS.search(line)
        pairs = []
        if pairs_m:
            pairs = [(to_device(int(a)), to_device(int(b))) for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs_m.group(1))]
        user_line, origin, chain = None, None, []
        frame = _FRAME.search(line)
        frame_id = int(frame.group(1)) if frame else callers.get(owner[index])  # XLA:TPU's fused collectives: the caller's
        if frame_id is not None and filename:
            chain = frames.get(frame_id, [])
            for file, lineno, _ in chain:
                if file == filename:
                    user_line = lineno
                    break
            if is_user is not None:
                inner = next((f for f in chain if f[0] and is_user(f[0])), None)
                if inner is not None and inner[0] != filename:
                    origin = inner
        operands = _operand_bytes(line, m.end(), types)
        count = counts.get(owner[index], 1) if owner[index] is not None else 1
        defined = _DEFINITION.match(line)
        low = (shadows or {}).get(defined.group("name")) if defined else None
        if low:  # the program's own dtypes: the bytes XLA:CPU's f32 copy moves, less the upcast
            shape, size, operands = program_shape(shape, size, operands, low)
            low = low if isinstance(low, str) else next(t for t in low if t)
        applied = _TO_APPLY.search(line)
        if applied and roots is None:
            roots = _reductions(text)
        reduction = _REDUCTION_WORDS.get((roots or {}).get(applied.group(1), "")) if applied else None
        named = _OP_NAME.search(line)
        first = _first_operand(line, m.end(), types)
        dims = _DIMENSIONS.search(line)
        found.append(Collective(m.group("op"), shape, size, groups, pairs, user_line, operands, count, low, origin,
                                reduction, name=defined.group("name") if defined else None, frames=tuple(chain),
                                computation=owner[index], op_name=named.group(1) if named else None,
                                dimensions=tuple(_ints(dims.group(1))) if dims else (), operand=first[0],
                                operand_type=first[1],
                                overlapped=bool(m.group("start")) or owner[index] in asynchronous))
        found[-1].backward = bool(named and "transpose(" in named.group(1))
        found[-1].operands = len(arrays)
        einsum = named if m.group("op") == "collective-permute" else None
        if einsum and einsum.group(1).endswith("dot_general"):  # the partitioner's, not the user's
            windowed.append((found[-1], (einsum.group(1), frame_id), _WINDOWED.search(owner[index] or "")))
    _name_windowed_einsums(windowed)
    if any(c.count is None for c in found):
        _per_trip(found, Program(text, read))
    return found


def _per_trip(found: list, program: Program) -> None:
    """Each collective in a loop XLA cannot bound: its calls per trip of that loop, and at most per run."""
    per_trip, bounded = calls(program, unknown="trip"), calls(program, unknown="bound")
    for c in found:
        if c.count is None and c.computation is not None:
            c.per_trip, c.at_most = per_trip.get(c.computation) or 1, bounded.get(c.computation)


_DIMENSIONS = re.compile(r"\bdimensions=\{([\d,]*)\}")


def _first_operand(line: str, start: int, types: dict[str, str]) -> tuple[str | None, str | None]:
    """(name, type) of the first operand of the instruction whose argument list opens at `start`."""
    found = re.match(r"\s*(?:([^%)]*?)\s+)?%([\w.\-]+)", line[start:])
    if found is None:
        return None, None
    typed = _ARRAY.findall(found.group(1) or "") or _ARRAY.findall(types.get(found.group(2), ""))
    return found.group(2), (f"{typed[0][0]}[{typed[0][1]}]" if typed else None)


_OP_NAME = re.compile(r'op_name="([^"]*)"')
# XLA:TPU's cross-slice stage: host-transfer sends to the Megascale runtime (the recv is the same transfer).
_MEGASCALE_SEND = re.compile(r"^\s*%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+send\(.*"
                             r'_xla_megascale_transfer_type="(?P<kind>\w+)"')
_MEGASCALE_REDUCTION = re.compile(r'_xla_megascale_reduce_operation="(\w+)"')


def _dcn_stage(m: re.Match, line: str, count: int | None) -> Collective:
    """A Megascale send: the part of a collective that crosses slices, over DCN, of the kind its transfer
    type names (ALL_REDUCE -> all-reduce; a kind the plan does not know is one send). Its data is the
    send's first tuple element (the rest: a context and a token)."""
    arrays = _ARRAY.findall(m.group("type"))[:1]
    shape = ", ".join(f"{d}[{s}]" for d, s in arrays)
    size = sum(_array_bytes(d, s) for d, s in arrays)
    op = m.group("kind").lower().replace("_", "-")
    reduced = _MEGASCALE_REDUCTION.search(line)
    reduction = {"SUM": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "product"}.get(reduced.group(1)) if reduced else None
    return Collective(op if op in OPS else "collective-permute", shape, size, operand_bytes=size, reduction=reduction,
                      name=m.group("name"), over_dcn=True, count=count)
_WINDOWED = re.compile(r"windowed_dot_general_body\w*?_(ag|rs)(?![a-z])")


def _name_windowed_einsums(permutes: list) -> None:
    """Mark the permutes of each of XLA:TPU's windowed einsums (the SPMD partitioner's loops named
    `windowed_dot_general_body_ag` / `_rs`, plus the steps it peels off them) with what they implement:
    the all-gather of a matmul's operand or the reduce-scatter of its result, N permutes a step."""
    by_matmul: dict[tuple, list] = {}
    for collective, key, loop in permutes:
        by_matmul.setdefault(key, []).append((collective, loop))
    for members in by_matmul.values():
        kinds = {loop.group(1) for _, loop in members if loop}
        if len(kinds) != 1:
            continue
        kind = {"ag": "all-gather", "rs": "reduce-scatter"}[kinds.pop()]
        counts = [c.count for c, _ in members]
        total = None if None in counts else sum(counts)
        for collective, _ in members:
            collective.windowed, collective.windowed_calls = kind, total


_ASYNC_DONE = re.compile(r'custom_call_target="AsyncCollectiveDone"')


def async_continuations(text: str) -> set[str]:
    """The computations that only continue an async collective begun in another one.

    XLA:TPU runs an async collective as a chain of fusions: one whose root is the custom-call
    `AsyncCollectiveStart`, then `async_collective_fusion`s that overlap it with compute (inside a
    loop, too, when the collective spans it), then one ending in `AsyncCollectiveDone`; each prints
    the same collective instruction again, and only the start's is the collective. Every other
    collective instruction is a collective of its own, however alike (XLA:CPU gives them all
    channel_id=1): the forward and the backward gathers of one weight are two."""
    if "AsyncCollective" not in text and "async_collective_fusion" not in text:
        return set()
    continued, current = set(), None
    for line in text.splitlines():
        opened = computation_name(line)
        if opened is not None:
            current = opened
            if opened.startswith("async_collective_fusion"):
                continued.add(opened)
        elif current is not None and _ASYNC_DONE.search(line):
            continued.add(current)
    return continued


_ASYNC_START = re.compile(r'custom_call_target="AsyncCollectiveStart"')
_ASYNC_WRAPPER = re.compile(r"\basync-start\(.*?\bcalls=%?([\w.\-]+)")


def async_starts(text: str) -> set[str]:
    """The computations whose collective runs asynchronously: XLA:TPU's fusions that start an async
    collective (their root the custom-call `AsyncCollectiveStart`) and what XLA's `async-start` wraps.
    (`-start` instructions, `all-gather-start(`, are asynchronous by their op.)"""
    if "AsyncCollectiveStart" not in text and "async-start(" not in text:
        return set()
    found, current = set(), None
    for line in text.splitlines():
        opened = computation_name(line)
        if opened is not None:
            current = opened
        elif current is not None and _ASYNC_START.search(line):
            found.add(current)
        wrapped = _ASYNC_WRAPPER.search(line) if "async-start(" in line else None
        if wrapped:
            found.add(wrapped.group(1))
    return found


def _caller_frames(text: str) -> dict[str, int]:
    """Computation -> the stack frame of an instruction that calls it (a fusion's `calls=`)."""
    found = {}
    for line in text.splitlines():
        if "calls=" not in line:
            continue
        callee, frame = re.search(r"\bcalls=%?([\w.\-]+)", line), _FRAME.search(line)
        if callee and frame:
            found.setdefault(callee.group(1), int(frame.group(1)))
    return found
