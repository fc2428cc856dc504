"""The program's own dtypes, read beside XLA:CPU's: what it widens from bf16/f16 to f32 (`upcasts`,
and a collective's shape in the program's dtypes, `program_shape`), each operation's floating dtype
before XLA's passes (`program_types`), and the matmuls' FLOPs by the rate class they run at
(`matmul_flops`). Plain Python over the program text (cell/hlo_text.py's records)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .hlo_text import ARRAY as _ARRAY, DTYPE_BYTES as _DTYPE_BYTES, COLLECTIVE_OPS as OPS, Instruction as _Instruction
from .hlo_text import array_bytes as _array_bytes, instructions as _instructions, ints as _ints, type_bytes as _type_bytes
from .loops import Program, calls

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
