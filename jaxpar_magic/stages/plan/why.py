"""Why each collective is in the compiled program, in the program's own terms, and what XLA's SPMD
partitioner said about the layouts it could not reach.

A collective's reason (`reason`) is read from its instruction: the JAX operation it was made for (JAX's
op name in its metadata: `dot_general`, `reduce_sum`, or a collective the cell asks for itself: `psum`,
`all_gather`, ...), the line that operation is on, the value it moves (traced back to the argument it
is a copy or view of: `x`), and the layout change its kind and `dimensions` say: an all-gather along
dimension 0 over 'data' means the operation needs dimension 0 whole where it is split over 'data'; an
all-reduce or a reduce-scatter sums the partial sums an operation leaves on each device when it
contracts or reduces a dimension split over the group's axes.

The partitioner's warnings ("[SPMD] Involuntary full rematerialization. The compiler cannot go from
sharding {devices=[8,1]<=[8]} to {devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate} efficiently for
HLO operation %param = ... metadata={op_name="args[0][0]"}"), which XLA logs while compiling
(stages/plan/native_stderr.py keeps them), become rows of the plan (`partitioner_rows`): which value,
from which layout to which, written as PartitionSpecs over the mesh's axes where the devices say so.

Plain Python over the program text; numpy for the device orders.
"""
from __future__ import annotations

import re

from .buffer_roles import THROUGH
from .peak import short_op

# JAX's names for the collectives a cell writes itself (shard_map, pmap): the cell asks for these.
ASKED = {"psum", "pmax", "pmin", "pmean", "all_gather", "reduce_scatter", "psum_scatter", "ppermute", "all_to_all",
         "pbroadcast", "psum_invariant", "all_gather_invariant", "pshuffle", "pswapaxes"}
# Operations that only order a layout: the cell's own layout (with_sharding_constraint, --out, reshard).
ORDERED = {"sharding_constraint", "reshard", "device_put", "mesh_cast", "sharding_cast"}


class _Program:
    """The instructions by name, the arguments' labels, and who calls each fused computation."""

    def __init__(self, instructions: list, labels: dict):
        self.by_name = {i.name: i for i in instructions}
        self.parameters = labels
        self.callers: dict = {}
        for i in instructions:
            if i.callee:
                self.callers.setdefault(i.callee, []).append(i)

    def argument_behind(self, name: str) -> str | None:
        """The argument a value is a copy, view, conversion or gather of (through the fusions XLA:TPU wraps
        an async collective in: a fused computation's parameter read as its caller's operand)."""
        for _ in range(24):
            ins = self.by_name.get(name)
            if ins is None:
                return None
            if ins.op == "parameter":
                if ins.name in self.parameters:
                    return self.parameters[ins.name]
                callers = self.callers.get(ins.computation, [])
                number = re.search(r"parameter\((\d+)\)", ins.line)
                if len(callers) != 1 or number is None or int(number.group(1)) >= len(callers[0].operands):
                    return None
                name = callers[0].operands[int(number.group(1))]
                continue
            if ins.op not in THROUGH and not ins.op.startswith("all-gather") or not ins.operands:
                return None
            name = ins.operands[0]
        return None


def _axes(axes) -> str:
    return " x ".join(repr(a) for a in axes) if axes else "the group"


