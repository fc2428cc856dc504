"""A pipeline's bubble, where the compiled program shows one: a loop of T ticks that passes blocks along a
mesh axis of S stages (a collective-permute over that one axis, every tick) and slices its microbatches out
of an array of M < T of them, with T = M + S - 1 (the GPipe schedule: the first and last S - 1 ticks leave
stages idle), or T = 2 (M + S - 1) for a schedule that runs the backward passes in the same loop (GPipe's
or 1F1B's). Each stage then idles S - 1 ticks a pass: (S - 1) / (M + S - 1) of the step is bubble (the
training chapter's pipeline, scanned: 3 of 11 ticks for 8 microbatches over 4 stages).

Plain Python over the program's instructions (cell/hlo_text.py) and its planned collectives.
"""
from __future__ import annotations

from ...cell.hlo_text import ARRAY, ints
from ...cell.loops import BODY, Program, trip_count

_SLICES = ("dynamic-slice", "dynamic-update-slice")


def _callees(program: Program, computation: str) -> list[str]:
    """The computation and the fused computations (and calls) it runs, not the loops inside it."""
    seen, order = set(), [computation]
    while order:
        name = order.pop()
        if name in seen:
            continue
        seen.add(name)
        order += [i.callee for i in program.bodies.get(name, []) if i.callee and i.op in ("fusion", "call")]
    return list(seen)


def _leading_dims(program: Program, computations: list[str]) -> set[int]:
    """Leading dimensions of the arrays the loop body slices or updates a slice of."""
    dims = set()
    for name in computations:
        for ins in program.bodies.get(name, []):
            if ins.op not in _SLICES or not ins.operands:
                continue
            operand = program.by_name.get(ins.operands[0])
            arrays = ARRAY.findall(operand.type) if operand is not None else []
            shape = ints(arrays[0][1]) if arrays else []
            if len(shape) > 1:  # an array of blocks, not a vector of indices
                dims.add(shape[0])
    return dims


def bubble(read: list, found: list, planned: list, sizes: dict, filename: str | None = None) -> dict | None:
    """{"ticks", "microbatches", "stages", "axis", "bubble", "fraction", "line"} of the first pipelined loop,
    or None. `found` and `planned` the program's collectives (cell/hlo.Collective and the plan's rows,
    in the same order); `sizes` the mesh's axes."""
    permutes = [(c, p) for c, p in zip(found, planned) if p.op == "collective-permute" and len(p.axes) == 1]
    if not permutes:
        return None
    program = Program("", read)
    for loop in (i for i in read if i.op == "while"):
        body = BODY.search(loop.line)
        ticks = trip_count(loop, program)
        if body is None or not ticks:
            continue
        inside = [p for c, p in permutes if c.computation == body.group(1)]
        if not inside:
            continue
        axis = inside[0].axes[0]
        stages = int(sizes.get(axis, 1))
        if stages < 2:
            continue
        dims = _leading_dims(program, _callees(program, body.group(1)))
        for passes in (1, 2):  # forward only; forward and backward in one loop
            microbatches = ticks // passes - stages + 1
            if ticks % passes or microbatches < 1 or microbatches not in dims:
                continue
            line = next((n for f, n, _ in loop.frames if f == filename), None) if filename else None
            return {"ticks": ticks, "microbatches": microbatches, "stages": stages, "axis": axis, "passes": passes,
                    "bubble": passes * (stages - 1), "fraction": (stages - 1) / (microbatches + stages - 1),
                    "line": line}
    return None
