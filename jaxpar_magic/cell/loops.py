"""How many times one run of a compiled program enters each computation: the trip count of every while
loop around it, nested loops multiplied.

XLA writes the trip count it proved into the while's backend_config (`"known_trip_count":{"n":"8"}`),
as XLA:CPU does for scan and fori_loop. XLA:TPU often leaves it out (its windowed-einsum loops, and the
scans it has rewritten); then the count is read from the loop itself, as XLA's own WhileLoopAnalysis
does: the condition compares one tuple element (the induction variable) with a constant, the while's
operand gives that element a constant start, and the body adds a constant step to it. Only where one of
those is not a constant is a loop's length unknown (None): a `while_loop` on a computed condition.

Plain Python over the program text (cell/hlo_text.py's records).
"""
from __future__ import annotations

import math
import re

from .hlo_text import Instruction, instructions

_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
BODY = re.compile(r"\bbody=%?([\w.\-]+)")
CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_DIRECTION = re.compile(r"\bdirection=(\w+)")
_INDEX = re.compile(r"\bindex=(\d+)")
_CONSTANT = re.compile(r"\bconstant\((-?\d+)\)")
_CALLS = re.compile(r"\b(?:calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_PASS = ("copy", "bitcast", "convert", "reshape")
_FLIP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}


class Program:
    """A compiled program's instructions by name and by computation, with its entry."""

    def __init__(self, text: str, read: list[Instruction] | None = None):
        self.read = read if read is not None else instructions(text)
        self.by_name = {i.name: i for i in self.read}
        self.bodies: dict[str, list[Instruction]] = {}
        for ins in self.read:
            self.bodies.setdefault(ins.computation, []).append(ins)
        self.entry = next((line.split()[1].lstrip("%") for line in text.splitlines() if line.startswith("ENTRY ")), None)

    def root(self, computation: str) -> Instruction | None:
        body = self.bodies.get(computation, [])
        return next((i for i in body if i.root), body[-1] if body else None)

    def through(self, name: str) -> Instruction | None:
        ins = self.by_name.get(name)
        while ins is not None and ins.op in _PASS and ins.operands:
            ins = self.by_name.get(ins.operands[0])
        return ins

    def constant(self, name: str) -> int | None:
        ins = self.through(name)
        m = _CONSTANT.search(ins.line) if ins is not None and ins.op == "constant" else None
        return int(m.group(1)) if m else None

    def element(self, name: str) -> int | None:
        """The tuple index when `name` is an element of its computation's parameter."""
        ins = self.through(name)
        if ins is None or ins.op != "get-tuple-element" or not ins.operands:
            return None
        tup = self.by_name.get(ins.operands[0])
        m = _INDEX.search(ins.line)
        return int(m.group(1)) if m and tup is not None and tup.op == "parameter" else None

    def binary(self, ins: Instruction, op: str) -> tuple[list[str], str] | None:
        """(operands, line) of `op` applied at `ins`: the instruction itself, or a fusion whose root
        applies it to the fusion's parameters (XLA:CPU wraps the loop's compare and add so)."""
        if ins.op == op:
            return ins.operands, ins.line
        if ins.op != "fusion" or ins.callee is None:
            return None
        root = self.root(ins.callee)
        if root is None or root.op != op:
            return None
        params = {p.name: int(m.group(1)) for p in self.bodies.get(ins.callee, [])
                  if p.op == "parameter" and (m := re.search(r"parameter\((\d+)\)", p.line))}
        if any(o not in params or params[o] >= len(ins.operands) for o in root.operands):
            return None
        return [ins.operands[params[o]] for o in root.operands], root.line


def trip_count(loop: Instruction, program: Program) -> int | None:
    """Trips of one while instruction: XLA's known_trip_count, else its condition's bound, its
    induction variable's start and its body's step; None where one is not a constant."""
    known = _TRIP_COUNT.search(loop.line)
    if known:
        return int(known.group(1))
    body, condition = BODY.search(loop.line), CONDITION.search(loop.line)
    root = program.root(condition.group(1)) if condition else None
    compared = program.binary(root, "compare") if root is not None else None
    if not body or compared is None or len(compared[0]) != 2:
        return None
    return _counted(loop, body.group(1), compared, program)


def trip_bound(loop: Instruction, program: Program) -> int | None:
    """The most trips a loop of unknown length can make, where its condition says so: a counter's
    bound anded with a computed test (`(i < 1000) & (err > tol)`), the tightest such bound; None
    where the condition has none."""
    body, condition = BODY.search(loop.line), CONDITION.search(loop.line)
    root = program.root(condition.group(1)) if condition else None
    if not body or root is None:
        return None
    bounds = [n for n in (_counted(loop, body.group(1), c, program) for c in _conjuncts(root, program, {}))
              if n is not None]
    return min(bounds) if bounds else None


def _conjuncts(ins: Instruction, program: Program, outer: dict, depth: int = 0) -> list:
    """The compares an `and` chain (fused or not) requires, as (operands, line) in the condition's own
    names: a fused computation's parameters read as the fusion's operands."""
    if ins is None or depth > 8:
        return []
    named = [outer.get(o, o) for o in ins.operands]
    if ins.op == "compare" and len(named) == 2:
        return [(named, ins.line)]
    if ins.op == "and":
        return [c for o in ins.operands for c in _conjuncts(_inside(o, program, outer), program, outer, depth + 1)]
    if ins.op == "fusion" and ins.callee is not None:
        params = {p.name: named[int(m.group(1))] for p in program.bodies.get(ins.callee, [])
                  if p.op == "parameter" and (m := re.search(r"parameter\((\d+)\)", p.line))
                  and int(m.group(1)) < len(named)}
        return _conjuncts(program.root(ins.callee), program, params, depth + 1)
    return []