def reason(c, planned, program: _Program | None) -> dict | None:
    """Why collective `c` (cell/hlo.Collective) is there, as the plan's row (`planned`) says where: the
    op, whether the cell asks for it, the value it moves, the layout before and the layout needed, and
    a sentence. None where the program names no operation for it."""
    op = short_op(c.op_name)
    if op is None or c.over_dcn:
        return None
    op = op.removesuffix("_invariant")  # JAX 0.10's psum_invariant, all_gather_invariant: the user wrote psum
    operand = program.argument_behind(c.operand) if program is not None and c.operand else None
    kind = planned.op
    axes = _axes(planned.axes)
    dim = c.dimensions[0] if c.dimensions else None
    who = f"{operand}'s " if operand else ""
    at = _at(planned)
    pass_ = "the backward pass's " if c.backward else ""
    summed = planned.reduction or "sum"
    if op in ASKED:
        before, needed = _moves(kind, dim, axes, summed)
        text = f"the cell asks for it: {op}{at}"
        return {"op": op, "asked": True, "operand": operand, "before": before, "needed": needed, "text": text}
    if op in ORDERED:
        before, needed = _moves(kind, dim, axes, summed)
        text = f"the cell orders this layout ({op}{at}): {who or 'the value'} goes from {before} to {needed}"
        return {"op": op, "asked": True, "operand": operand, "before": before, "needed": needed, "text": text}
    before, needed = _moves(kind, dim, axes, summed)
    if kind == "all-gather":
        text = f"{pass_}{op}{at} needs {who}{'dimension ' + str(dim) if dim is not None else 'value'} whole; it is split over {axes}"
    elif kind in ("all-reduce", "reduce-scatter"):
        how = "contracts or reduces a dimension split" if summed == "sum" else f"takes a {summed} over a dimension split"
        keep = f", and each device keeps its part of dimension {dim}" if kind == "reduce-scatter" and dim is not None else ""
        text = f"{pass_}{op}{at} {how} over {axes}: each device holds a partial {summed}, combined here{keep}"
    elif kind == "all-to-all":
        text = (f"{pass_}{op}{at} needs {who}split along another dimension than it is: blocks of dimension "
                f"{dim if dim is not None else '?'} are exchanged over {axes}")
    else:
        text = f"{pass_}{op}{at} needs {who}data a neighbour along {axes} holds"
    return {"op": op, "asked": False, "operand": operand, "before": before, "needed": needed, "text": text}


def _at(planned) -> str:
    """` at line 26 of In[1], in block()` (the line inside a function the cell calls), or the cell's line."""
    o = planned.origin
    if o and o.get("line") is not None:
        inside = f", in {o['function']}()" if o.get("function") else ""
        return f" at line {o['line']} of {o.get('cell')}{inside}"
    return f" at line {planned.line}" if planned.line is not None else ""


def _moves(kind: str, dim, axes: str, summed: str) -> tuple[str, str]:
    """(layout before, layout needed) in words, from the collective's kind and dimension."""
    along = f"dimension {dim}" if dim is not None else "a dimension"
    if kind == "all-gather":
        return f"{along} split over {axes}", f"{along} whole"
    if kind == "reduce-scatter":
        return f"partial {summed}s over {axes}", f"the {summed}, {along} split over {axes}"
    if kind == "all-reduce":
        return f"partial {summed}s over {axes}", f"the {summed} on every device"
    if kind == "all-to-all":
        return f"split over {axes} along another dimension", f"{along} split over {axes}"
    return f"blocks on devices along {axes}", "each block on its neighbour"


def reasons(found: list, planned: list, instructions: list, labels: dict) -> list:
    """The planned collectives with `why` filled in (same order as `found`, plan_collectives' input)."""
    from dataclasses import replace

    program = _Program(instructions, labels)
    return [replace(p, why=reason(c, p, program)) for c, p in zip(found, planned)]


# --- the partitioner's warnings ---------------------------------------------------------------------

_INVOLUNTARY = re.compile(
    r"(?P<what>Involuntary full rematerialization)\. The compiler cannot go from sharding (?P<src>\{.*?\}) to "
    r"(?P<dst>\{.*?\}) efficiently for HLO operation (?P<operation>%[\w.\-]+ = \S+ [\w\-]+)\(")
_META = re.compile(r'metadata=\{[^}]*?op_name="(?P<op_name>(?:[^"\\]|\\.)*)"(?:[^}]*?source_file="(?P<file>[^"]*)")?'
                   r'(?:[^}]*?source_line=(?P<line>\d+))?')
