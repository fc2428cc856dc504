"""The --collectives recording of a cell: the cell function run under the recorder, its cards
labelled by the cell's own names and leaf paths, and the card state built from a run's records."""
from __future__ import annotations

from ...cell import analysis as cells


def recording(fn, inputs, axis_names):
    """The --collectives recording of a cell function: its cards name what each call moves, by the
    cell's own names and leaf paths (`pmean grads['w1']`)."""
    import jax

    from .recorder import record_collectives

    def output_label(path):
        if not path or getattr(path[0], "idx", None) not in (0, 1):
            return None
        if path[0].idx == 1:  # the final expression
            return "(result)" + jax.tree_util.keystr(tuple(path[1:]))
        name = getattr(path[1], "key", None) if len(path) > 1 else None
        if not isinstance(name, str) or name.startswith("<"):  # a write-back, not a name of the cell
            return None
        return name + jax.tree_util.keystr(tuple(path[2:]))

    def input_label(path):
        if len(path) != 2:
            return None
        return inputs[path[0].idx].label(path[1].idx)

    return record_collectives(fn, axis_names, label_output=output_label, label_input=input_label)


def collectives_view_state(sites, records, title: str, mesh, cell: cells.Cell, facts=None) -> dict:
    """The collective cards of a run compiled with --collectives: `sites`, the recorded calls of the
    trace that ran (its CellTrace's), and `records`, the program's extra outputs."""
    import jax

    from .cards import collectives_state
    from ...views.summaries import to_host

    return collectives_state(title, sites, jax.tree.map(to_host, records), mesh,
                             filename=cell.filename, line_text=cell.line,
                             compiled=facts.collectives if facts is not None else None)
