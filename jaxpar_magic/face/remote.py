"""Our magics on a cluster, the kernel's side: each process runs the magic as SPMD code over the
global devices (process_magic.run_magic), and the kernel shows ONE outcome built from theirs.

`on_cluster` runs in the kernel: it sends the magic, then merges the replies: the views every
process computed alike (from global facts) are taken from rank 0, with each process's own facts
(host, pid) added to the device view.
"""
from __future__ import annotations

from dataclasses import asdict

from ..errors import UsageError
from .actions import Defaults, Outcome


class RemoteValue:
    """A cluster cell's value as the kernel shows it: its text (the value itself stays in the
    processes; `%cluster gather NAME` brings an array into the kernel)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.text)


def on_cluster(cluster, magic: str, line: str, source: str | None, defaults: Defaults, timeout: float | None,
               kernel_namespace: dict) -> Outcome:
    """In the kernel: run the magic in every process of `cluster` and merge what they return."""
    from ..cluster.status import explain_missing_name
    from ..views.progress import Progress

    try:
        with Progress(f"running %{'%' if source is not None else ''}{magic} on the cluster"):
            replies = cluster.call("jaxpar_magic.face.process_magic:run_magic", magic, line, source, asdict(defaults),
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


