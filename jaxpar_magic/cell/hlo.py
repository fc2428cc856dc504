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

from .hlo_text import ARRAY as _ARRAY, DTYPE_BYTES as _DTYPE_BYTES, FRAME as _FRAME, Instruction as _Instruction
from .hlo_text import array_bytes as _array_bytes, frames as _frames, instructions as _instructions, ints as _ints
from .hlo_text import OPERATION as _OPERATION, computation_name, type_bytes as _type_bytes
from .loops import Program, calls

OPS = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
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
            continue
        if types is None:
            types = _types(text)
            owner, counts = _computation_counts(text, read) if counts is None else (owner, counts)
            callers = _caller_frames(text)
            continued = async_continuations(text)
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
        found.append(Collective(m.group("op"), shape, size, groups, pairs, user_line, operands, count, low, origin,
                                reduction, name=defined.group("name") if defined else None, frames=tuple(chain)))
        named = _OP_NAME.search(line)
        found[-1].backward = bool(named and "transpose(" in named.group(1))
        found[-1].operands = len(arrays)
        einsum = named if m.group("op") == "collective-permute" else None
        if einsum and einsum.group(1).endswith("dot_general"):  # the partitioner's, not the user's
            windowed.append((found[-1], (einsum.group(1), frame_id), _WINDOWED.search(owner[index] or "")))
    _name_windowed_einsums(windowed)
    return found


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


# --- the program's own dtypes (undoing XLA:CPU's bf16 -> f32 upcast) ------------------------------

_LOW_FLOATS = ("bf16", "f16")
_NO_TRAFFIC = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
               "after-all", "partition-id", "replica-id", "add-dependency", "opt-barrier"}
