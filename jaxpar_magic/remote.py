"""Our magics on a cluster: each process runs the magic as SPMD code over the global devices, and
the kernel shows ONE outcome built from theirs.

`run_magic` runs in every process (through `Cluster.call`, two-phase: its bindings are applied in
every process only once all of them succeeded). `on_cluster` runs in the kernel: it sends the magic,
then merges the replies: the views every process computed alike (from global facts) are taken from
rank 0, with each process's own facts (host, pid) added to the device view.
"""
from __future__ import annotations

import os
import socket
from dataclasses import asdict

from .actions import ARRAY_VIEWS, Defaults, Outcome, run
from .errors import UsageError

MAX_FINAL_TEXT = 2000  # characters of a cell's value sent back to the kernel


class RemoteValue:
    """A cluster cell's value as the kernel shows it: its text (the value itself stays in the
    processes; `%cluster gather NAME` brings an array into the kernel)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.text)


def run_magic(namespace: dict, magic: str, line: str, source: str | None, defaults: dict):
    """In a cluster process: run `%magic line` (or `%%magic line` + source) over this process's
    namespace. Returns (reply, bindings): a small picklable reply, and the names to bind later."""
    import jax

    from . import progress
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


def on_cluster(cluster, magic: str, line: str, source: str | None, defaults: Defaults, timeout: float | None,
               kernel_namespace: dict) -> Outcome:
    """In the kernel: run the magic in every process of `cluster` and merge what they return."""
    from .cluster_status import explain_missing_name
    from .progress import Progress

    try:
        with Progress(f"running %{'%' if source is not None else ''}{magic} on the cluster"):
            replies = cluster.call("jaxpar_magic.remote:run_magic", magic, line, source, asdict(defaults),
                                   timeout=timeout)
    except UsageError as err:
        hint = explain_missing_name(str(err), kernel_namespace)
        if hint is not None:
            raise hint from None
        raise
    first = replies[0]
    hosts = {str(r["process"]): {"host": r["host"], "pid": r["pid"]} for r in replies}
    views = []
    for kind, state in first["views"]:
        if kind == "devices":
            state = {**state, "hosts": hosts}
        views.append((kind, state))
    final = RemoteValue(first["final"]) if first["has_final"] and first["final"] is not None else None
    # The names were bound in every process (two-phase); the kernel's namespace is not theirs.
    return Outcome(views=views, text=first["text"], final=final, has_final=first["has_final"] and final is not None)


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
