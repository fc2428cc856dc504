"""What runs on the cluster's engines and what comes back: plain code (`execute`, like %%px), a
two-phase `call` whose bindings are committed only when every process succeeded, and values moved
between the kernel and the engines (`push`, `scatter`, `gather`), with the engines' output relayed
into the cell labelled `[process R]`.

Every wait goes through `waits.WatchedEngines`, so none of these can hang the kernel.
"""
from __future__ import annotations

import sys
import time
import uuid

from ..cell.interrupts import HeldInterrupt, host_value
from ..errors import UsageError
from . import engine as cluster_engine, hang_doctor, trees
from .status import SUBCOMMAND_HINT, ClusterError, processes_text, remote_error
from .waits import WatchedEngines, stream_text

DEFAULT_TIMEOUT = 120.0  # a cell's limit when the caller gives none (%config JaxparMagics.cluster_timeout)
CLEANUP_TIMEOUT = 10.0  # commit/discard/restore after a cell
AXIS_NAME = "i"  # the mesh axis of scattered arrays


class ClusterRuns(WatchedEngines):
    """Running code and moving data on a running cluster (`cluster.Cluster` adds its lifecycle)."""

    _global_devices: list[tuple[int, int]]  # (device id, process index), in `jax.devices()` order

    # --- running code -------------------------------------------------------------------------
    def execute(self, code: str, targets=None, timeout: float | None = None) -> None:
        """Run plain code in every process (or the ranks in `targets`), like ipyparallel's %%px.

        stdout/stderr and the final expression's value are printed labelled `[process R]`. When the
        code fails in any process, every targeted process's namespace is restored (rebindings undone,
        new names removed; objects mutated in place stay mutated) and one error names the processes.
        """
        ranks = self._ranks(targets)
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        # A KeyboardInterrupt raised inside ipyparallel's send, before the watched wait began, left the
        # cell running on the engines, never rolled back: held, it is raised inside the wait's handling.
        with HeldInterrupt() as held:
            self._submit(ranks, cluster_engine.snapshot)  # runs before the cell: engines keep the order
            runs = self._submit_execute(ranks, code)
            relay = OutputRelay(runs)
            try:
                outcome, notes = self._wait(runs, timeout, "the cell", relay=relay, held=held)
            except (KeyboardInterrupt, ClusterError):
                if self.state == "running":  # interrupted, or timed out, in plain Python: roll back
                    self._settle(ranks, cluster_engine.restore)
                raise
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        if errors:
            if self.state == "running":
                self._settle(ranks, cluster_engine.restore)
            raise remote_error(errors, notes)
        relay.show_results()
        self._submit(ranks, cluster_engine.forget_snapshot)  # not waited: engines run requests in order

    def call(self, func_path: str, *args, targets=None, timeout: float | None = None) -> list:
        """Run `module:function` in every process (or `targets`) as `func(namespace, *args)`, two-phase.

        The function returns `(reply, bindings)`. Only when every targeted process succeeded are the
        bindings committed (`namespace.update(bindings)`) everywhere; otherwise all are discarded.
        Returns the replies in rank order. A UsageError raised on engines arrives as one UsageError
        naming the processes; any other exception as one ClusterCellError.
        """
        ranks = self._ranks(targets)
        return self._call(func_path, {rank: args for rank in ranks}, timeout)

    def _call(self, func_path: str, args_by_rank: dict[int, tuple], timeout: float | None) -> list:
        self._require_running()
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        token = uuid.uuid4().hex
        ranks = list(args_by_rank)
        with HeldInterrupt() as held:  # as in execute
            ars = self._submit(ranks, cluster_engine.run_phase,
                               per_rank=lambda rank: (token, func_path, *args_by_rank[rank]))
            try:
                outcome, notes = self._wait(ars, timeout, "the cluster call", relay=OutputRelay(ars), held=held)
            except (KeyboardInterrupt, ClusterError):
                if self.state == "running":
                    self._settle(ranks, cluster_engine.discard, token)
                raise
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        pending = [rank for rank, (kind, value) in outcome.items() if kind == "ok" and value["pending"]]
        if errors:
            if self.state == "running" and pending:
                self._settle(pending, cluster_engine.discard, token)
            raise remote_error(errors, notes)
        if pending:
            # Not waited: an engine runs requests in the order sent, so whatever the kernel sends next
            # sees the names; a dict update cannot fail, and an engine that dies is named by the next wait.
            self._submit(pending, cluster_engine.commit, token)
        return [outcome[rank][1]["reply"] for rank in ranks]

    def _settle(self, ranks, func, *args) -> None:
        """Phase two (commit/discard) or a rollback, on the ranks that need it; waited, with a timeout."""
        outcome, _ = self._wait(self._submit(ranks, func, *args), CLEANUP_TIMEOUT, "settling the cell")
        errors = {rank: value for rank, (kind, value) in outcome.items() if kind == "error"}
        if errors:
            raise remote_error(errors, ())

    # --- moving data ----------------------------------------------------------------------------
    def push(self, values: dict, targets=None, timeout: float | None = None) -> None:
        """Copy kernel values to every process (or `targets`) as they are, under their names. A
        pytree (dict, registered dataclass, Equinox module, optax state) is rebuilt as the same type
        there; its jax.Array leaves become jax.Arrays of each process."""
        import jax

        packed = {}
        for name, value in dict(values).items():
            structure, leaves = trees.flatten(name, value)
            unsendable = _unsendable({path: leaf for path, leaf in leaves})
            if unsendable:
                path, problem = unsendable[0]
                raise UsageError(f"%cluster push: {trees.label(path, name)} cannot be sent to the engines ({problem}). "
                                 "Push what it is made of, or build it on the cluster in a %%cluster cell.")
            packed[name] = (structure, [("jax", host_value(leaf)) if isinstance(leaf, jax.Array)
                                        else ("value", trees.canned(leaf)) for _, leaf in leaves])
        self._push_packed({rank: packed for rank in self._ranks(targets)}, timeout)

    def scatter(self, values: dict, timeout: float | None = None) -> None:
        """Turn kernel arrays into global jax.Arrays of the same shape on the cluster: the leading
        axis is split over all global devices (1-D mesh axis "i", in `jax.devices()` order) and each
        process receives and holds only its own devices' rows
        (`jax.make_array_from_process_local_data`). Any pytree works: each array leaf is split so
        (a 0-d leaf is replicated on every device), other leaves are sent as they are, and the same
        type is rebuilt in every process."""
        import numpy as np

        self._require_running()
        device_count = len(self._global_devices)
        positions = {rank: [k for k, (_, process) in enumerate(self._global_devices) if process == rank]
                     for rank in range(len(self.processes))}
        packed: dict[int, dict] = {rank: {} for rank in positions}
        for name, value in values.items():
            structure, leaves = trees.flatten(name, value)
            entries: dict[int, list] = {rank: [] for rank in positions}
            for path, leaf in leaves:
                whole_value = path == name  # not inside a pytree: it must be an array (as before pytrees)
                if not whole_value and not trees.is_array(leaf):
                    for rank in positions:
                        entries[rank].append(("value", trees.canned(leaf)))
                    continue
                array = host_value(leaf)
                if array.ndim == 0 and not whole_value:  # a pytree's scalar (optax's count): on every device
                    for rank in positions:
                        entries[rank].append(("whole", array))
                    continue
                rows = array.shape[0] if array.ndim else None
                if rows is None or rows % device_count:
                    have = f"has {rows} rows, which do not split" if rows is not None else "is a scalar, which does not split"
                    raise UsageError(
                        f"%cluster scatter {name}: {trees.label(path, name)} {have} over the cluster's {device_count} "
                        f"devices ({len(self.processes)} processes): scatter splits the leading axis evenly, so it "
                        f"needs a multiple of {device_count} rows. Pad or trim it, or send it whole with "
                        f"`%cluster push {name}`."
                    )
                per_device = rows // device_count
                for rank, places in positions.items():
                    local = np.concatenate([array[k * per_device:(k + 1) * per_device] for k in places])
                    entries[rank].append(("rows", local, array.shape))
            for rank in positions:
                packed[rank][name] = (structure, entries[rank])
        self._push_packed(packed, timeout)

    def _push_packed(self, packed_by_rank: dict[int, dict], timeout: float | None) -> None:
        self._call("jaxpar_magic.cluster.engine:import_trees",
                   {rank: (packed, AXIS_NAME) for rank, packed in packed_by_rank.items()}, timeout)

    def gather(self, names, timeout: float | None = None) -> dict:
        """Bring cluster values into the kernel: a global jax.Array as one numpy array of its global
        shape (assembled from each process's replica-0 shards), anything else as a list with one
        value per process. A pytree with global jax.Array leaves comes back as one value of the same
        type, those leaves assembled and the others taken from process 0. An unknown name is a
        UsageError."""
        names = [names] if isinstance(names, str) else list(names)
        replies = self.call("jaxpar_magic.cluster.engine:export_values", names, timeout=timeout)
        gathered = {}
        for name in names:
            items = [reply[name] for reply in replies]
            missing = [rank for rank, item in enumerate(items) if item[0] == "missing"]
            if len(missing) == len(items):
                raise UsageError(
                    f"%cluster gather {name}: {name!r} is not defined on the cluster (in none of its {len(items)} "
                    "processes). Define it in a cluster cell first, or check the spelling."
                )
            if missing:
                raise UsageError(
                    f"%cluster gather {name}: {name!r} is defined in some processes but not in {processes_text(missing)}; "
                    "gather needs it in every process."
                )
            bad = [(rank, path, entry) for rank, item in enumerate(items) for path, entry in item[2]
                   if entry[0] == "unsendable"]
            if bad:
                _, path, (_, kind, problem) = bad[0]
                ranks = sorted({rank for rank, p, _ in bad if p == path})
                raise UsageError(
                    f"%cluster gather {name}: {trees.label(path, name)} is a {kind} in {processes_text(ranks)}, which "
                    f"cannot be sent to the kernel ({problem}). Gather something picklable made from it (e.g. a "
                    "list or an array)."
                )
            if any(entry[0] == "global" for _, entry in items[0][2]):
                leaves = [_assemble(path, [item[2][k][1] for item in items]) if entry[0] == "global"
                          else trees.uncanned(entry[1]) for k, (path, entry) in enumerate(items[0][2])]
                gathered[name] = trees.rebuild(name, items[0][1], leaves)
            else:
                gathered[name] = [trees.rebuild(name, item[1], [trees.uncanned(entry[1]) for _, entry in item[2]])
                                  for item in items]
        return gathered

    # --- which processes a request goes to ------------------------------------------------------
    def _ranks(self, targets) -> list[int]:
        self._require_running()
        count = len(self.processes)
        if targets is None:
            return list(range(count))
        chosen = [targets] if isinstance(targets, int) else list(targets)
        wrong = [rank for rank in chosen if not isinstance(rank, int) or not 0 <= rank < count]
        if wrong or not chosen:
            raise UsageError(f"--targets {wrong[0] if wrong else ''}: the cluster's ranks are 0 to {count - 1}.")
        return sorted(set(chosen))

    def _require_running(self) -> None:
        if self.state == "running":
            self._check_alive()
        if self.state == "broken":
            raise ClusterError(f"the cluster is broken: {self.why}. {self._recovery()} Or `%cluster stop`.")
        if self.state == "stopped":
            raise UsageError(f"no cluster is running; start one with `{SUBCOMMAND_HINT}`.")


