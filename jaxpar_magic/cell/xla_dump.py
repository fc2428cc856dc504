"""XLA's own account of a compiled program's memory, read from its debug dump of that one compile.

`jit(f).lower(...).compile(compiler_options={"xla_dump_to": d})` writes, for that compile only (no
process-wide XLA_FLAGS), the files XLA:CPU and XLA:TPU both name `*after_optimizations-buffer-assignment.txt`
(every allocation: its size, its kind, the values placed in it at which offset) and
`*after_optimizations-live-range.txt` (the schedule, and the steps each value is live). They are
debug output, not an API: this module is the only one that reads them, and `tests/test_xla_dump.py`
fails loudly, naming the file and the line, when their format changes (`DumpFormatError`).

What it returns is plain data (`BufferDump`); stages/plan/peak.py turns it into the peak's buffers
and the memory timeline.

When XLA refuses a compile for memory (XLA:TPU's RESOURCE_EXHAUSTED: "HLO temporaries (36.02G) exceeds
available HBM (15.75G)"), it has already assigned every buffer and written the files above, and the
optimized program (`*.after_optimizations.txt`): `compile_with_dump` then raises `RefusedForMemory`
carrying them, so a plan can say what fills the memory of the step that does not fit (jax#9530,
"report the set of live buffers on OOM", at compile time).
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field

BUFFER_FILE = "after_optimizations-buffer-assignment.txt"
LIVE_RANGE_FILE = "after_optimizations-live-range.txt"
USAGE_FILE = "after_optimizations-memory-usage-report.txt"  # optional: the memory spaces' names
PROGRAM_FILE = ".after_optimizations.txt"  # the optimized program, as compiled.as_text() prints it

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(r"^ value: <(\d+) ([\w.\-]+)(\{[\d,]*\})?(?: \([\w\-]+\))* @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_PARAMETER = re.compile(r"\bparameter (\d+), shape \|.*?\| at ShapeIndex (\{[\d,]*\})")
_COLOR = re.compile(r"\bcolor (\d+)\b")
_SEQUENCE = re.compile(r"^\s+(\d+):([\w.\-]+)\s*$")
_RANGE = re.compile(r"^\s+([\w.\-]+)(\{[\d,]*\}):(\d+)-(\d+)\s*$")
_MAX = re.compile(r"^HloLiveRange \(max (\d+)\):")
_SPACE = re.compile(r"^Memory Space: (\S+) \(color=(\d+)\)", re.M)


class DumpFormatError(RuntimeError):
    """XLA's dump no longer reads as this module expects (a new XLA changed its debug output)."""


@dataclass(frozen=True)
class Allocation:
    index: int
    size: int
    kind: str  # "parameter" | "output" | "temp" | "constant" | "thread-local"
    parameter: int | None = None  # the entry parameter it holds
    shape_index: str = "{}"  # which part of that parameter
    color: int = 0  # the memory space: 0 is the device's main memory; XLA:TPU's also "vmem", "smem" (BufferDump.spaces)
    live_out: bool = False  # it holds (part of) the program's output: a donated parameter's buffer, reused

    @property
    def counted(self) -> bool:
        """Counted by compiled.memory_analysis() as an argument, an output or a temporary."""
        return self.kind in ("parameter", "output", "temp")


@dataclass(frozen=True)
class Value:
    name: str  # the instruction that defines it
    index: str  # which element of its (tuple) result: "{}", "{1}"
    allocation: int
    offset: int
    size: int
    type: str  # as printed: "bf16[256,2048]{1,0:T(8,128)(2,1)}"

    @property
    def key(self) -> str:
        return self.name + self.index


@dataclass
class BufferDump:
    allocations: dict[int, Allocation]
    values: list[Value]
    sequence: list[str]  # the schedule: instruction name at each step
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)  # value key -> (first, last) step it is live
    steps: int = 0  # the live ranges' last step
    spaces: dict[int, str] = field(default_factory=dict)  # color -> memory space: {0: "default", 1: "vmem"} on XLA:TPU


