"""A measured profile (`Profile`, bound as `_profile`): the trace's runs of one program (xplane.py)
as steps, lanes of timed events, ops ranked by time, the share of a step in compute, collectives,
copies and waiting, and each collective measured.

Times are seconds. An event's `start_s` counts from the start of its step, so steps overlay; an
op's `total_s` and `count` are per step and per lane (averaged over the lanes and steps traced), so
they read against `step_s`.

Plain Python; no JAX.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .intervals import clip, measure, subtract, union
from .ops import ProgramOps

NS = 1e-9


@dataclass(frozen=True)
class Event:
    name: str  # the instruction, as compiled.as_text() names it
    kind: str  # compute | collective | copy | wait
    start_s: float  # from the start of its step
    duration_s: float
    line: int | None  # the cell's line that made it, when the program's metadata says
    step: int
    what: str = ""  # what JAX called it: "dot_general", "psum"
    collective: str | None = None  # the collective it runs, or waits for: "all-reduce"
    in_flight: bool = False  # an asynchronous collective or copy in flight (TPU), not the device's own work


@dataclass
class Lane:
    label: str  # "TPU 0", "device 3", "thread tf_XLAEigen/…"
    device: int | None  # the device's id, where the trace names the device
    thread: str | None  # the XLA:CPU thread, where it does not
    events: list = field(default_factory=list)


@dataclass(frozen=True)
class Op:
    """One instruction's time, per step and lane."""

    name: str
    kind: str
    count: float  # runs per step and lane (a collective in a 3-trip loop: 3)
    total_s: float  # seconds per step and lane
    line: int | None
    what: str = ""
    collective: str | None = None
    wait_s: float = 0.0  # of total_s, spent waiting for the other devices (XLA:CPU's rendezvous)
    origin: tuple | None = None  # (file, line, function) inside a function the cell calls


@dataclass(frozen=True)
class MeasuredCollective:
    """One collective instruction (an async one's start, flight and done together), per step and lane."""

    name: str
    op: str  # all-reduce, all-gather, ...
    line: int | None
    count: float
    time_s: float  # from its start to its end (in flight, for an asynchronous one)
    wait_s: float  # the device stalled for it: its rendezvous (XLA:CPU), its done (TPU)
    overlapped_s: float  # of time_s, while the same device computed


@dataclass
class Profile:
    step_s: float  # the median measured step: the program's run on the devices, first op to last
    wall_s: float  # the median wall-clock time of the same calls, from the call to its results ready
    step_times_s: list
    wall_times_s: list
    lanes: list  # Lane
    ops: list  # Op, by total time
    collectives: list  # MeasuredCollective, in program order
    shares: dict  # of the step: compute, collective, wait, copy, idle (they add up to 1), and overlapped
    source: str  # what was traced and how
    platform: str  # "tpu" | "cpu"
    module: str
    notes: list = field(default_factory=list)  # what the reader should know (unmatched names, missing runs)
    beside: object = None  # beside.Beside: the plan's estimate beside the measurement, when one was made
    filename: str | None = None
    result: object = None  # profile(fn, *args): the value of the usual call, before the profiled ones

    @property
    def steps(self) -> int:
        return len(self.step_times_s)

    def summary(self) -> str:
        """One paragraph: the step, its shares, the plan beside it."""
        from .state import summary_text

        return summary_text(self)

    def state(self, title: str) -> dict:
        """The profile view's state: small summaries, events capped per lane (state.py)."""
        from .state import profile_state

        return profile_state(self, title)

    def view(self, title: str | None = None):
        """The profile view (views/profile.py) of this profile."""
        from ...views.profile import ProfileView

        return ProfileView(state=self.state(title or f"profile of {self.module}: {self.steps} runs"))

    def _ipython_display_(self, **kwargs) -> None:
        self.view()._ipython_display_(**kwargs)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.summary())


def summarise(trace, walls: list, program: ProgramOps, *, cores: int | None = None) -> Profile:
    """The Profile of `trace` (xplane.Trace of `program`'s runs) and the calls' wall-clock times."""
    runs = list(trace.runs.items())
    step_of = {run: index for index, (run, _) in enumerate(runs)}
    starts = [begin for _, (begin, _) in runs]
    spans = [(end - begin) * NS for _, (begin, end) in runs]
    lanes, unknown, contained = [], set(), 0
    for traced in trace.lanes:
        lane = Lane(_label(trace, traced), traced.device, traced.thread)
        ops = [op for op in traced.ops if op.run in step_of]
        for index, op in enumerate(ops):
            facts = program.facts(op.name)
            if facts is None:
                unknown.add(op.name)
                continue
            if facts.container and _holds_next(ops, index):
                contained += 1
                continue
            step = step_of[op.run]
            origin = starts[step]
            kind = facts.kind
            lane.events.append(Event(op.name, kind, (op.start_ns - origin) * NS, op.duration_ns * NS, facts.line,
                                     step, facts.what, facts.collective, op.in_flight))
            for begin, duration in op.waits:
                lane.events.append(Event(op.name, "wait", (begin - origin) * NS, duration * NS, facts.line, step,
                                         facts.what, facts.collective))
        lane.events.sort(key=lambda e: (e.step, e.start_s))
        lanes.append(lane)
    notes = []
    if unknown:
        shown = ", ".join(sorted(unknown)[:5])
        notes.append(f"{len(unknown)} instruction name(s) in the trace are not in the compiled program ({shown}); "
                     f"they are left out.")
    profile = Profile(
        step_s=statistics.median(spans) if spans else 0.0,
        wall_s=statistics.median(walls) if walls else 0.0,
        step_times_s=spans, wall_times_s=list(walls), lanes=lanes,
        ops=_ranked(lanes, program, len(runs)), collectives=_collectives(lanes, program, len(runs)),
        shares=_shares(lanes, spans), source=_source(trace, len(runs), cores), platform=trace.platform,
        module=program.module or "", notes=notes,
    )
    if len(runs) != len(walls):
        notes.append(f"{len(walls)} calls were traced but the trace holds {len(runs)} runs of the program.")
    return profile


