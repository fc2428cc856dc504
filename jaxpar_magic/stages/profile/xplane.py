"""The one reader of the profiler's trace: the XSpace that `jax.profiler.trace(dir)` writes
(`*.xplane.pb`), read with the public `jax.profiler.ProfileData.from_file`, turned into plain records
of one program's executions (`Trace`).

The planes, lines, events and stats inside are XLA's debug format, not an API. This module is the
only one that knows their names, and `tests/test_profile_trace.py` fails loudly (TraceFormatError,
naming what it no longer finds) when a JAX upgrade changes them. What it reads, as seen with JAX
0.10.2 on XLA:CPU and on a TPU v5e (libtpu 0.0.42):

- TPU: one plane per chip, `/device:TPU:0`, ..., with the lines "XLA Modules" (one event per run
  of a program, named `jit_step(<fingerprint>)`, with a `run_id` stat), "XLA Ops" (one event per HLO
  instruction run, named by its HLO text: `%fusion.3 = f32[8,128]{...} fusion(...)`) and "Async XLA
  Ops" (an asynchronous instruction's span from its start to its done, stat `hlo_op`: the done's name).
- XLA:CPU: one plane, `/host:CPU`, with a line per thread: XLA:CPU's own (`tf_XLAPjRtCpuClient/...`,
  `tf_XLAEigen/...`), and the caller's (`python`, `main/<pid>`), where a small program can run inline.
  An instruction's run is an event named by the instruction, with stats `hlo_op`, `hlo_module` (the
  program's module name), `run_id` (the program's run) and `device_ordinal` (the simulated device it
  ran for). A collective's wait for its peers is nested in it: events named `Wait...` ("Wait:
  pending_threads=3/8", "Wait for rendezvous callback") inside its `Rendezvous`.

Plain Python over `jax.profiler.ProfileData`; the records carry nanoseconds as the trace does.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

TPU_PLANE = re.compile(r"^/device:TPU:(\d+)$")
HOST_PLANE = "/host:CPU"
MODULES_LINE, OPS_LINE, ASYNC_LINE = "XLA Modules", "XLA Ops", "Async XLA Ops"
WAIT_PREFIX = "Wait"
_INSTRUCTION_TEXT = re.compile(r"^%?([\w.\-]+)\s*=")  # a TPU op event's name: its instruction's HLO text


class TraceFormatError(RuntimeError):
    """The trace no longer reads as this module expects: JAX or XLA changed its debug format."""


@dataclass
class TracedOp:
    """One run of one HLO instruction on one lane."""

    name: str  # the instruction's name, as compiled.as_text() prints it (without the %)
    start_ns: float
    duration_ns: float
    run: object  # which run of the program it belongs to (steps are told apart by it)
    waits: list = field(default_factory=list)  # [(start_ns, duration_ns)] spent waiting for peers inside it
    in_flight: bool = False  # an asynchronous instruction's span, from its start to its done (TPU)


@dataclass
class TracedLane:
    """What ran for one device (`device`: its id) or, where the trace does not say, on one thread."""

    device: int | None
    thread: str | None
    ops: list = field(default_factory=list)


@dataclass
class Trace:
    platform: str  # "tpu" | "cpu"
    lanes: list  # TracedLane, devices in id order
    runs: dict  # run -> (start_ns, end_ns): each run of the program, across every lane
    by_device: bool  # lanes are devices (named by the trace), not threads


def trace_file(directory: str) -> str:
    """The newest `.xplane.pb` that jax.profiler.trace wrote under `directory`."""
    found = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not found:
        raise TraceFormatError(f"jax.profiler.trace wrote no *.xplane.pb under {directory}: the profiler's output "
                               f"layout changed (expected plugins/profile/<run>/<host>.xplane.pb).")
    return found[-1]


def read_trace(path: str, module: str) -> Trace:
    """The runs of the program whose HLO module is named `module` (`HloModule jit_x` in its text)."""
    import jax

    data = jax.profiler.ProfileData.from_file(path)
    planes = list(data.planes)
    tpus = sorted(((int(TPU_PLANE.match(p.name).group(1)), p) for p in planes if TPU_PLANE.match(p.name)),
                  key=lambda pair: pair[0])
    if tpus:
        return _tpu_trace(tpus, module)
    host = next((p for p in planes if p.name == HOST_PLANE), None)
    if host is None:
        raise TraceFormatError(f"the trace has neither a TPU plane (/device:TPU:N) nor {HOST_PLANE!r}; planes: "
                               f"{[p.name for p in planes]}")
    return _cpu_trace(host, module)


def _stats(event) -> dict:
    return {key: value for key, value in event.stats}


def _lines(plane) -> dict:
    return {line.name: list(line.events) for line in plane.lines}


def _tpu_trace(tpus, module: str) -> Trace:
    lanes, runs = [], {}
    prefix = module + "("
    for device, plane in tpus:
        lines = _lines(plane)
        missing = [n for n in (MODULES_LINE, OPS_LINE) if n not in lines]
        if missing:
            raise TraceFormatError(f"{plane.name} has no line {missing[0]!r}; its lines: {sorted(lines)}")
        modules = [(e.start_ns, e.start_ns + e.duration_ns, _stats(e).get("run_id", index))
                   for index, e in enumerate(lines[MODULES_LINE]) if e.name.startswith(prefix) or e.name == module]
        lane = TracedLane(device, None)

        def run_of(start: float):
            for begin, end, run in modules:
                if begin <= start <= end:
                    return run
            return None

        for event in lines[OPS_LINE]:
            run = run_of(event.start_ns)
            if run is None:
                continue
            named = _INSTRUCTION_TEXT.match(event.name)
            if named is None:
                raise TraceFormatError(f"an {OPS_LINE!r} event is not named by its HLO text: {event.name[:120]!r}")
            lane.ops.append(TracedOp(named.group(1), event.start_ns, event.duration_ns, run))
        for event in lines.get(ASYNC_LINE, ()):
            run = run_of(event.start_ns)
            named = _INSTRUCTION_TEXT.match(event.name)
            if run is not None and named is not None:
                lane.ops.append(TracedOp(named.group(1), event.start_ns, event.duration_ns, run, in_flight=True))
        for begin, end, run in modules:
            known = runs.get((run, device))
            runs[(run, device)] = (begin, end) if known is None else (min(known[0], begin), max(known[1], end))
        lane.ops.sort(key=lambda op: op.start_ns)
        lanes.append(lane)
    return Trace("tpu", lanes, _merged_runs(runs), by_device=True)


def _merged_runs(per_lane: dict) -> dict:
    """run -> (first start, last end) over every lane, runs in order of their start."""
    merged: dict = {}
    for (run, _), (begin, end) in per_lane.items():
        known = merged.get(run)
        merged[run] = (begin, end) if known is None else (min(known[0], begin), max(known[1], end))
    return dict(sorted(merged.items(), key=lambda item: item[1][0]))


def _cpu_trace(host, module: str) -> Trace:
    found = []  # (thread, device or None, TracedOp)
    for line in host.lines:
        open_ops = []  # this thread's ops still running at the current event, outermost first
        for event in sorted(line.events, key=lambda e: e.start_ns):
            while open_ops and open_ops[-1].start_ns + open_ops[-1].duration_ns < event.start_ns:
                open_ops.pop()
            stats = _stats(event)
            if "hlo_op" in stats:
                if stats.get("hlo_module") != module:
                    continue
                device = stats.get("device_ordinal")
                op = TracedOp(str(stats["hlo_op"]), event.start_ns, event.duration_ns, stats.get("run_id"))
                found.append((line.name, int(device) if device is not None else None, op))
                open_ops.append(op)
            elif event.name.startswith(WAIT_PREFIX) and open_ops:
                open_ops[-1].waits.append((event.start_ns, event.duration_ns))  # the innermost op waits
    if not found:
        raise TraceFormatError(f"no event of {HOST_PLANE}'s threads ({[line.name for line in host.lines][:8]}) "
                               f"carries the stats 'hlo_op' and hlo_module={module!r} (the instruction and program "
                               f"it ran): the trace's stats changed, or the program did not run while traced.")
    by_device = all(device is not None for _, device, _ in found)
    lanes: dict = {}
    runs: dict = {}
    for thread, device, op in found:
        key = device if by_device else thread
        lane = lanes.setdefault(key, TracedLane(device if by_device else None, None if by_device else thread))
        lane.ops.append(op)
        begin, end = runs.get((op.run, key), (op.start_ns, op.start_ns + op.duration_ns))
        runs[(op.run, key)] = (min(begin, op.start_ns), max(end, op.start_ns + op.duration_ns))
    for lane in lanes.values():
        lane.ops.sort(key=lambda op: op.start_ns)
    ordered = [lanes[k] for k in sorted(lanes, key=str if not by_device else int)]
    return Trace("cpu", ordered, _merged_runs(runs), by_device)