def _inside(name: str, program: Program, outer: dict) -> Instruction | None:
    """The instruction `name` names: inside a fused computation (its own), else the caller's."""
    return program.by_name.get(name) if name not in outer else program.by_name.get(outer[name])


def _counted(loop: Instruction, body: str, compared: tuple, program: Program) -> int | None:
    """Trips of `loop` were its condition only the compare `compared` ((operands, line))."""
    (left, right), line = compared
    direction = _DIRECTION.search(line)
    if direction is None:
        return None
    index, bound, way = program.element(left), program.constant(right), direction.group(1)
    if index is None:
        index, bound, way = program.element(right), program.constant(left), _FLIP.get(way, way)
    start = _start(loop, index, program) if index is not None else None
    step = _step(body, index, program) if index is not None else None
    if bound is None or start is None or not step:
        return None
    return _trips(start, step, bound, way)


def _start(loop: Instruction, index: int, program: Program) -> int | None:
    tup = program.by_name.get(loop.operands[0]) if loop.operands else None
    if tup is not None and tup.op == "parameter":  # XLA:CPU wraps a loop in a `call`: its caller's operand
        callers = [i for i in program.read if i.op == "call" and f"to_apply=%{tup.computation}" in i.line]
        tup = program.by_name.get(callers[0].operands[0]) if len(callers) == 1 and callers[0].operands else None
    if tup is None or tup.op != "tuple" or index >= len(tup.operands):
        return None
    return program.constant(tup.operands[index])


def _step(body: str, index: int, program: Program) -> int | None:
    root = program.root(body)
    if root is None or root.op != "tuple" or index >= len(root.operands):
        return None
    added = program.through(root.operands[index])
    summed = program.binary(added, "add") if added is not None else None
    if summed is None or len(summed[0]) != 2:
        return None
    a, b = summed[0]
    if program.element(a) == index:
        return program.constant(b)
    if program.element(b) == index:
        return program.constant(a)
    return None


def _trips(start: int, step: int, bound: int, way: str) -> int | None:
    """Trips of `for (i = start; i <way> bound; i += step)`."""
    if way in ("LT", "LE") and step > 0:
        end = bound + (1 if way == "LE" else 0)
        return max(0, math.ceil((end - start) / step))
    if way in ("GT", "GE") and step < 0:
        end = bound - (1 if way == "GE" else 0)
        return max(0, math.ceil((start - end) / -step))
    if way == "NE" and step and (bound - start) % step == 0 and (bound - start) / step >= 0:
        return (bound - start) // step
    return None


def calls(program: Program, as_walked: bool = False, unknown: str | None = None) -> dict[str, int | None]:
    """Computation -> times one run of the program enters it (the entry once; a loop's body its trips
    times, its condition once more; what they call as often; None: inside a loop of unknown length).
    A computation reached from several places counts every place. `as_walked`: the times XLA's cost
    analysis counts it instead, which walks every loop's body and condition once. `unknown`: what a
    loop of unknown length counts as: "trip" one trip (the calls per trip of it, as its FLOPs are
    counted), "bound" the most trips its condition allows (`trip_bound`; None where it has none)."""
    edges: dict[str, list[tuple[str, int | None]]] = {}
    for ins in program.read:
        out = edges.setdefault(ins.computation, [])
        if ins.op == "while":
            trips = 1 if as_walked else trip_count(ins, program)
            if trips is None and unknown is not None:
                trips = 1 if unknown == "trip" else trip_bound(ins, program)
            body, condition = BODY.search(ins.line), CONDITION.search(ins.line)
            if body:
                out.append((body.group(1), trips))
            if condition:
                out.append((condition.group(1), 1 if as_walked else None if trips is None else trips + 1))
            continue
        for callee in _CALLS.findall(ins.line):
            out.append((callee, 1))
        branches = _BRANCHES.search(ins.line)
        if branches:  # a cond runs one branch; counted as if each ran (an upper bound)
            out.extend((name.strip().lstrip("%"), 1) for name in branches.group(1).split(",") if name.strip())
    counts: dict[str, int | None] = {}
    order = _callers_first(edges, program.entry)
    if program.entry is None:
        return counts
    counts[program.entry] = 1
    for parent in order:
        if parent not in counts:
            continue
        for child, trips in edges.get(parent, []):
            here = None if counts[parent] is None or trips is None else counts[parent] * trips
            if child not in counts:
                counts[child] = here
            else:
                counts[child] = None if counts[child] is None or here is None else counts[child] + here
    return counts


def _callers_first(edges: dict[str, list], entry: str | None) -> list[str]:
    """Computations reachable from the entry, each after every computation that calls it."""
    seen, order = set(), []

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for child, _ in edges.get(name, []):
            visit(child)
        order.append(name)

    if entry is not None:
        visit(entry)
    return order[::-1]


def calls_text(count: int | None, backward: bool = False, per_trip: int | None = None,
               at_most: int | None = None) -> str:
    """How a collective's calls per run (and its pass) read after its groups ("" for once, forward).
    In a loop XLA cannot bound: its calls per trip of that loop, and the most per run where the loop's
    condition bounds it."""
    where = ", in the backward pass" if backward else ""
    if count is None:
        times = "once" if (per_trip or 1) == 1 else f"{per_trip:,} times"
        most = f" (at most {at_most:,} times a step: its condition bounds the loop)" if at_most is not None else ""
        return where + f", {times} per trip of a loop XLA cannot bound{most}"
    if count == 0:
        return where + ", in a loop of no trips (never runs)"
    return where + (f", {count:,} times (in a loop)" if count > 1 else "")
