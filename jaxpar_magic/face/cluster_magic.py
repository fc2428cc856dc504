"""The `%cluster SUBCOMMAND` line magic and the `%%cluster` cell magic: parse, call `Cluster`, show.

The magics class calls `line(shell, line, default_timeout)` and `cell(shell, line, cell,
default_timeout)` and puts `HELP` on its method, so `%cluster?` prints every subcommand's options.
Lines are read like a shell (`shlex.split`) into IPython's `MagicArgumentParser`s, one per
subcommand. Nothing here starts, waits or moves data itself: `cluster/lifecycle.py` does.
"""
from __future__ import annotations

import contextlib
import time

from IPython.core.magic_arguments import MagicArgumentParser

from ..cell.specs import is_count
from ..errors import UsageError
from ..views.progress import Progress, StatusLine, kept_lines
from .lines import python_names, shell_words


class _Parser(MagicArgumentParser):
    def error(self, message):
        raise UsageError(f"%{self.prog}: {message}. `%cluster?` shows every subcommand's options.")


def _timeout_option(parser: _Parser, help: str) -> None:
    parser.add_argument("--timeout", type=float, metavar="S", help=help)


def _build_parsers() -> dict[str, _Parser]:
    parsers = {}

    start = parsers["start"] = _Parser(prog="cluster start", description=(
        "Start P local ipyparallel engines; each joins jax.distributed as its first act, with the coordinator "
        "bound to 127.0.0.1."))
    start.add_argument("-n", "--processes", dest="n", type=int, required=True, metavar="P",
                       help="Number of processes (engines).")
    start.add_argument("--simulate", type=int, metavar="D", help="Give every process D simulated CPU devices.")
    _timeout_option(start, "Seconds the start may take (default 60).")

    connect = parsers["connect"] = _Parser(prog="cluster connect", description=(
        "Join the engines of a running ipyparallel cluster (`ipcluster start ...`, possibly on several hosts) into "
        "one JAX cluster. `%cluster stop` then only disconnects."))
    connect.add_argument("--profile", help="The ipyparallel profile the cluster runs under (default: default).")
    connect.add_argument("-n", "--processes", dest="n", type=int, metavar="P", help=(
        "Wait for P engines (default: as many as ipcluster's cluster file says it started)."))
    connect.add_argument("--cluster-id", help="The ipyparallel cluster id, when the profile runs several.")
    connect.add_argument("--coordinator", metavar="HOST:PORT", help=(
        "Where every host reaches rank 0's host (its name or address as the OTHER hosts see it); default: "
        "127.0.0.1 when all engines run here, else rank 0's hostname, with a free port."))
    _timeout_option(connect, "Seconds connecting may take (default 60).")

    parsers["status"] = _Parser(prog="cluster status", description=(
        "Show the processes (rank, host, pid, local devices), the coordinator and the state: running, "
        "broken (why) or stopped."))
    parsers["stop"] = _Parser(prog="cluster stop", description=(
        "Stop a cluster started here (every process ends, in about a second), or disconnect from a connected "
        "one (its engines keep running)."))
    restart = parsers["restart"] = _Parser(prog="cluster restart", description=(
        "Stop, then start again with the same options. Every name defined on the cluster is lost."))
    _timeout_option(restart, "Seconds the start may take (default: as at the first start).")

    for name, description in (
        ("push", "Copy kernel values to every process, as they are. Pytrees (dicts, registered dataclasses, "
                 "Equinox modules, optax states) are rebuilt as the same type."),
        ("scatter", "Turn kernel arrays into global jax.Arrays of the same shape: the leading axis is split over "
                    "all global devices (mesh axis 'i'), each process holding only its own devices' rows. In a "
                    "pytree every array leaf is split so (0-d leaves are replicated), other leaves sent as they are."),
        ("gather", "Bring cluster values into the kernel: a global jax.Array as one numpy array of its global "
                   "shape (a pytree with such leaves as one value of the same type); any other value as a list "
                   "with one value per process."),
    ):
        parser = parsers[name] = _Parser(prog=f"cluster {name}", description=description)
        parser.add_argument("names", nargs="+", metavar="NAME")
        _timeout_option(parser, "Seconds the transfer may take (default: %%config JaxparMagics.cluster_timeout).")
    return parsers


PARSERS = _build_parsers()

CELL_PARSER = _Parser(prog="%cluster", description=(
    "Run plain code in every process of the cluster (or some), like ipyparallel's %%px; stdout/stderr and the "
    "final value are labelled by process. When the cell fails in any process, every process's names are "
    "restored as they were."))
CELL_PARSER.add_argument("--timeout", type=float, metavar="S", help=(
    "Seconds the cell may take (default: %%config JaxparMagics.cluster_timeout, 120). Past it the engines are "
    "interrupted and the cluster is marked broken."))
