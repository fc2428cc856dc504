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
- "compiler's scratch": a custom-call with no line of the user's (XLA:TPU's windowed einsums).
Buffers past the largest are grouped by what they are and their line (`group`), and a group is a row
of its own while the rest ("other") would hold more than OTHER_SHARE of the peak.

Plain Python; no JAX.
"""
from __future__ import annotations

from dataclasses import replace

OTHER_SHARE = 0.10  # "other" never holds more than this share of the peak
MAX_GROUPS = 6  # grouped rows shown at least (more while "other" is too large)
_THROUGH = ("copy", "copy-start", "copy-done", "bitcast", "get-tuple-element", "convert", "fusion", "reshape",
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
        if ins.op not in _THROUGH and not ins.op.startswith("all-gather") or not ins.operands:
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
