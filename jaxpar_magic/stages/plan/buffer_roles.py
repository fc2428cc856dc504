"""What a buffer at the peak is, in a researcher's words, and the smaller ones grouped so none hides.

A temporary is named by what it is for, from the compiled program alone (its op, JAX's op name, the
entry parameters behind it):
- "copy of params['w1']": a copy of an argument (XLA:TPU moves or re-lays out some);
- "all-gather of params['w1']": an all-gather whose operand chain reaches an entry parameter;
- "gradient of params['w1']": a value of the backward pass (JAX names it `transpose(jvp(...))`) with the
  shape and dtype of exactly one argument leaf; "gradient summed across devices": its all-reduce or
  reduce-scatter;
- "backward-pass temporary": another value of the backward pass;
- "activation saved for the backward pass": a forward value still live at a peak inside the backward pass;
- "compiler's scratch": a custom-call with no line of the user's (XLA:TPU's windowed einsums);
- "activation saved for the backward pass, stacked over 8 trips": a forward loop's (a scan's) result that
  its body writes one slice a trip (`loop_stack`), named by the line of what the body writes;
- "XLA:CPU's f32 copy of ...": a value XLA:CPU widened from the program's bf16 or f16.
Buffers past the largest are grouped by what they are and their line (`group`), and a group is a row
of its own while the rest ("other") would hold more than OTHER_SHARE of the peak.

Plain Python; no JAX.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ...cell.hlo_text import ARRAY
from ...cell.loops import BODY, Program, trip_count

OTHER_SHARE = 0.10  # "other" never holds more than this share of the peak
MAX_GROUPS = 6  # grouped rows shown at least (more while "other" is too large)
THROUGH = ("copy", "copy-start", "copy-done", "bitcast", "get-tuple-element", "convert", "fusion", "reshape",
            "transpose", "dynamic-slice", "slice", "all-gather-start", "all-gather-done", "async-start", "async-done")


def is_backward(op_name: str | None) -> bool:
    return bool(op_name) and "transpose(" in op_name


def parameter_behind(sources, name: str, depth: int = 12) -> str | None:
    """The label of the entry parameter a value is a view, copy or gather of (first operands followed)."""
    ins = sources.by_name.get(name)
    for _ in range(depth):
        if ins is None:
            return None
        if ins.op == "parameter":
            return sources.parameters.get(ins.name)
        if ins.op not in THROUGH and not ins.op.startswith("all-gather") or not ins.operands:
            return None
        ins = sources.by_name.get(ins.operands[0])
    return None


def role_of(sources, producer: str, dtype_shape: tuple, argument_shapes: dict, peak_in_backward: bool) -> str | None:
    """A temporary's role (module docstring), or None where the program does not say."""
    ins = sources.by_name.get(producer)
    if ins is None:
        return None
    if ins.op == "parameter":  # the value is a copy of an argument (XLA moved or re-laid it out)
        return f"copy of {sources.parameters.get(ins.name, 'an argument')}"
    if ins.op.startswith("all-gather"):
        behind = parameter_behind(sources, ins.operands[0]) if ins.operands else None
        return f"all-gather of {behind}" if behind else "all-gather"
    keyed = sources.keyed(producer)
    if keyed is not None and keyed.op == "parameter" and keyed.name in sources.parameters:  # converted, re-laid out
        return f"copy of {sources.parameters[keyed.name]}"
    op_name = keyed.op_name if keyed is not None else None
    if ins.op == "custom-call" and (keyed is None or not keyed.frames):
        return "compiler's scratch"
    if is_backward(op_name) and ins.op.startswith(("all-reduce", "reduce-scatter")):
        return f"gradient summed across devices ({ins.op.removesuffix('-start').removesuffix('-done')})"
    if is_backward(op_name):
        same = argument_shapes.get(dtype_shape, [])
        return f"gradient of {same[0]}" if len(same) == 1 else "backward-pass temporary"
    if op_name and peak_in_backward:
        return "activation saved for the backward pass"
    return None


_ELEMENT = re.compile(r"\bindex=(\d+)")
_MOVES_ONLY = ("copy", "copy-start", "copy-done", "bitcast", "convert", "fusion", "get-tuple-element")


def _dims(type_text: str) -> str | None:
    found = ARRAY.findall(type_text)
    return found[0][1] if len(found) == 1 else None