_MOVES = {"parameter", "convert", "bitcast", "slice", "reshape", "transpose", "copy", "concatenate", "dynamic-slice"}
_CONTROL_CALLEE = re.compile(r"\b(?:body|condition|true_computation|false_computation|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_DOT_DIMS = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_PRECISION = re.compile(r"operand_precision=\{(\w+)")


def _float_dtypes(type_text: str) -> set[str]:
    return {d for d, _ in _ARRAY.findall(type_text) if d.startswith(("f", "bf")) and d != "f8"} or set()


def program_types(lowered_text: str, instructions: list | None = None) -> dict[tuple, str]:
    """(op_name, frames) -> the one floating dtype the program (before XLA's passes) gives the
    operations of that name and place; places with several are left out."""
    seen: dict[tuple, set[str]] = {}
    for ins in instructions if instructions is not None else _instructions(lowered_text):
        if ins.key is not None:
            seen.setdefault(ins.key, set()).update(_float_dtypes(ins.type))
    return {key: next(iter(types)) for key, types in seen.items() if len(types) == 1}


@dataclass
class Upcasts:
    """What XLA:CPU computes in f32 that the program holds in bf16 or f16."""

    shadows: dict[str, str]  # instruction name -> the program's dtype of its (f32) result
    artifacts: set[str]  # conversions that exist only because of the upcast
    traffic_bytes: float  # bytes of HBM traffic the upcast adds to cost_analysis' 'bytes accessed'


def upcasts(compiled_text: str, types: dict[tuple, str], instructions: list | None = None) -> Upcasts:
    """Find the compiled program's f32 values that are the program's bf16/f16 ones, and the traffic
    XLA:CPU's conversions add (its cost analysis counts them as memory time). `instructions`: the
    compiled text's, when already read."""
    instructions = instructions if instructions is not None else _instructions(compiled_text)
    by_name = {i.name: i for i in instructions}
    bodies: dict[str, list[_Instruction]] = {}
    for ins in instructions:
        bodies.setdefault(ins.computation, []).append(ins)
    top = _entry(compiled_text)
    for line in compiled_text.splitlines():
        for target in _CONTROL_CALLEE.findall(line):
            top.update(n.lstrip("%") for n in re.findall(r"[\w.\-]+", target))
    shadows: dict[str, str] = {}
    artifacts: set[str] = set()

    def only_f32(type_text: str) -> bool:
        arrays = _ARRAY.findall(type_text)
        return bool(arrays) and all(d == "f32" for d, _ in arrays)

    def convert_source(ins: _Instruction) -> tuple[str | None, bool]:
        """(the 16-bit dtype a convert, or a fusion that only converts and moves data, widens to
        f32; whether it does nothing else: then all its traffic is the upcast's)."""
        if ins.op == "convert" and ins.operands and ins.operands[0] in by_name:
            low = _float_dtypes(by_name[ins.operands[0]].type) & set(_LOW_FLOATS)
            return next(iter(low), None), True
        if ins.op == "fusion" and ins.callee in bodies:
            ops = {i.op for i in bodies[ins.callee]}
            if ops <= _MOVES and "convert" in ops:
                params = [i for i in bodies[ins.callee] if i.op == "parameter"]
                low = set().union(*(_float_dtypes(p.type) for p in params)) & set(_LOW_FLOATS) if params else set()
                return next(iter(low), None), ops <= {"parameter", "convert", "bitcast"}
        return None, False

    for ins in instructions:  # definitions come before their uses
        if ins.computation not in top:
            continue
        if not only_f32(ins.type):
            # narrowing an upcast value back to its own dtype is the upcast's doing too
            if ins.operands and all(o in shadows for o in ins.operands) and _narrowing_only(ins, bodies):
                artifacts.add(ins.name)
            continue
        low, only_converts = convert_source(ins)
        if low:
            shadows[ins.name] = low
            if only_converts:
                artifacts.add(ins.name)
            continue
        program = types.get(ins.key) if ins.key is not None else None
        if ins.op in OPS or ins.op.endswith(("-start", "-done")):
            per = [shadows.get(o) for o in ins.operands if o in by_name]
            if per and all(isinstance(t, str) for t in per) and len(set(per)) == 1:
                shadows[ins.name] = per[0]
                continue
            if any(isinstance(t, str) for t in per) and len(per) == len(_ARRAY.findall(ins.type)):
                shadows[ins.name] = tuple(t if isinstance(t, str) else None for t in per)  # a combined collective
                continue
        if ins.op == "get-tuple-element" and isinstance(shadows.get(ins.operands[0] if ins.operands else ""), tuple):
            index = re.search(r"index=(\d+)", ins.line)
            element = shadows[ins.operands[0]][int(index.group(1))] if index else None
            if element:
                shadows[ins.name] = element
            continue
        if program in _LOW_FLOATS:
            shadows[ins.name] = program
    traffic = 0.0
    for ins in instructions:
        if ins.computation not in top or ins.op in _NO_TRAFFIC:
            continue
        sizes = [(o, _type_bytes(by_name[o].type)) for o in ins.operands if o in by_name]
        if ins.name in artifacts:
            traffic += _type_bytes(ins.type) + sum(b for _, b in sizes)
            continue
        traffic += sum(_saving(by_name[o].type, shadows[o]) for o, _ in sizes if o in shadows)
        if ins.name in shadows:
            traffic += _saving(ins.type, shadows[ins.name])
    return Upcasts(shadows, artifacts, traffic)


def _saving(type_text: str, shadow) -> float:
    """Bytes an f32 value (or tuple of them) takes beyond the program's own 16-bit dtypes."""
    arrays = _ARRAY.findall(type_text)
    lows = shadow if isinstance(shadow, tuple) else (shadow,) * len(arrays)
    return sum(_array_bytes(d, dims) * (1 - _DTYPE_BYTES[low] / 4) for (d, dims), low in zip(arrays, lows)
               if low and d == "f32")


def program_shape(shape: str, size: int, operands: int | None, shadow) -> tuple[str, int, int | None]:
    """A collective's shape, bytes and operand bytes in the program's dtypes (`shadow`: one dtype, or
    one per element of a combined collective, None where XLA:CPU's f32 is the program's too)."""
    parts = _ARRAY.findall(shape)
    lows = shadow if isinstance(shadow, tuple) else (shadow,) * len(parts)
    saved = sum(_array_bytes(d, dims) * (1 - _DTYPE_BYTES[low] / 4) for (d, dims), low in zip(parts, lows)
                if low and d == "f32")
    text = ", ".join(f"{low if low and d == 'f32' else d}[{dims}]" for (d, dims), low in zip(parts, lows))
    ratio = (size - saved) / size if size else 1.0
    return text, int(size - saved), int(operands * ratio) if operands is not None else None


def _narrowing_only(ins: _Instruction, bodies: dict) -> bool:
    if ins.op == "convert":
        return True
    ops = [i.op for i in bodies.get(ins.callee, [])]
    return bool(ops) and set(ops) <= {"parameter", "convert", "bitcast"}


def _entry(text: str) -> set[str]:
    return {line.split()[1].lstrip("%") for line in text.splitlines() if line.startswith("ENTRY ")}


def program_facts(lowered_text: str) -> tuple[dict[tuple, str], dict[str, float]]:
    """`program_types` and `matmul_flops` of the lowered (pre-XLA) program, read in one pass."""
    instructions = _instructions(lowered_text)
    return program_types(lowered_text, instructions), matmul_flops(lowered_text, instructions)


def matmul_flops(lowered_text: str, instructions: list | None = None) -> dict[str, float]:
    """FLOPs of the program's matmuls by the rate class they run at: "bf16" (and f16), "f32" at
    JAX's default precision, "f32-high", "f32-highest", "int8" (and fp8); global, before partitioning;
    every loop trip counted."""
    instructions = instructions if instructions is not None else _instructions(lowered_text)
    types = {i.name: i.type for i in instructions}
    runs = calls(Program(lowered_text, instructions)) if " while(" in lowered_text else {}
    flops: dict[str, float] = {}
    for ins in instructions:
        if ins.op != "dot" or len(ins.operands) < 2:
            continue
        result = _ARRAY.findall(ins.type)
        lhs = _ARRAY.findall(types.get(ins.operands[0], ""))
        if not result or not lhs:
            continue
        line = ins.line
        dims = _ints(lhs[0][1])
        contracting = _DOT_DIMS.search(line)
        k = int(np.prod([dims[i] for i in _ints(contracting.group(1))])) if contracting else 1
        count = 2.0 * float(np.prod(_ints(result[0][1]) or [1])) * k * (runs.get(ins.computation) or 1)  # every trip
        dtype = lhs[0][0]
        if dtype in ("bf16", "f16"):
            cls = "bf16"
        elif dtype == "f32":
            precision = _PRECISION.search(line)
            cls = {"high": "f32-high", "highest": "f32-highest"}.get(precision.group(1) if precision else "", "f32")
        elif dtype in ("s8", "u8", "s4", "u4") or dtype.startswith("f8"):
            cls = "int8"
        else:
            cls = dtype  # f64, c64: no matmul unit rate; the cost model says so
        flops[cls] = flops.get(cls, 0.0) + count
    return flops
