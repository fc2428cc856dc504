"""Host side of the collectives recorder: turn the recorded `Site`s and their records (NumPy arrays
fetched from the devices) into the `cards` of the collectives view (jpm_schemas.md section 1):
the values each device passed in and got back, the movement, the bytes; `collectives_state` wraps
them into the whole view state.
"""
from __future__ import annotations

import linecache
import math
from typing import Callable, Sequence

from .movement import KIND, MAX_DEVICES_DRAWN, axis_index_order, estimated_bytes, groups_of, movement
from .sites import MAX_CARDS, Site, is_library_file

TEXT_VALUES = 8  # values written in a tile's text

#: The compiled (XLA) collective each movement kind becomes, to put its bytes beside our estimate.
_XLA_OP = {"all-reduce": "all-reduce", "all-gather": "all-gather", "reduce-scatter": "reduce-scatter",
           "all-to-all": "all-to-all", "permute": "collective-permute"}


def _np_dtype(dtype):
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with NumPy; JAX needs it)
    import numpy as np

    return np.dtype(dtype)


def short_dtype(dtype) -> str:
    """XLA's short spelling of a dtype: f32, bf16, s32, u8, pred, c64."""
    d = _np_dtype(dtype)
    if d == bool:
        return "pred"
    if d.name == "bfloat16":
        return "bf16"
    if d.name.startswith("float8"):
        return "f8" + d.name[len("float8_"):]
    bits = d.itemsize * 8
    return {"f": f"f{bits}", "i": f"s{bits}", "u": f"u{bits}", "c": f"c{bits}"}.get(d.kind, d.name)


def shape_text(shape, dtype) -> str | None:
    if shape is None or dtype is None:
        return None
    return f"{short_dtype(dtype)}[{','.join(str(n) for n in shape)}]"


def _number(v):
    """A JSON number (None for NaN and infinities, which JSON cannot carry)."""
    if isinstance(v, complex):
        v = v.real
    if isinstance(v, (bool, int)):
        return int(v)
    v = float(v)
    return v if math.isfinite(v) else None


def _tile(device: int, shape, dtype, preview: dict | None) -> dict:
    import numpy as np

    from ...views.summaries import format_values

    tile = {"device": int(device), "shape": list(shape), "dtype": str(dtype), "text": "did not run",
            "values": [], "heat": None}
    if preview is None:
        return tile
    head = np.asarray(preview["head"])
    shown = head if head.dtype.kind in "biufc" else head.astype(np.float32)  # bfloat16, float8
    tile["text"] = format_values(shown[:TEXT_VALUES], tuple(shape), head.dtype)
    tile["values"] = [_number(v) for v in shown.tolist()]
    if "heat" in preview:
        heat = np.asarray(preview["heat"], dtype=np.float64)
        finite = heat[np.isfinite(heat)]
        tile["heat"] = {
            "rows": int(heat.shape[0]), "cols": int(heat.shape[1]),
            "values": [_number(v) for v in heat.reshape(-1).tolist()],
            "min": float(finite.min()) if finite.size else 0.0,
            "max": float(finite.max()) if finite.size else 0.0,
        }
    return tile


def _per_device(record, mesh_shape: tuple[int, ...]):
    """A record's arrays with the mesh's leading axes folded into one, in mesh order."""
    import numpy as np

    if isinstance(record, dict):
        return {k: _per_device(v, mesh_shape) for k, v in record.items()}
    array = np.asarray(record)
    k = len(mesh_shape)
    if array.shape[:k] == mesh_shape:
        # the device count, not -1: NumPy cannot infer -1 for an empty record (a 0-size psum)
        return array.reshape((math.prod(mesh_shape),) + array.shape[k:])
    return array  # already one leading device axis


def _where(site: Site, filename: str | None, line_text: Callable[[int], str] | None):
    """(line, source text) of the call: the frame in `filename` (the cell), else the innermost."""
    frames = [f for f in site.frames if filename is None or f[0] == filename]
    if not frames:
        return None, None
    file, line, _ = frames[0]
    text = line_text(line) if line_text is not None and filename is not None else linecache.getline(file, line).strip()
    return int(line), (text or None)


def _user_frames(frames) -> tuple:
    """(file, line) of the user's frames in a chain, innermost first."""
    return tuple((f, int(n)) for f, n, *_ in frames if f and n is not None and not is_library_file(f))


def compiled_bytes(sites: Sequence[Site], kinds: Sequence[str], lines: Sequence[int | None], compiled) -> list[int | None]:
    """Each site's compiled collective's result bytes, or None where no one compiled collective is
    found for it.

    A site and a compiled collective match when they are the same XLA op and the site's user frames
    (innermost first) begin the compiled one's: a call inside a helper function or a loop body is told
    apart from another one the cell's same line issues (a mixture-of-experts layer's two all_to_alls,
    a ring's ppermutes of K and V). Several sites that match the same compiled collectives take them
    in program order, preferring one of the site's own shape; a site that only one compiled collective
    matches takes it (XLA combined the calls of one psum over a tuple). Without frames: the cell's
    line, when exactly one collective of the op comes from it."""
    taken: set[int] = set()
    found: list[int | None] = []
    for site, kind, line in zip(sites, kinds, lines):
        op = _XLA_OP.get(kind)
        mine = _user_frames(site.frames)
        fits = [k for k, c in enumerate(compiled or ()) if c.op == op and mine
                and _user_frames(c.frames)[:len(mine)] == mine]
        if not fits and op is not None and line is not None:
            fits = [k for k, c in enumerate(compiled or ()) if c.op == op and c.line == line]
            fits = fits if len(fits) == 1 else []
        free = [k for k in fits if k not in taken]
        shaped = [k for k in free if compiled[k].shape == shape_text(site.out_shape, site.out_dtype)]
        pick = (shaped or free or (fits if len(fits) == 1 else [None]))[0]
        if pick is not None:
            taken.add(pick)
        found.append(int(compiled[pick].bytes) if pick is not None else None)
    return found