def _kind(flags: str) -> str:
    if "parameter " in flags:
        return "parameter"
    if "maybe-live-out" in flags or "output shape" in flags:
        return "output"
    if "constant" in flags:
        return "constant"
    if "thread-local" in flags:
        return "thread-local"
    return "temp"


def parse_buffer_assignment(text: str, source: str = BUFFER_FILE) -> tuple[dict[int, Allocation], list[Value]]:
    """Allocations and the values placed in them."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "BufferAssignment:":
        raise DumpFormatError(f"{source}: expected its first line to read 'BufferAssignment:', found {lines[:1]!r}")
    allocations: dict[int, Allocation] = {}
    values: list[Value] = []
    current = None
    for number, line in enumerate(lines[1:], start=2):
        header = _ALLOCATION.match(line)
        if header:
            flags = header.group(3)
            parameter = _PARAMETER.search(flags)
            color = _COLOR.search(flags)
            current = Allocation(int(header.group(1)), int(header.group(2)), _kind(flags),
                                 int(parameter.group(1)) if parameter else None,
                                 parameter.group(2) if parameter else "{}", int(color.group(1)) if color else 0,
                                 "maybe-live-out" in flags or "output shape" in flags)
            if current.kind == "parameter" and parameter is None:
                raise DumpFormatError(f"{source} line {number}: a parameter allocation without its number and shape "
                                      f"index: {line!r}")
            allocations[current.index] = current
            continue
        value = _VALUE.match(line)
        if value:
            if current is None:
                raise DumpFormatError(f"{source} line {number}: a value before any allocation: {line!r}")
            values.append(Value(value.group(2), value.group(3) or "{}", current.index, int(value.group(5)),
                                int(value.group(4)), value.group(6)))
            continue
        if line.startswith(("allocation ", " value:")):
            raise DumpFormatError(f"{source} line {number}: unreadable: {line!r}")
        if line.strip() and not line.startswith(" ") and allocations:
            break  # what follows the allocations (used buffers, ...) is not needed
    if not allocations:
        raise DumpFormatError(f"{source}: no 'allocation N: size S...' lines")
    return allocations, values


def parse_live_range(text: str, source: str = LIVE_RANGE_FILE) -> tuple[list[str], dict[str, tuple[int, int]], int]:
    """(the schedule, each value's live range, the last step)."""
    lines = text.splitlines()
    head = _MAX.match(lines[0]) if lines else None
    if head is None:
        raise DumpFormatError(f"{source}: expected its first line to read 'HloLiveRange (max N):', found {lines[:1]!r}")
    sequence: list[str] = []
    ranges: dict[str, tuple[int, int]] = {}
    section = None
    for number, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if stripped in ("InstructionSequence:", "BufferLiveRange:"):
            section = stripped
            continue
        if stripped.startswith("Live ranges at") or stripped.startswith("Stack trace breakdown"):
            break
        if section == "InstructionSequence:":
            m = _SEQUENCE.match(line)
            if m is None or int(m.group(1)) != len(sequence):
                raise DumpFormatError(f"{source} line {number}: expected step {len(sequence)} as 'N:name', found {line!r}")
            sequence.append(m.group(2))
        elif section == "BufferLiveRange:":
            m = _RANGE.match(line)
            if m is None:
                raise DumpFormatError(f"{source} line {number}: expected 'name{{index}}:first-last', found {line!r}")
            ranges[m.group(1) + m.group(2)] = (int(m.group(3)), int(m.group(4)))
    if not sequence or not ranges:
        raise DumpFormatError(f"{source}: no InstructionSequence or BufferLiveRange section")
    return sequence, ranges, int(head.group(1))


def read_dump(folder: str) -> BufferDump:
    """The buffer assignment and live ranges XLA wrote into `folder` for one compiled module."""
    found = {}
    for suffix in (BUFFER_FILE, LIVE_RANGE_FILE):
        paths = sorted(glob.glob(os.path.join(folder, f"*{suffix}")))
        if not paths:
            listed = ", ".join(sorted(os.listdir(folder))[:8]) or "nothing"
            raise DumpFormatError(f"XLA wrote no *{suffix} for this compile (it wrote: {listed})")
        with open(paths[-1], encoding="utf-8", errors="replace") as f:
            found[suffix] = f.read()
    allocations, values = parse_buffer_assignment(found[BUFFER_FILE])
    sequence, ranges, steps = parse_live_range(found[LIVE_RANGE_FILE])
    spaces = {}
    for path in glob.glob(os.path.join(folder, f"*{USAGE_FILE}"))[-1:]:
        with open(path, encoding="utf-8", errors="replace") as f:
            spaces = {int(color): name for name, color in _SPACE.findall(f.read())}
    return BufferDump(allocations, values, sequence, ranges, steps, spaces)


class RefusedForMemory(Exception):
    """XLA refused the compile for memory (`error`, its RESOURCE_EXHAUSTED), after writing its buffer
    assignment (`dump`) and the optimized program (`text`)."""

    def __init__(self, error: BaseException, dump: BufferDump, text: str):
        super().__init__(str(error))
        self.error, self.dump, self.text = error, dump, text

    @property
    def said(self) -> str:
        """XLA's own words, its first line."""
        said = str(self.error).strip().splitlines()[0] if str(self.error).strip() else type(self.error).__name__
        return said.rstrip(".")


def compile_with_dump(lowered, options: dict | None = None):
    """`lowered.compile()` with XLA's buffer dump of this one compile: (compiled, BufferDump). A
    compile refused for memory raises RefusedForMemory (from XLA's error) where XLA wrote its dump."""
    folder = tempfile.mkdtemp(prefix="jpm-xla-dump-")
    try:
        try:
            with persistent_cache_off():
                compiled = lowered.compile(compiler_options={**(options or {}), "xla_dump_to": folder})
        except Exception as exc:
            refused = _refused(exc, folder)
            if refused is None:
                raise
            raise refused from exc
        return compiled, read_dump(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_switching_the_cache = threading.Lock()  # a cell's plan and the layout explorer's may compile at once


@contextlib.contextmanager
def persistent_cache_off():
    """JAX's persistent compilation cache off for the block, where the user set one
    (`jax_compilation_cache_dir`, as JAX's docs advise for large models), then back as it was.

    That cache keys a program without its `xla_dump_to` (jax/_src/cache_key.py clears the dump
    options), so a plan of a program compiled before, in this session or an earlier one, would be
    loaded from it: no compile, so no buffer assignment, and no plan. A compile for a dump must
    really compile; nor is a compile-only executable (XLA:TPU's, for a slice not attached) worth a
    place in the user's cache. Public API only: the config flag, and
    jax.experimental.compilation_cache's reset_cache(), since JAX decides once per process whether
    the cache is used, and a reset makes it decide again."""
    import jax

    if not (jax.config.jax_compilation_cache_dir and jax.config.jax_enable_compilation_cache):
        yield
        return
    from jax.experimental.compilation_cache import compilation_cache

    with _switching_the_cache:
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
        try:
            yield
        finally:
            jax.config.update("jax_enable_compilation_cache", True)
            compilation_cache.reset_cache()


def _refused(exc: BaseException, folder: str) -> RefusedForMemory | None:
    if "RESOURCE_EXHAUSTED" not in str(exc):
        return None
    programs = sorted(glob.glob(os.path.join(folder, f"*{PROGRAM_FILE}")))
    try:
        dump = read_dump(folder)
    except DumpFormatError:
        return None  # nothing (or nothing readable) written: the error alone says what XLA said
    if not programs:
        return None
    with open(programs[-1], encoding="utf-8", errors="replace") as f:
        return RefusedForMemory(exc, dump, f.read())