def _label(trace, traced) -> str:
    if traced.device is not None:
        return f"TPU {traced.device}" if trace.platform == "tpu" else f"device {traced.device}"
    return f"thread {traced.thread}"


def _holds_next(ops: list, index: int) -> bool:
    """Whether the op at `index` (a while, conditional or call) holds the next op of its run: its
    body's instructions are then on the timeline themselves."""
    op = ops[index]
    end = op.start_ns + op.duration_ns
    following = next((o for o in ops[index + 1:] if o.run == op.run), None)
    return following is not None and following.start_ns <= end


def _source(trace, steps: int, cores: int | None) -> str:
    if trace.platform == "tpu":
        return f"TPU device trace, {steps} steps"
    if trace.by_device:
        shared = f"; {len(trace.lanes)} simulated devices share this machine's {cores} cores" if cores else ""
        return (f"XLA:CPU thread trace, {steps} steps: CPU threads are not devices (each op is drawn on the "
                f"simulated device XLA:CPU ran it for{shared})")
    return f"XLA:CPU thread trace, {steps} steps: CPU threads are not devices (one lane per thread)"


def _ranked(lanes: list, program: ProgramOps, steps: int) -> list:
    """Every instruction's own run time (in-flight spans left out), per step and lane, largest first."""
    per = max(1, steps) * max(1, len(lanes))
    totals: dict = {}
    for lane in lanes:
        for e in lane.events:
            if e.in_flight:
                continue
            entry = totals.setdefault(e.name, [0, 0.0, 0.0])
            if e.kind == "wait" and program.facts(e.name).kind != "wait":
                entry[2] += e.duration_s  # a wait inside the op's own run
                continue
            entry[0] += 1
            entry[1] += e.duration_s
    ops = []
    for name, (count, total, wait) in totals.items():
        facts = program.facts(name)
        ops.append(Op(name, facts.kind, count / per, total / per, facts.line, facts.what, facts.collective,
                      wait / per, facts.origin))
    return sorted(ops, key=lambda o: -o.total_s)


def _collectives(lanes: list, program: ProgramOps, steps: int) -> list:
    """Each collective, per step and lane: its time (start to end, in flight for async ones), the
    device's stall for it, and how much of it the same device spent computing."""
    per = max(1, steps) * max(1, len(lanes))
    found: dict = {}
    for lane in lanes:
        by_step: dict = {}
        for e in lane.events:
            by_step.setdefault(e.step, []).append(e)
        for events in by_step.values():
            compute = union((e.start_s, e.start_s + e.duration_s) for e in events if e.kind == "compute")
            for e in events:
                if e.collective is None:
                    continue
                group = program.group_of(e.name)
                entry = found.setdefault(group, {"count": 0, "time": 0.0, "wait": 0.0, "over": 0.0, "first": e})
                span = [(e.start_s, e.start_s + e.duration_s)]
                if e.kind == "wait":
                    entry["wait"] += e.duration_s
                    if program.facts(e.name).kind != "wait":
                        continue  # a rendezvous inside the collective's own run, counted there
                else:
                    entry["count"] += 0 if e.in_flight else 1
                entry["time"] += e.duration_s
                entry["over"] += max(0.0, e.duration_s - measure(subtract(span, compute)))
    rows = []
    for name in program.order(found):
        entry = found[name]
        facts = program.facts(name)
        rows.append(MeasuredCollective(name, facts.collective or entry["first"].collective, facts.line,
                                       entry["count"] / per, entry["time"] / per, entry["wait"] / per,
                                       entry["over"] / per))
    return rows


def _shares(lanes: list, spans: list) -> dict:
    """The step's time by what the device did, averaged over lanes and steps: compute first, then
    waiting, then collectives, then copies (each counts only the time the ones before leave), and
    what is left is idle. `overlapped`: collective time while the same device computed."""
    keys = ("compute", "wait", "collective", "copy")
    sums = dict.fromkeys(keys + ("idle", "overlapped"), 0.0)
    counted = 0
    for lane in lanes:
        by_step: dict = {}
        for e in lane.events:
            by_step.setdefault(e.step, []).append(e)
        for step, events in by_step.items():
            span = spans[step] if step < len(spans) else 0.0
            if span <= 0:
                continue
            covered: list = []
            unions = {k: clip(union((e.start_s, e.start_s + e.duration_s) for e in events if e.kind == k), 0.0, span)
                      for k in keys}
            for key in keys:
                own = subtract(unions[key], covered)
                sums[key] += measure(own) / span
                covered = union(covered + own)
            sums["idle"] += max(0.0, 1.0 - measure(covered) / span)
            sums["overlapped"] += (measure(unions["collective"]) - measure(subtract(unions["collective"],
                                                                                   unions["compute"]))) / span
            counted += 1
    return {k: v / counted for k, v in sums.items()} if counted else sums
