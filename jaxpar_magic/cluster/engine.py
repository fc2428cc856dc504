"""What runs ON the cluster's engines: joining jax.distributed, facts, moving data, two-phase cells.

The kernel (`cluster/lifecycle.py`) sends these functions by reference with ipyparallel's `apply`; every
engine imports this module from the same environment as the kernel. Nothing here talks to other
engines except through JAX itself, and nothing here imports JAX before `join` has configured it.

State kept between two requests (pending bindings, the namespace snapshot) lives in module
globals: an engine runs one request at a time, in the order the kernel sent them.
"""
from __future__ import annotations

import importlib
import os
import socket

from ..errors import UsageError

_pending: dict[str, dict] = {}  # token -> bindings of a call, applied only when the kernel commits
_snapshot: dict | None = None  # the namespace as it was before the running %%cluster cell
_coordinator: str | None = None  # the address this engine joined with (JAX has no public getter)


def namespace() -> dict:
    """The engine's IPython user namespace: where cells run and names live."""
    from IPython import get_ipython

    return get_ipython().user_ns


# --- joining -----------------------------------------------------------------------------------
def join(rank: int, num_processes: int, coordinator: str, bind_address: str | None, simulate: int | None,
         init_timeout: int, heartbeat_timeout: int, shutdown_timeout: int,
         local_device_ids: list[int] | None = None) -> dict:
    """Configure JAX and join `jax.distributed`: the engine's very first JAX act. Returns `facts()`.

    `simulate` pins the CPU platform with that many devices (before the backend starts).
    `local_device_ids` restricts the process to those GPUs of its host (several local processes on
    a multi-GPU box: one GPU each); CPU and TPU backends ignore it.
    `bind_address` None lets JAX listen on every interface (multi-host); local clusters pass
    127.0.0.1. Short timeouts make a lost peer noticed in seconds instead of JAX's minutes.
    An engine that already joined (a second `connect` to the same engines) keeps its JAX cluster
    when it matches.
    """
    global _coordinator
    prepare()
    import jax

    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (num_processes, rank):
            raise UsageError(
                f"this engine already belongs to a JAX cluster of {jax.process_count()} processes as process "
                f"{jax.process_index()}, not {num_processes} processes as process {rank}. Restart the engines "
                "(`ipcluster stop` then `ipcluster start`), then `%cluster connect` again."
            )
        return facts()
    if simulate is not None:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", simulate)
    options = dict(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=rank,
        initialization_timeout=init_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout,
        shutdown_timeout_seconds=shutdown_timeout,
    )
    if bind_address is not None:
        options["coordinator_bind_address"] = bind_address
    if local_device_ids is not None:
        options["local_device_ids"] = local_device_ids
    jax.distributed.initialize(**options)
    _coordinator = coordinator
    return facts()


def prepare() -> None:
    """Before JAX starts: Gloo's connection chatter filtered out of the engine's file descriptors,
    SIGUSR1 answered with where the main thread waits (`hang_doctor`), and, with libtpu installed
    but nothing attached, JAX started on the CPU without probing for a TPU (devices.py)."""
    from ..cell.devices import cpu_when_nothing_attached
    from . import hang_doctor, native_output

    for fd in (1, 2):
        native_output.quiet(fd)
    hang_doctor.install()
    cpu_when_nothing_attached()


def whereami() -> dict:
    """Host, pid, and what this host's own name resolves to here (JAX's CPU collectives advertise
    that address to the other hosts), without touching JAX: what `connect` checks first."""
    host = socket.gethostname()
    try:
        # In the resolver's order: Gloo takes the first address it can bind, and 127.0.1.1 binds.
        own = list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)))
    except OSError as error:
        own = [error.strerror or str(error)]
    return {"host": host, "pid": os.getpid(), "own_addresses": own, "interfaces": _interface_addresses()}


