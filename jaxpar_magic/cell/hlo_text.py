"""The text of an HLO module (`compiled.as_text()`, `lowered.as_text(dialect="hlo")`) as records:
its instructions with their operands, the computation each belongs to and the one it calls, and the
source frames JAX records for each (the module's FileNames / FunctionNames / FileLocations /
StackFrames tables). cell/hlo.py reads collectives from them, stages/plan/peak.py names buffers.

XLA:CPU and XLA:TPU print the same grammar; TPU types carry tiled layouts (`{1,0:T(8,128)(2,1)S(1)}`),
which the array pattern skips.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
COLLECTIVE_OPS = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
ARRAY = re.compile(r"\b([a-z]+\d*(?:e\dm\d\w*)?)\[([\d,]*)\]")
FRAME = re.compile(r"stack_frame_id=(\d+)")
OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')  # JAX escapes quotes in it: params[\'w1\']
OPERATION = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+(?P<op>[\w\-]+)\((?P<args>.*)$")
_TYPES_IN_ARGS = re.compile(r"\w+\d*\[[\d,]*\](?:\{[^}]*\})?")


def ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def array_bytes(dtype: str, dims: str) -> int:
    return DTYPE_BYTES.get(dtype, 4) * int(np.prod(ints(dims) or [1]))


def type_bytes(type_text: str) -> int:
    """Bytes of every array in a printed type (a tuple's elements added up)."""
    return sum(array_bytes(d, s) for d, s in ARRAY.findall(type_text))


def frames(text: str) -> dict[int, list[tuple[str, int, str]]]:
    """stack_frame_id -> its (file name, line, function) frames, innermost first, from the module's
    frame tables."""
    files, functions, locations, table = {}, {}, {}, {}
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
        elif section == "FunctionNames":
            functions[int(key)] = rest.strip().strip('"')
        elif section == "FileLocations":
            fid = re.search(r"file_name_id=(\d+)", rest)
            ln = re.search(r"\bline=(\d+)", rest)
            fn = re.search(r"function_name_id=(\d+)", rest)
            if fid and ln:
                locations[int(key)] = (int(fid.group(1)), int(ln.group(1)), int(fn.group(1)) if fn else None)
        elif section == "StackFrames":
            loc = re.search(r"file_location_id=(\d+)", rest)
            parent = re.search(r"parent_frame_id=(\d+)", rest)
            if loc:
                table[int(key)] = (int(loc.group(1)), int(parent.group(1)) if parent else 0)
    # XLA prints each parent_frame_id one above the parent's id (0 = none), so an outermost frame
    # reads as its own parent: frame 1 always does. Where no frame does, the ids are taken as printed.
    if any(parent == key for key, (_, parent) in table.items()):
        table = {key: (loc, parent - 1) for key, (loc, parent) in table.items()}
    chains: dict[int, list[tuple[str, int, str]]] = {}
    for start in table:
        chain, fid, seen = [], start, set()
        while fid in table and fid not in seen:  # innermost frame first, then its callers
            seen.add(fid)
            loc, fid = table[fid]
            file_id, lineno, function_id = locations.get(loc, (None, None, None))
            chain.append((files.get(file_id, ""), lineno, functions.get(function_id, "")))
        chains[start] = chain
    return chains


@dataclass
class Instruction:
    name: str
    type: str
    op: str
    operands: list[str]
    callee: str | None  # the computation a fusion or call runs (`calls=`)
    key: tuple | None  # (op_name, source frames): the same operation in the lowered and the compiled module
    computation: str | None
    line: str = ""
    root: bool = False  # its computation's ROOT

    @property
    def op_name(self) -> str | None:
        return self.key[0] if self.key else None

    @property
    def frames(self) -> tuple:
        return self.key[1] if self.key else ()


def computation_name(line: str) -> str | None:
    """The computation a header line opens (`ENTRY %main ... {`, `%fused_computation.3 (...) -> ... {`)."""
    if line and not line[0].isspace() and line.rstrip().endswith("{") and not line.startswith("HloModule"):
        words = line.split()
        return (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")
    return None


def instructions(text: str) -> list[Instruction]:
    """Every instruction of every computation, in the order printed."""
    chains = frames(text)
    found, current = [], None
    for line in text.splitlines():
        opened = computation_name(line)
        if opened is not None:
            current = opened
            continue
        m = OPERATION.match(line)
        if not m or current is None:
            continue
        args = m.group("args")
        depth, end = 1, 0
        while end < len(args) and depth:
            depth += {"(": 1, ")": -1}.get(args[end], 0)
            end += 1
        operands = re.findall(r"%?([\w.\-]+)(?=\s*(?:,|$))", _TYPES_IN_ARGS.sub("", args[:end - 1]))
        callee = re.search(r"\bcalls=%?([\w.\-]+)", line)
        op_name = OP_NAME.search(line)
        frame = FRAME.search(line)
        key = None
        if op_name:
            chain = tuple(chains.get(int(frame.group(1)), [])) if frame else ()
            key = (re.sub(r"\\(.)", r"\1", op_name.group(1)), chain)
        found.append(Instruction(m.group("name"), m.group("type"), m.group("op"), operands,
                                 callee.group(1) if callee else None, key, current, line, bool(m.group("root"))))
    return found


def entry_name(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("ENTRY "):
            return line.split()[1].lstrip("%")
    return None