def _nbytes(shape, dtype) -> int:
    return 0 if shape is None else math.prod(shape) * _np_dtype(dtype).itemsize


def _kind(site: Site, mesh_axes) -> str:
    """The movement kind of a site's call ("none" over axes these records do not span)."""
    if not all(a in [n for n, _ in mesh_axes] for a in site.axes):
        return "none"
    return "none" if site.op == "axis_index" else KIND.get(site.op, KIND.get(site.primitive, "none"))


def _card(site: Site, record, mesh_axes, ids, drawn: int, where, compiled: int | None) -> dict | None:
    counts = [int(c) for c in record["count"]] if record is not None else None
    if counts is not None and not any(counts):
        return None  # never ran: a branch not taken, a loop of no iterations
    op = site.op
    kind = _kind(site, mesh_axes)
    perm = [tuple(p) for p in site.params.get("perm", ())]
    names = [n for n, _ in mesh_axes]
    if all(a in names for a in site.axes):
        groups = groups_of(mesh_axes, ids, axis_index_order(site.axes, names, site.primitive), site.axis_index_groups)
    else:  # over axes of an inner shard_map's mesh, which these records do not span
        groups = []
    shown = ids[:drawn]
    iterations = []
    if site.recorded and record is not None:
        labels = (("first", "first"), ("last", "last")) if site.in_loop and max(counts) > 1 else (("only", "first"),)
        for label, part in labels:
            iterations.append({
                "label": label,
                "before": _tiles(record[part].get("in"), site.in_shape, site.in_dtype, shown, counts),
                "after": _tiles(record[part]["out"], site.out_shape, site.out_dtype, shown, counts),
            })
    line, source = where
    estimate = estimated_bytes(kind, groups, ids, _nbytes(site.in_shape, site.in_dtype),
                               _nbytes(site.out_shape, site.out_dtype), perm)
    return {
        "index": 0,
        "op": op,
        "value": site.value,
        "primitive": site.primitive,
        "line": line,
        "source": source,
        "axes": list(site.axes),
        "groups": groups,
        "params": dict(site.params),
        "in_shape": shape_text(site.in_shape, site.in_dtype),
        "out_shape": shape_text(site.out_shape, site.out_dtype),
        "count": max(counts) if counts is not None else None,
        "recorded": bool(site.recorded),
        "why_not": site.why_not,
        "iterations": iterations,
        "devices_omitted": max(0, len(ids) - drawn),
        "movement": movement(kind, groups, perm, shown),
        "bytes": {"sent": estimate["sent"][:drawn], "received": estimate["received"][:drawn], "estimate": True,
                  "compiled": compiled},
    }


def _tiles(previews: dict | None, shape, dtype, shown: list[int], counts: list[int]) -> list[dict]:
    """One tile per drawn device (mesh order); a device that never made the call says so."""
    if previews is None:
        return []  # no input (axis_index)
    return [_tile(d, shape, dtype, {k: v[i] for k, v in previews.items()} if counts[i] else None)
            for i, d in enumerate(shown)]


def collective_cards(sites: Sequence[Site], records, mesh, *, filename: str | None = None,
                     line_text: Callable[[int], str] | None = None, compiled=None,
                     max_cards: int = MAX_CARDS) -> tuple[list[dict], int]:
    """The cards of the calls that ran, in program order, and how many calls were left out.

    `records`: what the Recording returned, fetched to the host, each array with one leading axis
    per mesh axis (or one leading axis of all devices in mesh order). `filename`/`line_text`: the
    cell's file name and a line -> text lookup (cells.Cell.filename, Cell.line). `compiled`: the
    compiled program's collectives (hlo.Collective), for their bytes beside our estimate.
    """
    shape = tuple(int(n) for n in mesh.devices.shape)
    mesh_axes = [(str(n), s) for n, s in zip(mesh.axis_names, shape)]
    ids = [int(d.id) for d in mesh.devices.flat]
    drawn = min(len(ids), MAX_DEVICES_DRAWN)
    shown = list(sites[:max_cards])
    where = [_where(site, filename, line_text) for site in shown]
    buffers = compiled_bytes(shown, [_kind(site, mesh_axes) for site in shown], [w[0] for w in where], compiled)
    cards = []
    for site, place, buffer in zip(shown, where, buffers):
        record = _per_device(records[site.slot], shape) if site.slot is not None else None
        card = _card(site, record, mesh_axes, ids, drawn, place, buffer)
        if card is not None:
            card["index"] = len(cards)
            cards.append(card)
    return cards, max(0, len(sites) - max_cards)


def collectives_state(title: str, sites: Sequence[Site], records, mesh, *, filename: str | None = None,
                      line_text: Callable[[int], str] | None = None, compiled=None,
                      device_process: Sequence[int] | None = None) -> dict:
    """The collectives view's whole state (jpm_schemas.md section 1)."""
    cards, omitted = collective_cards(sites, records, mesh, filename=filename, line_text=line_text,
                                      compiled=compiled)
    return {
        "title": title,
        "axes": [{"name": str(n), "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": [int(d.id) for d in mesh.devices.flat],
        "device_process": list(device_process) if device_process is not None else None,
        "cards": cards,
        "omitted_cards": omitted,
    }
