"""A magic as each process of a cluster runs it: `run_magic` reads the line as the kernel's face
does and runs it over the process's own namespace as SPMD code over the global devices (through
`Cluster.call`, two-phase: its bindings are applied in every process only once all of them
succeeded). It answers with a small picklable reply; face/remote.py merges the replies in the kernel.
"""
from __future__ import annotations

import os
import socket

from .actions import ARRAY_VIEWS, Defaults, Outcome, run


MAX_FINAL_TEXT = 2000  # characters of a cell's value sent back to the kernel


def run_magic(namespace: dict, magic: str, line: str, source: str | None, defaults: dict):
    """In a cluster process: run `%magic line` (or `%%magic line` + source) over this process's
    namespace. Returns (reply, bindings): a small picklable reply, and the names to bind later."""
    import jax

    from ..views import progress
    from .magics import parse_line

    with progress.disabled():  # the kernel shows one status line for all processes
        outcome = run(magic, parse_line(magic, line), source, namespace, Defaults(**defaults))
    if jax.process_count() > 1:
        _label_processes(outcome)
    reply = {
        "process": jax.process_index(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "views": outcome.views,
        "text": outcome.text,
        "has_final": outcome.has_final,
        "final": _describe(outcome.final) if outcome.has_final else None,
    }
    return reply, outcome.bindings


def _label_processes(outcome: Outcome) -> None:
    """Say which process holds each device, in the states of views about arrays."""
    import jax

    process_of = {d.id: d.process_index for d in jax.devices()}
    for kind, state in outcome.views:
        if kind == "tree":  # its pictures are sharding states
            for picture in state["pictures"]:
                _label_blocks(picture, process_of)
        if kind not in ARRAY_VIEWS:
            continue
        if kind == "sharding":
            _label_blocks(state, process_of)
        else:
            state["device_process"] = [process_of.get(d) for d in state.get("device_ids") or []]


def _label_blocks(state: dict, process_of: dict) -> None:
    ids = {d for block in state.get("blocks") or [] for d in ([block] if isinstance(block, int) else block)}
    state["device_process"] = {str(d): process_of[d] for d in sorted(ids) if d in process_of}


def _describe(value) -> str | None:
    """The text of a cell's value: plain values as repr, arrays by their shape (and values when this
    process holds all of them)."""
    import jax

    if value is None:
        return None
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return (f"a global jax.Array {value.dtype}{list(value.shape)} spread over {len(value.sharding.device_set)} "
                f"devices of {jax.process_count()} processes (bind it to a name and `%cluster gather NAME` to see it)")
    text = repr(value)
    return text if len(text) <= MAX_FINAL_TEXT else text[:MAX_FINAL_TEXT] + " …"