CELL_PARSER.add_argument("--targets", nargs="+", metavar="RANKS",
                         help="Only these ranks: `--targets 0`, `--targets 0,2`, `--targets 1-3`.")

HELP = "\n\n".join([
    "Drive a multi-process JAX cluster: ipyparallel engines joined by jax.distributed.\n\n"
    "    %cluster start -n 2 --simulate 4     # 2 processes x 4 CPU devices: 8 global devices\n"
    "    %%cluster                            # plain code in every process, output labelled by process\n"
    "    %cluster gather total                # a global array into the kernel, as numpy\n"
    "    %cluster stop\n\n"
    "While a cluster runs, %%pmap, %%shard, %devices, %mesh and %sharding run in every process over the "
    "global devices, and their names live on the cluster. Subcommands: " + ", ".join(PARSERS) + ".",
    *(parser.format_help().rstrip() for parser in (*PARSERS.values(), CELL_PARSER)),
])


# --- entry points --------------------------------------------------------------------------------
def parse(line: str):
    """The parse step of `%cluster SUBCOMMAND ...`: (subcommand, argparse namespace), every option
    checked, or a UsageError. (subcommand, None) asks for the subcommand's help."""
    words = shell_words(line, "%cluster")
    if not words:
        raise UsageError(f"%cluster needs a subcommand: {', '.join(PARSERS)}. `%cluster?` shows their options.")
    name, rest = words[0], words[1:]
    parser = PARSERS.get(name)
    if parser is None:
        raise UsageError(
            f"%cluster {name}: unknown subcommand. The subcommands are {', '.join(PARSERS)}; plain code runs in "
            "every process with the %%cluster cell magic. `%cluster?` shows their options."
        )
    if "-h" in rest or "--help" in rest:
        return name, None
    args = parser.parse_args(rest)
    if getattr(args, "timeout", None) is not None:
        _timeout(args.timeout, None, f"%cluster {name}")
    for option in ("n", "simulate"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            flag = "-n" if option == "n" else "--simulate"
            raise UsageError(f"%cluster {name} {flag} {value}: it must be at least 1, e.g. "
                             "`%cluster start -n 2 --simulate 4`.")
    if getattr(args, "names", None) is not None:
        python_names(args.names, f"%cluster {name}")
    return name, args


def parse_cell(line: str):
    """The parse step of `%%cluster [--timeout S] [--targets RANKS]`."""
    args = CELL_PARSER.parse_args(shell_words(line, "%%cluster"))
    _timeout(args.timeout, None, "%%cluster")
    return args


def line(shell, line: str, default_timeout: float):
    """`%cluster SUBCOMMAND ...`. Returns the status object for `status`, else None."""
    name, args = parse(line)
    if args is None:
        print(PARSERS[name].format_help())
        return None
    return _HANDLERS[name](shell, args, default_timeout)


def cell(shell, line: str, cell: str, default_timeout: float) -> None:
    """`%%cluster [--timeout S] [--targets RANKS]`: the cell in every process (or the targets)."""
    from ..cluster.status import ClusterCellError, explain_missing_name

    args = parse_cell(line)
    timeout = _timeout(args.timeout, default_timeout, "%%cluster")
    cluster = _running("%%cluster")
    targets = parse_targets(args.targets, len(cluster.processes))
    count = len(targets) if targets is not None else len(cluster.processes)
    try:
        with _replaced_status(f"running on {count} processes", lambda s: f"ran on {count} processes in {s:.1f} s"):
            cluster.execute(cell, targets=targets, timeout=timeout)
    except ClusterCellError as error:
        explained = explain_missing_name(error, shell.user_ns)
        if explained is not None:
            raise explained from None
        raise


def parse_targets(words: list[str] | None, count: int) -> list[int] | None:
    """`0`, `0,2`, `1-3` (and several words) -> sorted ranks; None means every process."""
    if not words:
        return None
    ranks: set[int] = set()
    for part in ",".join(words).split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not (is_count(low) and (not dash or is_count(high))):  # ASCII digits: int('²') fails
            raise UsageError(f"--targets {' '.join(words)}: {part!r} is not a rank; give ranks like `0`, `0,2` "
                             "or `1-3` (ASCII digits).")
        first, last = int(low), int(high if dash else low)
        if last >= count or first > last:  # checked before building anything: `0-99999999999` is a mistake
            raise UsageError(f"--targets {' '.join(words)}: the cluster's ranks are 0 to {count - 1}; give ranks "
                             f"in that range, a range as LOW-HIGH with LOW <= HIGH.")
        ranks.update(range(first, last + 1))
    return sorted(ranks)


# --- subcommands ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _replaced_status(label: str | None, done=None):
    """`with _replaced_status("pushing x", done) as show:` a status line while the block runs (past a second),
    then replaced by the outcome: what the block gave `show(obj)`, or else the line `done(seconds)`.
    Never an empty output left behind. `label` None: the block shows its own lines (starting
    engines 1/2), and those are replaced the same way."""
    from IPython.display import display

    shown: list = []
    started = time.monotonic()
    with kept_lines() as slots:
        with Progress(label) if label else contextlib.nullcontext():
            yield shown.append
        outcome = shown[0] if shown else (StatusLine(done(time.monotonic() - started)) if done else None)
        if outcome is not None and not slots.fill(outcome) and shown:
            display(outcome)  # no line was shown (a quick block): the outcome goes below
        slots.close()


def _start(shell, args, default_timeout):
    from ..cluster.lifecycle import Cluster

    with _replaced_status(None) as show:
        cluster = Cluster.start(args.n, simulate=args.simulate,
                                timeout=_timeout(args.timeout, None, "%cluster start"))
        show(cluster.status())


def _connect(shell, args, default_timeout):
    from ..cluster.lifecycle import Cluster

    with _replaced_status(None) as show:
        cluster = Cluster.connect(profile=args.profile, cluster_id=args.cluster_id, coordinator=args.coordinator,
                                  timeout=_timeout(args.timeout, None, "%cluster connect"), n=args.n)
        show(cluster.status())


def _status(shell, args, default_timeout):
    from ..cluster.lifecycle import current, last
    from ..cluster.status import ClusterStatus

    cluster = current() or last()
    if cluster is None:
        return ClusterStatus("none", None, None, (), False)
    return cluster.status()


def _stop(shell, args, default_timeout):
    from ..cluster.lifecycle import current

    cluster = current()
    if cluster is None:
        raise UsageError("%cluster stop: no cluster is running in this kernel.")
    owned = cluster.status().started_here
    cluster.stop()
    if not owned:
        print("disconnected; the engines keep running (stop them with `ipcluster stop`).")


def _restart(shell, args, default_timeout):
    from ..cluster.lifecycle import current, last

    cluster = current() or last()
    if cluster is None:
        raise UsageError("%cluster restart: no cluster has run in this kernel; start one with "
                         "`%cluster start -n 2 --simulate 4`.")
    with _replaced_status(None) as show:
        cluster.restart(timeout=_timeout(args.timeout, None, "%cluster restart"))
        show(cluster.status())
    print("restarted: every name defined on the cluster was lost; re-run the cells that define them, or "
          "`%cluster push`/`scatter` them again.")


def _push(shell, args, default_timeout):
    values = _kernel_values(shell, args.names, "push")
    names = " ".join(args.names)
    with _replaced_status(f"pushing {names}", lambda s: f"pushed {names} to every process in {s:.1f} s"):
        _running("%cluster push").push(values, timeout=_timeout(args.timeout, default_timeout, "push"))


def _scatter(shell, args, default_timeout):
    values = _kernel_values(shell, args.names, "scatter")
    names = " ".join(args.names)
    with _replaced_status(f"scattering {names}", lambda s: f"scattered {names} over the cluster in {s:.1f} s"):
        _running("%cluster scatter").scatter(values, timeout=_timeout(args.timeout, default_timeout, "scatter"))


def _gather(shell, args, default_timeout):
    names = python_names(args.names, "%cluster gather")
    timeout = _timeout(args.timeout, default_timeout, "gather")
    with _replaced_status(f"gathering {' '.join(names)}", lambda s: f"gathered {' '.join(names)} in {s:.1f} s"):
        gathered = _running("%cluster gather").gather(names, timeout=timeout)
    shell.user_ns.update(gathered)


_HANDLERS = {"start": _start, "connect": _connect, "status": _status, "stop": _stop, "restart": _restart,
             "push": _push, "scatter": _scatter, "gather": _gather}


def _running(magic: str):
    from ..cluster.lifecycle import current
    from ..cluster.status import SUBCOMMAND_HINT

    cluster = current()
    if cluster is None:
        raise UsageError(f"{magic}: no cluster is running in this kernel; start one with `{SUBCOMMAND_HINT}` "
                         "(or `%cluster connect` to engines started elsewhere).")
    return cluster


def _kernel_values(shell, names: list[str], action: str) -> dict:
    python_names(names, f"%cluster {action}")
    missing = [name for name in names if name not in shell.user_ns]
    if missing:
        raise UsageError(f"%cluster {action} {' '.join(names)}: {', '.join(map(repr, missing))} "
                         f"{'is' if len(missing) == 1 else 'are'} not defined in the kernel.")
    return {name: shell.user_ns[name] for name in names}


def _timeout(given: float | None, default: float | None, magic: str) -> float | None:
    if given is not None and not 0 < given < float("inf"):  # nan and inf too: every wait has an end
        raise UsageError(f"{magic} --timeout {given:g}: a timeout is a positive, finite number of seconds.")
    return default if given is None else given
