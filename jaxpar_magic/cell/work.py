"""FLOPs and bytes accessed of every loop trip, which XLA's cost analysis counts once.

`compiled.cost_analysis()` (XLA's HloCostAnalysis) walks a while loop's body once, whatever its trip
count, so a `lax.scan` over 8 layers reports one layer's FLOPs. `loop_work(program)` reads the
program's work twice, as it runs (every loop its trip count times, cell/loops.py) and as the
analysis walks it (every loop once), and returns the difference: what the analysis left out. Work is
counted as HloCostAnalysis counts it: a dot or convolution 2 FLOPs per multiply-add (a convolution's
taps on padding left out), an elementwise operation one per element (transcendentals none: XLA
counts those apart), a reduction one per element folded, an all-reduce one per element, a conditional
its largest branch (XLA's hlo_cost_analysis.cc, read for these rules); bytes
are each unfused instruction's operands and result. Added to the analysis' figures, it gives the
figures of the loop unrolled (tests/test_loop_census.py checks them against the same program written
as a Python for-loop).

Plain Python over the program text.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .hlo_text import ARRAY, ints, type_bytes
from .loops import BODY, CONDITION, Program, trip_count

_ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "compare", "select", "and", "or", "xor",
    "not", "negate", "abs", "sign", "floor", "ceil", "round-nearest-even", "round-nearest-afz", "clamp",
    "remainder", "convert", "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt", "is-finite",
    "real", "imag", "complex", "stochastic-convert",
}
_NO_BYTES = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
             "after-all", "partition-id", "replica-id", "add-dependency", "opt-barrier"}
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_CONV_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"\bwindow=\{([^}]*)\}")
_TO_APPLY = re.compile(r"\bto_apply=%?([\w.\-]+)")


@dataclass(frozen=True)
class LoopWork:
    flops: float  # FLOPs of the loop trips after the first, which cost_analysis leaves out
    bytes: float  # bytes accessed by those trips
    unknown: bool  # some loop's length is unknown: its body is counted once, as XLA does


def _elements(type_text: str) -> int:
    arrays = ARRAY.findall(type_text)
    return sum(math.prod(ints(dims) or [1]) for _, dims in arrays)


def _flops(ins, program: Program) -> float:
    if ins.op in _ELEMENTWISE:
        return float(_elements(ins.type))
    out = _elements(ins.type)
    operand = program.by_name.get(ins.operands[0]) if ins.operands else None
    if ins.op == "dot" and operand is not None:
        lhs = ARRAY.findall(operand.type)
        dims = ints(lhs[0][1]) if lhs else []
        contracting = _CONTRACTING.search(ins.line)
        k = math.prod(dims[i] for i in ints(contracting.group(1)) if i < len(dims)) if contracting else 1
        return 2.0 * out * k
    if ins.op == "convolution" and len(ins.operands) > 1:
        return _convolution_flops(ins, operand, program.by_name.get(ins.operands[1]))
    if ins.op in ("all-reduce", "all-reduce-start"):  # HloCostAnalysis: one FLOP per element of its result
        return float(out)
    if ins.op == "sort" and operand is not None:
        n = _elements(operand.type)
        return float(n * math.ceil(math.log2(n))) if n > 1 else 0.0
    if ins.op in ("reduce", "reduce-window") and operand is not None:
        folded = _elements(operand.type) - out if ins.op == "reduce" else out
        return float(max(folded, 0))
    return 0.0


def _convolution_flops(ins, lhs, rhs) -> float:
    """2 FLOPs per multiply-add of a convolution, counting only the kernel taps that fall on the
    input and not on its padding (as HloCostAnalysis does; XLA:TPU's windowed einsums pad)."""
    labels = _CONV_LABELS.search(ins.line)
    if lhs is None or rhs is None or labels is None:
        return 0.0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs_dims, rhs_dims = ints(ARRAY.findall(lhs.type)[0][1]), ints(ARRAY.findall(rhs.type)[0][1])
    out_dims = ints(ARRAY.findall(ins.type)[0][1])
    if not (len(lhs_dims) == len(lhs_labels) and len(rhs_dims) == len(rhs_labels) == len(out_labels) == len(out_dims)):
        return 0.0
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    window = _window(ins.line, len(spatial))
    taps = 1
    for d, label in enumerate(spatial):
        n, m = lhs_dims[lhs_labels.index(label)], out_dims[out_labels.index(label)]
        k = rhs_dims[rhs_labels.index(label)]
        stride, (low, _), lhs_dilate, rhs_dilate = (w[d] for w in window)
        last = (n - 1) * lhs_dilate
        taps *= sum(1 for o in range(m) for j in range(k)
                    if 0 <= o * stride - low + j * rhs_dilate <= last and (o * stride - low + j * rhs_dilate) % lhs_dilate == 0)
    batch_and_features = out_dims[out_labels.index("b")] * out_dims[out_labels.index("f")]
    return 2.0 * batch_and_features * rhs_dims[rhs_labels.index("i")] * taps


def _window(line: str, rank: int) -> tuple[list, list, list, list]:
    """Per spatial dimension: stride, (low, high) padding, lhs and rhs dilation (`window={...}`)."""
    found = _WINDOW.search(line)
    fields = dict(re.findall(r"(\w+)=([\w\-]+)", found.group(1))) if found else {}

    def each(key: str, default):
        text = fields.get(key)
        return [int(v) for v in text.split("x")] if text else [default] * rank

    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else [(0, 0)] * rank
    return each("stride", 1), pads, each("lhs_dilate", 1), each("rhs_dilate", 1)


def _bytes(ins, program: Program) -> float:
    if ins.op in _NO_BYTES:
        return 0.0
    operands = sum(type_bytes(program.by_name[o].type) for o in ins.operands if o in program.by_name)
    return float(operands + type_bytes(ins.type))


def loop_work(text: str, read: list | None = None, program: Program | None = None) -> LoopWork:
    """The FLOPs and bytes of the loop trips cost_analysis does not count (zero without loops).

    Both figures are read as HloCostAnalysis reads the program, recursively: a fusion or call adds its
    computation's work, a conditional the largest of its branches', a while loop its body's and its
    condition's, once as the analysis walks it and trip-count times as the program runs."""
    if " while(" not in text:
        return LoopWork(0.0, 0.0, False)
    program = program or Program(text, read)
    if program.entry is None:
        return LoopWork(0.0, 0.0, False)
    unknown: list[bool] = []
    runs = _Work(program, walked=False, unknown=unknown).of(program.entry)
    walked = _Work(program, walked=True, unknown=[]).of(program.entry)
    return LoopWork(runs[0] - walked[0], runs[1] - walked[1], bool(unknown))


class _Work:
    """(FLOPs, bytes) of a computation and everything it runs, each computation read once."""

    def __init__(self, program: Program, walked: bool, unknown: list):
        self.program, self.walked, self.unknown = program, walked, unknown
        self.done: dict[str, tuple[float, float]] = {}

    def of(self, computation: str, fused: bool = False) -> tuple[float, float]:
        key = computation + ("/fused" if fused else "")
        if key not in self.done:
            self.done[key] = (0.0, 0.0)  # a cycle cannot occur in HLO; this only guards the recursion
            self.done[key] = self._read(computation, fused)
        return self.done[key]

    def _read(self, computation: str, fused: bool) -> tuple[float, float]:
        program = self.program
        flops = moved = 0.0
        for ins in program.bodies.get(computation, []):
            flops += _flops(ins, program)
            if not fused:  # a fusion's traffic is its caller's operands and result
                moved += _bytes(ins, program)
            if ins.op == "fusion" and ins.callee:
                inner = self.of(ins.callee, fused=True)
                flops += inner[0]
            elif ins.op == "call" and (callee := _TO_APPLY.search(ins.line)):
                inner = self.of(callee.group(1), fused)
                flops, moved = flops + inner[0], moved + inner[1]
            elif ins.op == "conditional":
                branches = [self.of(name, fused) for name in _branches(ins.line)]
                if branches:
                    flops += max(b[0] for b in branches)
                    moved += max(b[1] for b in branches)
            elif ins.op == "while":
                trips = 1 if self.walked else trip_count(ins, program)
                if trips is None:
                    self.unknown.append(ins.name)
                    trips = 1
                parts = [self.of(m.group(1), fused) for m in (BODY.search(ins.line), CONDITION.search(ins.line)) if m]
                flops += trips * sum(p[0] for p in parts)
                moved += trips * sum(p[1] for p in parts)
        return flops, moved


def _branches(line: str) -> list[str]:
    listed = re.search(r"\bbranch_computations=\{([^}]*)\}", line)
    if listed:
        return [name.strip().lstrip("%") for name in listed.group(1).split(",") if name.strip()]
    return re.findall(r"\b(?:true|false)_computation=%?([\w.\-]+)", line)
