"""Collectives read from a compiled program's text (`jitted.lower(...).compile().as_text()`).

XLA spells replica groups three ways: explicit `{{0,1},{2,3}}`, iota `[2,2]<=[4]`, and transposed
iota `[2,2]<=[2,2]T(1,0)`; `source_target_pairs` list a collective-permute's sends. Ids there are
positions in the program's device assignment, which callers map to device ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

OPS = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
_DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(OPS) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d\w*)?)\[([\d,]*)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_FRAME = re.compile(r"stack_frame_id=(\d+)")


@dataclass
class Collective:
    op: str
    shape: str  # the result type as XLA prints it, layouts dropped: "f32[8,4]"
    bytes: int  # size of the result on one device
    groups: list[list[int]] = field(default_factory=list)  # device ids; [] means all devices together
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (source, target) device ids
    line: int | None = None  # line of the user's cell that issued it, when known


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def _array_bytes(dtype: str, dims: str) -> int:
    return _DTYPE_BYTES.get(dtype, 4) * int(np.prod(_ints(dims) or [1]))


def parse_replica_groups(line: str) -> list[list[int]]:
    """Replica groups of one instruction in any of XLA's three spellings ([] when absent)."""
    m = _EXPLICIT_GROUPS.search(line)
    if m:
        return [_ints(g) for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    m = _IOTA_GROUPS.search(line)
    if m:
        shape, dims = _ints(m.group(1)), _ints(m.group(2))
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose(_ints(m.group(3)))
        return ids.reshape(shape).tolist()
    return []


def _frames(text: str) -> dict[int, list[tuple[str, int]]]:
    """stack_frame_id -> its (file name, line) frames, innermost first, from the module's frame tables."""
    files, locations, frames = {}, {}, {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        if not line or not line[0].isdigit():
            if line:
                section = None
            continue
        key, _, rest = line.partition(" ")
        if section == "FileNames":
            files[int(key)] = rest.strip().strip('"')
        elif section == "FileLocations":
            fid = re.search(r"file_name_id=(\d+)", rest)
            ln = re.search(r"\bline=(\d+)", rest)
            if fid and ln:
                locations[int(key)] = (int(fid.group(1)), int(ln.group(1)))
        elif section == "StackFrames":
            loc = re.search(r"file_location_id=(\d+)", rest)
            parent = re.search(r"parent_frame_id=(\d+)", rest)
            if loc:
                frames[int(key)] = (int(loc.group(1)), int(parent.group(1)) if parent else 0)
    chains: dict[int, list[tuple[str, int]]] = {}
    for start in frames:
        chain, fid, seen = [], start, set()
        while fid in frames and fid not in seen:  # innermost frame first, then its callers
            seen.add(fid)
            loc, fid = frames[fid]
            file_id, lineno = locations.get(loc, (None, None))
            chain.append((files.get(file_id, ""), lineno))
        chains[start] = chain
    return chains


def collectives(text: str, device_ids: list[int] | None = None, filename: str | None = None) -> list[Collective]:
    """Every collective in the compiled program, in program order, with device ids and bytes."""
    def to_device(i: int) -> int:
        return device_ids[i] if device_ids is not None and i < len(device_ids) else i

    frames = _frames(text) if filename else {}
    found = []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        arrays = _ARRAY.findall(m.group("type"))
        if m.group("start"):
            # Async starts return (operands, results[, u32[] context buffers]): keep the results.
            while len(arrays) > 2 and arrays[-1][1] == "" and arrays[-1][0] in ("u32", "s32", "token"):
                arrays.pop()
            if len(arrays) > 1:
                arrays = arrays[len(arrays) // 2:]
        shape = ", ".join(f"{d}[{s}]" for d, s in arrays)
        size = sum(_array_bytes(d, s) for d, s in arrays)
        groups = [[to_device(i) for i in g] for g in parse_replica_groups(line)]
        pairs_m = _PAIRS.search(line)
        pairs = []
        if pairs_m:
            pairs = [(to_device(int(a)), to_device(int(b))) for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs_m.group(1))]
        user_line = None
        frame = _FRAME.search(line)
        if frame and filename:
            for file, lineno in frames.get(int(frame.group(1)), []):
                if file == filename:
                    user_line = lineno
                    break
        found.append(Collective(m.group("op"), shape, size, groups, pairs, user_line))
    return found
