"""Compiling a plan, once: the compiled program with XLA's buffer dump, kept for the next plan of the
same program.

A plan compiles with `compiler_options={"xla_dump_to": ...}` (cell/xla_dump.py), which JAX's own
compilation cache keys on, and a fresh folder each time: so re-planning an unchanged cell would
compile again (XLA:TPU takes 13-27 s for a train step on 2 cores). Plans are therefore kept here,
keyed by the lowered program's text and the devices it was compiled for, like any cell's compiled
program: re-running a plan cell, or planning the same layout in a `--compare`, compiles nothing.
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ...cell.xla_dump import BufferDump, RefusedForMemory, compile_with_dump
from .native_stderr import heard

KEEP = 8  # compiled plans kept (an XLA:TPU executable for compile-only devices is a few MB)


@dataclass
class CompiledPlan:
    compiled: object  # jax.stages.Compiled
    memory: object  # compiled.memory_analysis()
    cost: dict  # compiled.cost_analysis(), or {} where the backend has none
    text: str  # compiled.as_text()
    dump: BufferDump
    compile_s: float  # how long the compile took when it ran
    said: tuple = ()  # what XLA's partitioner logged while compiling it (native_stderr; why.py reads it)


_kept: OrderedDict = OrderedDict()
_keeping = threading.Lock()  # the layout explorer plans on a worker thread while cells may plan on the main one


def _cost(compiled) -> dict:
    try:
        cost = compiled.cost_analysis() or {}
    except Exception:  # not every backend implements cost analysis
        return {}
    return cost[0] if isinstance(cost, (list, tuple)) and cost else cost if isinstance(cost, dict) else {}


_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def within(chain, filename: str | None) -> tuple:
    """A source-frame chain (innermost first) up to the cell's (or function's) own file: its callers cut
    off. A kept compile carries the callers of the plan that made it, and a re-run has new ones."""
    upto = next((i for i, f in enumerate(chain) if f[0] == filename), None)
    return tuple(chain) if upto is None else tuple(chain[:upto + 1])


def same_operations(instructions: list, types: dict, filename: str | None) -> tuple[list, dict]:
    """The compiled program's instructions and the lowered program's types keyed alike, by op name and
    frames `within` the file, so that a kept compile matches a new lowering operation by operation."""
    from dataclasses import replace

    def trim(key):
        return (key[0], within(key[1], filename)) if key else key

    return [replace(i, key=trim(i.key)) for i in instructions], {trim(k): v for k, v in types.items()}


def key_of(program_text: str, mesh, filename: str | None = None) -> str:
    """The lowered program and the devices it compiles for (platform and ids in mesh order).

    The program's source frames count only up to the cell's (or function's) own file: what calls it
    (IPython runs each magic from a new `<ipython-input-N-...>`) does not change the program, while
    the lines inside it, which name the collectives and buffers, do."""
    from ...cell.hlo_text import frames

    body = "\n".join(line for line in program_text.split("\n\n") if line.split("\n", 1)[0].strip() not in _TABLES)
    inner = {}
    for frame, chain in frames(program_text).items():
        if filename is None or any(f[0] == filename for f in chain):  # frames outside the cell name nothing
            inner[frame] = repr(within(chain, filename))
    # Each operation's frame by what it is, not by its number: the numbers count the callers' frames too, so
    # the magic and plan_cell (deeper or shallower stacks) number the same frames differently.
    body = re.sub(r"stack_frame_id=(\d+)", lambda m: "frame=" + inner.get(int(m.group(1)), "outside"), body)
    devices = [(d.platform, d.id) for d in mesh.devices.flat]
    digest = hashlib.sha256(body.encode())
    digest.update(repr((devices, tuple(mesh.axis_names))).encode())
    return digest.hexdigest()


def compile_plan_program(lowered, key: str) -> tuple[CompiledPlan, bool]:
    """(the compiled plan, whether it was kept from before)."""
    with _keeping:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key], True
    start = time.perf_counter()
    compiled, dump, said = in_worker(_compile_hearing, lowered)
    found = CompiledPlan(compiled, compiled.memory_analysis(), _cost(compiled), compiled.as_text(), dump,
                         time.perf_counter() - start, said)
    with _keeping:
        _kept[key] = found
        while len(_kept) > KEEP:
            _kept.popitem(last=False)
    return found, False


# XLA's SPMD partitioner's warnings (spmd_partitioner.cc: "[SPMD] Involuntary full rematerialization ...").
PARTITIONER = re.compile(r"spmd_partitioner\.cc|\[SPMD\]")


def _compile_hearing(lowered):
    """compile_with_dump, with what XLA's partitioner logs kept (not shown): (compiled, dump, said). A
    compile refused for memory carries it on the RefusedForMemory (`said`)."""
    with heard(PARTITIONER) as said:
        try:
            compiled, dump = compile_with_dump(lowered)
        except RefusedForMemory as exc:
            refused = exc
        else:
            refused = None
    if refused is not None:
        refused.said_by_partitioner = tuple(said())
        raise refused
    return compiled, dump, tuple(said())


def in_worker(fn, *args):
    """`fn(*args)` in a worker thread, the caller waiting: XLA does not look at Python's signals while
    it compiles (XLA:TPU: 20 s for a large step), so Kernel -> Interrupt would wait for the compile
    to end. Here the wait raises KeyboardInterrupt at once; the abandoned compile finishes in the
    background (XLA cannot stop it) and its result is dropped, nothing kept."""
    done = threading.Event()
    outcome: list = []

    def work():
        try:
            outcome.append((True, fn(*args)))
        except BaseException as exc:  # handed to the caller as it is
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=work, name="jaxpar-plan-compile", daemon=True).start()
    while not done.wait(0.1):  # short waits: Python checks for an interrupt between them (a signal
        pass  # tripped by _thread.interrupt_main wakes no lock wait)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def forget() -> None:
    """Drop every kept plan (tests; memory)."""
    with _keeping:
        _kept.clear()