def loop_stack(sources, name: str, index: str) -> tuple[int, str | None, str] | None:
    """(trips, the value the body writes each trip (None: inside a multi-output fusion), the while) where
    a value is a while loop's result stacked over its trips (a scan's saved activations: a slice a trip,
    dynamic-update-slice'd into a tuple element of the loop's state), or a copy or conversion of one
    (XLA:CPU's f32 copy); None otherwise."""
    ins = sources.by_name.get(name)
    element = int(index.strip("{}").split(",")[0]) if index.strip("{}") else None
    for _ in range(8):
        if ins is None or ins.op == "while":
            break
        if ins.op not in _MOVES_ONLY or len(ins.operands) != 1:
            return None
        if ins.op == "get-tuple-element":
            found = _ELEMENT.search(ins.line)
            element = int(found.group(1)) if found else None
        else:
            source = sources.by_name.get(ins.operands[0])
            if source is None or _dims(source.type) != _dims(ins.type):  # it moves or converts, computes nothing
                return None
        ins = sources.by_name.get(ins.operands[0])
    body = BODY.search(ins.line) if ins is not None and ins.op == "while" else None
    root = sources.roots.get(body.group(1)) if body else None
    if root is None or root.op != "tuple" or element is None or element >= len(root.operands):
        return None
    written = sources.by_name.get(root.operands[element])
    if written is None:
        return None
    if written.op == "dynamic-update-slice" and len(written.operands) > 1:
        update = written.operands[1]
    elif written.op == "fusion" and _updates_a_slice(sources, written):
        slices = [o for o in written.operands[1:] if o in sources.by_name
                  and _dims(sources.by_name[o].type) not in ("", None, _dims(written.type))]
        if not slices:
            return None
        update = slices[0]
    elif written.op == "get-tuple-element" and written.operands and _updates_a_slice(
            sources, sources.by_name.get(written.operands[0])):
        update = None  # XLA:TPU writes several stacks in one multi-output fusion: the body's line names it
    else:
        return None
    if sources.program is None:
        sources.program = Program("", list(sources.by_name.values()))
    trips = trip_count(ins, sources.program)
    stacked = _dims(written.type)
    if not trips or not stacked or stacked.split(",")[0] != str(trips):
        return None
    return trips, update, ins.name


def _updates_a_slice(sources, fusion) -> bool:
    """A fusion that writes one slice into an array: a dynamic-update-slice among its operations (XLA:CPU
    also names the fusion after it; XLA:TPU fuses it with the work that computes the slice)."""
    if fusion is None or fusion.op != "fusion":
        return False
    named = "dynamic-update-slice" in (fusion.name + (fusion.op_name or "")).replace("_", "-")
    return named or "dynamic-update-slice" in sources.ops.get(fusion.callee, ())


def stack_role(trips: int, forward: bool, in_backward: bool, role: str | None) -> str | None:
    """The role of a loop's stacked result: a forward loop's, read by the backward pass, is what it saved."""
    if forward and in_backward:
        return f"activation saved for the backward pass, stacked over {trips:,} trips"
    if forward:
        return f"stacked over {trips:,} trips of a loop"
    return f"{role}, stacked over {trips:,} trips" if role else f"backward-pass values stacked over {trips:,} trips"


def group(rows: list, keep: int, reported: int) -> tuple[list, list]:
    """(rows shown, rows left as "other"): the `keep` largest, then the rest grouped by what they are and
    their line, each group a row (count > 1) while what is left would exceed OTHER_SHARE of `reported`."""
    shown, rest = rows[:keep], rows[keep:]
    groups: dict[tuple, list] = {}
    for r in rest:
        groups.setdefault((r.kind, r.role, r.op if r.kind == "temporary" else None, r.line, r.source,
                           repr(r.origin)), []).append(r)
    merged = sorted((_merged(members) for members in groups.values()), key=lambda r: -r.bytes)
    left = sum(r.bytes for r in merged)
    taken = 0
    for r in merged:
        if taken >= MAX_GROUPS and left <= OTHER_SHARE * max(reported, 1):
            break
        shown.append(r)
        left -= r.bytes
        taken += 1
    others = [m for r in merged[taken:] for m in r.members]
    return shown, others


def _merged(members: list):
    first = members[0]
    if len(members) == 1:
        return replace(first, members=(first,))
    dtypes = {m.dtype for m in members}
    return replace(first, bytes=sum(m.bytes for m in members), count=len(members), shape=(),
                   dtype=dtypes.pop() if len(dtypes) == 1 else "mixed", instruction="",
                   name=first.name if first.kind == "temporary" else None, members=tuple(members))
