"""What each instruction a trace names is, read from the compiled program's text: its kind for the
timeline (compute, collective, copy, wait), the cell's line that made it and what JAX called it.

The trace names instructions as `compiled.as_text()` does; this module maps those names back to the
program (cell/hlo_text.py reads the text), so a name the program does not have is a trace of
something else, and the caller says so.

Plain Python; no JAX.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...cell.hlo_text import Instruction, instructions

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
               "collective-permute", "collective-broadcast")
COPIES = ("copy", "copy-start", "copy-done", "send", "recv", "send-done", "recv-done")
CONTAINERS = ("while", "conditional", "call")  # their runs hold their bodies' instructions
_ASYNC = ("async-start", "async-update", "async-done")
KINDS = ("compute", "collective", "copy", "wait")
_WHAT = re.compile(r"([\w\-]+)(?:\[[^\]]*\])?$")


@dataclass(frozen=True)
class OpFacts:
    """One instruction of the program, as the profile shows it."""

    name: str
    op: str  # its HLO opcode: fusion, all-reduce, copy-start, ...
    kind: str  # compute | collective | copy | wait
    collective: str | None  # the collective it runs or waits for ("all-reduce"), if any
    line: int | None  # the cell's line that made it, when its metadata says
    origin: tuple | None  # (file, line, function): the innermost frame of the user's code, where not the cell
    what: str  # what JAX called it ("dot_general", "psum"), or its opcode
    container: bool = False  # a while/conditional/call: its run holds its body's instructions


class ProgramOps:
    """The instructions of one compiled program, by name."""

    def __init__(self, text: str, filename: str | None = None, is_user=None):
        read = instructions(text)
        self._all = {ins.name: ins for ins in read}
        self._position = {ins.name: index for index, ins in enumerate(read)}
        self._roots = {ins.computation: ins for ins in self._all.values() if ins.root}
        self._collective_in: dict[str, str] = {}  # computation -> a collective among its instructions
        for ins in self._all.values():
            base = ins.op.removesuffix("-start")
            if base in COLLECTIVES and ins.computation is not None:
                self._collective_in.setdefault(ins.computation, base)
        self._filename, self._is_user = filename, is_user
        self._facts: dict[str, OpFacts] = {}
        module = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M)
        self.module = module.group(1) if module else None

    def __contains__(self, name: str) -> bool:
        return name in self._all

    def names(self) -> set[str]:
        return set(self._all)

    def group_of(self, name: str) -> str:
        """The instruction an asynchronous done belongs to (its start, its operand); else `name`."""
        ins = self._all.get(name)
        if ins is not None and ins.op.endswith("-done") and ins.operands and ins.operands[0] in self._all:
            return ins.operands[0]
        return name

    def order(self, names) -> list:
        """`names` in the order the program prints them."""
        return sorted(names, key=lambda n: self._position.get(n, len(self._position)))

    def facts(self, name: str) -> OpFacts | None:
        """What the instruction `name` is, or None when the program has no such instruction."""
        known = self._facts.get(name)
        if known is None and name in self._all:
            known = self._facts[name] = self._read(self._all[name])
        return known

    def _read(self, ins: Instruction) -> OpFacts:
        kind, collective = self._kind(ins)
        source = self._with_frames(ins)
        line, origin = self._place(source)
        return OpFacts(ins.name, ins.op, kind, collective, line, origin, _what(source or ins),
                       container=ins.op in CONTAINERS)

    def _kind(self, ins: Instruction) -> tuple[str, str | None]:
        op = ins.op
        if op in _ASYNC:  # a generic async pair around a computation: what its root does
            root = self._roots.get(ins.callee or "")
            if root is not None and root.op not in _ASYNC:
                kind, collective = self._kind(root)
                return ("wait" if op == "async-done" and kind == "collective" else kind), collective
            return "compute", None
        base = op.removesuffix("-start").removesuffix("-done").removesuffix("-update")
        if base in COLLECTIVES:
            return ("wait" if op.endswith("-done") else "collective"), base
        if op in COPIES:
            return "copy", None
        if op == "fusion":  # XLA:TPU fuses some collectives with their neighbours (all-gather fusions)
            inner = self._collective_inside(ins.callee)
            if inner is not None:
                return "collective", inner
            root = self._roots.get(ins.callee or "")
            if root is not None and root.op in COPIES:  # XLA:CPU's wrapped copies
                return "copy", None
        return "compute", None

    def _collective_inside(self, computation: str | None) -> str | None:
        return self._collective_in.get(computation or "")

    def _with_frames(self, ins: Instruction) -> Instruction | None:
        """The instruction whose metadata says where it came from: itself, else its callee's root (a
        fusion XLA made keeps its metadata on the operations inside)."""
        seen = set()
        while ins is not None and ins.name not in seen:
            if ins.key is not None and (ins.frames or ins.callee is None):
                return ins
            seen.add(ins.name)
            ins = self._roots.get(ins.callee or "")
        return None

    def _place(self, ins: Instruction | None) -> tuple[int | None, tuple | None]:
        if ins is None:
            return None, None
        chain = ins.frames
        if self._filename:
            for file, lineno, _ in chain:
                if file == self._filename:
                    return lineno, None
        if self._is_user is not None:
            inner = next((f for f in chain if f[0] and self._is_user(f[0])), None)
            if inner is not None:
                return None, inner
        return None, None


def _what(ins) -> str:
    """`jit(step)/transpose(jvp(mlp))/dot_general` -> "dot_general"; without a name, the opcode."""
    name = getattr(ins, "op_name", None)
    if not name or "/" not in name:  # no name, or an argument's (`x`, `params['w']`): the opcode says more
        return getattr(ins, "op", "")
    last = name.rstrip("/").rsplit("/", 1)[-1]
    matched = _WHAT.search(last)
    return matched.group(1) if matched else last