def _interface_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback: what another host could dial."""
    import ipaddress

    import psutil

    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                found.append(address.address)
    return sorted(set(found))


_listener: socket.socket | None = None


def listen(port: int, seconds: float) -> None:
    """On rank 0, before JAX's coordinator exists: accept test connections on `port` for at most
    `seconds` (a thread; returns at once), so the other hosts can check they reach it."""
    import threading

    global _listener
    stop_listening()
    _listener = socket.socket()
    _listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _listener.bind(("", port))
    _listener.listen(64)
    _listener.settimeout(seconds)
    listener = _listener

    def accept():
        try:
            while True:
                connection, _ = listener.accept()
                connection.close()
        except OSError:  # the time is up, or stop_listening closed it
            pass

    threading.Thread(target=accept, daemon=True, name="jaxpar-listen").start()


def stop_listening() -> None:
    global _listener
    if _listener is not None:
        try:
            _listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: a bare close would keep the port
        except OSError:
            pass
        _listener.close()
        _listener = None


def reach(host: str, port: int, timeout: float) -> dict:
    """From another engine: what `host` resolves to here, and whether `host:port` answers."""
    try:
        addresses = sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except OSError as error:
        return {"addresses": [], "error": f"`{host}` does not resolve ({error.strerror or error})"}
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        return {"addresses": addresses, "error": f"{host}:{port} does not answer ({error.strerror or error})"}
    return {"addresses": addresses, "error": None}


def free_port() -> int:
    """A TCP port free on this host right now, for the coordinator that rank 0 will host."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def facts() -> dict:
    """This process's place in the JAX cluster, small enough to send back."""
    import jax

    return {
        "rank": jax.process_index(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "platform": jax.default_backend(),
        "coordinator": _coordinator,  # None when something else joined this engine to JAX
        "local_devices": [str(d) for d in jax.local_devices()],
        "local_device_ids": [int(d.id) for d in jax.local_devices()],
        # Every process sees the same global order; the kernel splits scattered rows by it.
        "global_devices": [(int(d.id), int(d.process_index)) for d in jax.devices()],
    }


def probe() -> None:
    """A tiny collective over every process: after an interrupt it hangs if JAX's cluster is broken."""
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("jaxpar_magic probe")


def hard_exit() -> None:
    """Leave at once. JAX's preemption handler swallows SIGTERM, so a fast stop asks for this."""
    os._exit(0)


# --- two-phase calls -----------------------------------------------------------------------------
def run_phase(token: str, func_path: str, *args) -> dict:
    """Phase one of `Cluster.call`: run `module:function` as `func(namespace, *args)`.

    The arguments travel as apply's own arguments, so ipyparallel cans what it can at their top
    level (functions defined in the kernel, the values of a dict like `push`'s).

    The function returns `(reply, bindings)`. The reply goes back to the kernel; the bindings wait
    under `token` until the kernel says `commit` (every process succeeded) or `discard`.
    """
    module_name, _, function_name = func_path.partition(":")
    func = getattr(importlib.import_module(module_name), function_name)
    reply, bindings = func(namespace(), *args)
    if bindings:
        _pending[token] = dict(bindings)
    return {"reply": reply, "pending": bool(bindings)}


def commit(token: str) -> None:
    """Phase two, when every process succeeded: bind the names in one step."""
    namespace().update(_pending.pop(token, {}))


def discard(token: str) -> None:
    """Phase two, when some process failed: forget the names."""
    _pending.pop(token, None)


# --- %%cluster cells: snapshot, then keep or roll back --------------------------------------------
def snapshot() -> None:
    """Remember every name's object before a cell runs (a shallow copy: objects are not copied)."""
    global _snapshot
    _snapshot = dict(namespace())


def restore() -> None:
    """Undo a failed cell's rebindings and new names. In-place mutation of objects stays."""
    global _snapshot
    if _snapshot is None:
        return
    ns = namespace()
    for name in [n for n in ns if n not in _snapshot]:
        del ns[name]
    for name, value in _snapshot.items():
        if name not in ns or ns[name] is not value:
            ns[name] = value
    _snapshot = None


def forget_snapshot() -> None:
    global _snapshot
    _snapshot = None


# --- moving data --------------------------------------------------------------------------------
def import_trees(namespace: dict, packed: dict, axis_name: str) -> tuple[dict, dict]:
    """Push's and scatter's engine side: `packed[name]` is (pickled structure, leaf entries), each
    entry as `trees.unpack_leaf` reads it; every value is rebuilt as the same type. No collective
    runs: scattered leaves are only this process's rows, placed on its own devices."""
    from . import trees

    bindings = {name: trees.rebuild(name, structure, [trees.unpack_leaf(entry, axis_name) for entry in entries])
                for name, (structure, entries) in packed.items()}
    return {name: type(value).__name__ for name, value in bindings.items()}, bindings


def export_values(namespace: dict, names: list[str]) -> tuple[dict, dict]:
    """Gather's engine side. Per name: ("missing",), or ("tree", pickled structure, [(path, entry)])
    with each leaf as `trees.export_leaf` sends it."""
    from . import trees

    reply = {}
    for name in names:
        if name not in namespace:
            reply[name] = ("missing",)
            continue
        structure, leaves = trees.flatten(name, namespace[name])
        reply[name] = ("tree", structure, [(path, trees.export_leaf(leaf)) for path, leaf in leaves])
    return reply, {}