_ARG = re.compile(r"^args\[(\d+)\]\[(\d+)\]$")
_TILES = re.compile(r"devices=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_LISTED = re.compile(r"devices=\[([\d,]+)\]([\d,]+)")


def partitioner_rows(said, mesh, leaf_labels=None, filename: str | None = None, line_text=None) -> list[dict]:
    """XLA's partitioner warnings as the plan's rows: {"what", "name", "from", "to", "line", "source",
    "text", "said"}; lines it logged that this does not read are kept whole ("said")."""
    rows = []
    for line in said or ():
        m = _INVOLUNTARY.search(line)
        if m is None:
            if "[SPMD]" in line:
                said_text = line.split("] ", 1)[-1].strip()
                rows.append({"what": "partitioner", "name": None, "from": None, "to": None, "line": None,
                             "source": None, "text": f"XLA's partitioner: {said_text}", "said": said_text})
            continue
        meta = _META.search(line[m.end():])
        op_name = meta.group("op_name").replace("\\'", "'") if meta else None
        name = _label(op_name, leaf_labels)
        source_line = int(meta.group("line")) if meta and meta.group("line") and meta.group("file") == filename else None
        source = (line_text(source_line) if line_text is not None else None) if source_line is not None else None
        src, dst = spec_words(m.group("src"), mesh), spec_words(m.group("dst"), mesh)
        what = name or short_op(op_name) or m.group("operation").split(" = ")[0]
        text = (f"XLA's partitioner cannot go from {src} to {dst} for {what} efficiently: it replicates {what} "
                f"whole on every device, then keeps each device's part (an involuntary full rematerialization)")
        rows.append({"what": "rematerialization", "name": name, "from": src, "to": dst, "line": source_line,
                     "source": source.strip() if source else None, "text": text,
                     "said": line.split("] ", 1)[-1].strip()})
    return rows


def _label(op_name: str | None, leaf_labels) -> str | None:
    """An argument's label (`xb`, `params['w1']`) from JAX's op name for it (`args[0][1]`, or its path)."""
    if not op_name:
        return None
    m = _ARG.match(op_name)
    if m and leaf_labels is not None:
        i, j = int(m.group(1)), int(m.group(2))
        if i < len(leaf_labels) and j < len(leaf_labels[i]):
            return leaf_labels[i][j]
    return None if "/" in op_name else op_name


def spec_words(sharding: str, mesh) -> str:
    """An HLO sharding (`{devices=[8,1]<=[8]}`) as a PartitionSpec over `mesh`'s axes where the device
    order says which (`P(('data', 'model'), None)`), else in pieces per dimension; the text as it is
    where neither reads."""
    import numpy as np

    if "replicated" in sharding and "devices=" not in sharding:
        return "P() (whole on every device)"
    tiles = _TILES.search(sharding)
    listed = _LISTED.search(sharding) if tiles is None else None
    if tiles is None and listed is None:
        return sharding
    dims = [int(t) for t in (tiles or listed).group(1).split(",")]
    total = int(np.prod(dims))
    if tiles is not None:
        reshape = [int(t) for t in tiles.group(2).split(",")]
        ids = np.arange(int(np.prod(reshape))).reshape(reshape)
        if tiles.group(3):
            ids = ids.transpose([int(t) for t in tiles.group(3).split(",")])
    else:
        ids = np.array([int(t) for t in listed.group(2).split(",")])
    if ids.size != total:
        return sharding
    ids = ids.reshape(dims)
    replicated = "last_tile_dim_replicate" in sharding
    data_dims = dims[:-1] if replicated else dims
    shape, names = tuple(mesh.devices.shape), [str(n) for n in mesh.axis_names]
    entries = []
    for k, size in enumerate(data_dims):
        if size == 1:
            entries.append("None")
            continue
        index = [0] * len(dims)
        line_ids = []
        for i in range(size):
            index[k] = i
            line_ids.append(int(ids[tuple(index)]))
        axes = _varying(line_ids, shape, names)
        entries.append(repr(axes[0]) if len(axes) == 1 else f"({', '.join(repr(a) for a in axes)})" if axes
                       else f"{size} pieces")
    while entries and entries[-1] == "None":
        entries.pop()
    spec = f"P({', '.join(entries)})"
    if replicated and dims[-1] > 1:
        spec += f" with {dims[-1]} copies of each part"
    return spec


def _varying(positions: list[int], shape: tuple, names: list[str]) -> list[str]:
    import numpy as np

    if not shape or max(positions) >= int(np.prod(shape)):
        return []
    coords = np.array(np.unravel_index(np.asarray(positions), shape)).reshape(len(shape), -1)
    return [names[i] for i in range(len(shape)) if coords[i].min() != coords[i].max()]