class OutputRelay:
    """Prints the engines' stdout/stderr while they arrive, each line labelled `[process R]`."""

    def __init__(self, ars: dict):
        self._ars = ars
        self._seen: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], str] = {}

    def pump(self, final: bool = False) -> None:
        for rank, ar in self._ars.items():
            for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                key = (rank, stream)
                text = stream_text(ar, stream)
                fresh = self._partial.get(key, "") + text[self._seen.get(key, 0):]
                self._seen[key] = len(text)
                lines = fresh.split("\n")
                self._partial[key] = "" if final else lines.pop()
                if final and lines and lines[-1] == "":
                    lines.pop()
                for line in lines:  # (Gloo's chatter never gets here: the engines filter it at the source)
                    if not line.startswith(hang_doctor.MARK):
                        out.write(f"[process {rank}] {line}\n")

    def finish(self) -> None:
        until = time.monotonic() + 1.0
        for ar in self._ars.values():
            if ar.ready():  # output of a finished request trails its reply by a moment
                ar.wait_for_output(max(0.0, until - time.monotonic()))
        self.pump(final=True)

    def show_results(self) -> None:
        """The final expression's value and displays of a %%cluster cell, labelled by process."""
        from IPython.display import publish_display_data

        for rank, ar in self._ars.items():
            for output in ar["outputs"] or ():
                data = {k: v for k, v in output.get("data", {}).items() if "widget" not in k}
                if data:
                    print(f"[process {rank}]")
                    publish_display_data(data, output.get("metadata", {}))
            result = ar["execute_result"]
            if result:
                text = result.get("data", {}).get("text/plain", "")
                lines = text.splitlines() or [""]
                print(f"[process {rank}] Out: {lines[0]}")
                for line in lines[1:]:
                    print(f"[process {rank}]      {line}")


def _assemble(name: str, items: list) -> object:
    import numpy as np

    shape = items[0][1]
    shards = [shard for item in items for shard in item[3]]
    dtype = shards[0][1].dtype if shards else np.dtype(items[0][2])
    out = np.empty(shape, dtype)
    filled = 0
    for index, data in shards:
        out[index] = data
        filled += data.size
    if filled != out.size:
        raise ClusterError(f"%cluster gather {name}: the processes' shards cover {filled} of {out.size} elements.")
    return out


def _unsendable(values: dict) -> list[tuple[str, str]]:
    """(name, why) of the values ipyparallel cannot serialize, checked the way it sends them."""
    from ipyparallel.serialize import serialize_object

    bad = []
    for name, value in values.items():
        try:
            serialize_object(value)
        except Exception as error:  # whatever stops a value from travelling is what the user must hear
            bad.append((name, f"{type(error).__name__}: {error}"))
    return bad
