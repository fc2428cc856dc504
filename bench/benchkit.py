"""What every section of bench/run.py shares: timing, the report table, the process under test,
child processes, and the in-place profiler.

bench/run.py is the one entry point; it and its section modules (`sections_*.py`) import from here,
never from each other, so the table rows land in one list whatever module adds them.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

DEVICES = 8
TARGET_US = 1000.0  # the per-call workload we tune to (~1 ms)
RATIO_TARGET = 1.10
MARK = "BENCH-JSON "
RUN_PY = Path(__file__).resolve().with_name("run.py")  # children run the entry point again with --child
ENGINE_INDENT = "    "  # profiles: an engine's steps sit this much deeper than the magic layer's action

def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)



# --- timing --------------------------------------------------------------------------------------

@dataclass
class Timing:
    median: float  # seconds per call
    min: float
    samples: list[float] = field(default_factory=list)

    @property
    def us(self) -> float:
        return self.median * 1e6


def interleaved(cases: dict, reps: int, batch: int, warmup: int = 3) -> dict[str, Timing]:
    """Per-call time of each case: `reps` batches of `batch` calls, cases interleaved, order flipped
    every repetition so neither side always runs right after the other."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    samples = {k: [] for k in cases}
    order = list(cases)
    for rep in range(reps):
        for key in (order if rep % 2 == 0 else order[::-1]):
            fn = cases[key]
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            samples[key].append((time.perf_counter() - start) / batch)
    return {k: Timing(statistics.median(v), min(v), v) for k, v in samples.items()}


def paired_ratio(ours: Timing, hand: Timing) -> float:
    """Median of the per-repetition ratios (each repetition ran both sides back to back)."""
    return statistics.median(a / b for a, b in zip(ours.samples, hand.samples))


# --- the table -----------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str, str, str, str, str]] = []
DETAILS: list[str] = []


def row(section, what, ours, reference, ratio="", extra="", target=""):
    ROWS.append((str(section), what, ours, reference, ratio, extra, target))


def detail(text: str) -> None:
    DETAILS.append(text)


def fmt_us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1000:.3f} ms" if us >= 1000 else f"{us:.0f} µs"


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.2f} MiB"


def verdict(ratio: float, target: float = RATIO_TARGET) -> str:
    return f"≤ {target:.2f}: {'meets' if ratio <= target else 'MISSES'}"


def compare_row(section, what, t: dict, ours: str, hand: str, target: float | None = RATIO_TARGET):
    o, h = t[ours], t[hand]
    ratio = o.median / h.median
    row(section, what, f"{fmt_us(o.median)} (min {fmt_us(o.min)})", f"{fmt_us(h.median)} (min {fmt_us(h.min)})",
        f"{ratio:.2f} (paired {paired_ratio(o, h):.2f}, min {o.min / h.min:.2f})",
        f"{(o.median - h.median) * 1e6:+.0f} µs", verdict(ratio, target) if target else "")
    return ratio


def print_table(out=sys.stdout) -> None:
    head = ("#", "measure", "ours", "reference (hand-written / small case)", "ratio", "extra", "target")
    print("| " + " | ".join(head) + " |", file=out)
    print("|" + "|".join("---" for _ in head) + "|", file=out)
    for r in ROWS:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |", file=out)



# --- the process under test ----------------------------------------------------------------------

def start_jax():
    """JAX with 8 simulated CPU devices; on an accelerator (JAX_PLATFORMS=tpu), the devices there are
    (only the sections that say so run there: 15)."""
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)  # before the backend starts
    assert jax.device_count() == DEVICES or jax.default_backend() != "cpu", jax.devices()
    return jax


def make_shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    return InteractiveShell.instance(config=config)


def device_mesh(jax):
    import numpy as np

    return jax.sharding.Mesh(np.array(jax.devices()), ("i",))  # Auto axes, like our engine's mesh


def tune(build, sizes, label: str):
    """The size in `sizes` whose blocking call (hand-written side) is nearest TARGET_US."""
    best = None
    for size in sizes:
        call = build(size)
        t = interleaved({"c": call}, reps=7, batch=10, warmup=3)["c"]
        log(f"tune {label}: size {size} -> {t.us:.0f} µs/call")
        score = abs(t.us - TARGET_US)
        if best is None or score < best[0]:
            best = (score, size, t.us)
        if t.us > TARGET_US:
            break
    return best[1], best[2]



# --- child processes ----------------------------------------------------------------------------

class ChildFailed(RuntimeError):
    pass


#: Byte-compiled modules for the children, kept apart from the source tree: an installed package has its
#: .pyc files, while a machine that sets PYTHONDONTWRITEBYTECODE=1 (this project's shared machines) would
#: make every fresh child compile the package's first-used modules from source on the clock (0.3-0.4 s for
#: a first plan at load 11), a cost the hand-written side, importing only JAX, never pays.
PYCACHE = os.path.join(tempfile.gettempdir(), "jaxpar-bench-pycache")


def run_child(argv: list[str], timeout: float, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, **(env_extra or {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", PYCACHE)
    try:
        proc = subprocess.run([sys.executable, str(RUN_PY), "--child", *argv], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"--child {' '.join(argv)} did not finish in {timeout:.0f} s (hang?)") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise ChildFailed(f"--child {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")



# --- where the time goes (when a ratio misses its target) ---------------------------------------------

def _timed(store: dict, label: str, fn):
    @functools.wraps(fn)  # keeps IPython's marks on a magic (e.g. @output_can_be_silenced)
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            store[label] = store.get(label, 0.0) + time.perf_counter() - start
    return wrapper


def profile_steps(owners: list, run, calls: int) -> list[tuple[str, float | None]]:
    """Inclusive µs per call of each (owner, attribute, label) while `run()` repeats, measured in
    place: each step is wrapped with a perf_counter for this diagnosis only (a wrapper costs well
    under 1 µs), and put back afterwards. A step the package no longer has (renamed, inlined) reads
    None and is printed as such, so a refactoring never takes the report down."""
    store: dict[str, float] = {}
    gone = set()
    with ExitStack() as stack:
        for owner, attr, label in owners:
            present = attr in owner if isinstance(owner, dict) else hasattr(owner, attr)
            if not present:
                gone.add(label)
                continue
            original = owner[attr] if isinstance(owner, dict) else getattr(owner, attr)
            if isinstance(owner, dict):
                stack.enter_context(mock.patch.dict(owner, {attr: _timed(store, label, original)}))
            elif isinstance(owner, type) and isinstance(owner.__dict__.get(attr), staticmethod):
                stack.enter_context(mock.patch.object(owner, attr, staticmethod(_timed(store, label, original))))
            else:
                stack.enter_context(mock.patch.object(owner, attr, _timed(store, label, original)))
        for _ in range(100):
            run()
        store.clear()
        for _ in range(calls):
            run()
    return [(label, None if label in gone else store.get(label, 0.0) / calls * 1e6) for _, _, label in owners]


def ipython_steps(sh, magic: str) -> list:
    """What every re-run of one of our cell magics goes through on the IPython side and in our magic
    layer, down to the action; the engine's steps follow (callers indent them under `ENGINE_INDENT`).
    The line's parse and the cell's transform are cached per text (magics.parse_line,
    magics._transformed): the steps under them run only the first time a text is seen, so they read
    ~0 on re-runs."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import InteractiveShell

    import jaxpar_magic.face.lines as lines
    import jaxpar_magic.face.magics as magics

    try:
        import jaxpar_magic.face.actions as actions
    except ImportError:  # before the magic layer had an actions module
        actions = None
    steps = [
        (InteractiveShell, "run_cell_magic", "IPython InteractiveShell.run_cell_magic (everything)"),
        (DisplayHook, "semicolon_at_end_of_expression",
         "  IPython DisplayHook.semicolon_at_end_of_expression (only for @output_can_be_silenced magics)"),
        (sh.magics_manager.magics["cell"], magic, f"  jaxpar_magic/face/magics.py:JaxparMagics.{magic}"),
        (magics.JaxparMagics, "_run", "    jaxpar_magic/face/magics.py:JaxparMagics._run (parse, run here or on a cluster, show, bind)"),
        (magics, "parse_line", "      jaxpar_magic/face/magics.py:parse_line (the line's options, cached per text)"),
        (lines, "parse_args", "        jaxpar_magic/face/lines.py:parse_args (shell words + the magic's parser; on a cache miss)"),
        (magics, "_transformed", "      jaxpar_magic/face/magics.py:_transformed (the cell's transform, cached per text)"),
        (sh, "transform_cell", "        IPython InteractiveShell.transform_cell (on a cache miss)"),
        (magics, "_running_cluster", "      jaxpar_magic/face/magics.py:_running_cluster (is a cluster running?)"),
        (magics, "_silenced", "      jaxpar_magic/face/magics.py:_silenced (trailing ';')"),
    ]
    if actions is not None:
        steps.append((actions, "run", "      jaxpar_magic/face/actions.py:run (the magic's action, in the kernel)"))
    return steps


def replay_steps(engine, runner, program, jax) -> list:
    """A --no-show re-run's steps when the magic replays it (face/magics.py:_replays): JaxparMagics._run
    calls the engine's replay (stages/run/program.py:replay_function), one flat function down to the
    compiled program and the binding, so these steps sit right under _run; the action's steps
    (ipython_steps' last line and under_action's) then read ~0."""
    import jaxpar_magic.cell.programs as programs

    name = "jaxpar_magic/stages/run/" + engine.__name__.rsplit(".", 1)[-1] + ".py"
    # The outputs as the user's types: pmap's _outputs (--merge), shard's _placed_and_outputs (placed inputs,
    # NNX write-backs), else the program's own bound_outputs.
    owner, outputs, where = next(((engine, n, name) for n in ("_outputs", "_placed_and_outputs") if hasattr(engine, n)),
                                 (programs.CellProgram, "bound_outputs", "jaxpar_magic/cell/programs.py"))
    return [
        (programs.Rerun, "args", "      replay: jaxpar_magic/cell/programs.py:Rerun.args (the input checks)"),
        (programs.Rerun, "deleted_error", "      replay: jaxpar_magic/cell/programs.py:Rerun.deleted_error (a donated input?)"),
        (program, "jitted", "      replay: the compiled program's call (dispatch)"),
        (jax, "block_until_ready", "      replay: jax.block_until_ready (waiting for the devices)"),
        (owner, outputs, f"      replay: {where}:{outputs} (the outputs as the user's types)"),
        (runner, "bind_results", "      replay: jaxpar_magic/cell/bindings.py:bind_results (binding; frees what it replaces)"),
    ]


def under_action(owners: list) -> list:
    """Engine steps, indented to sit under ipython_steps' last line (the action)."""
    return [(owner, attr, ENGINE_INDENT + label) for owner, attr, label in owners]


def print_profile(title: str, lines, out=sys.stdout) -> None:
    print(f"\n{title}", file=out)
    for label, us in lines:
        shown = "     n/a   " if us is None else f"{us:8.1f} µs"
        print(f"  {shown}  {label}" + (" (not in this version of the package)" if us is None else ""), file=out)



# --- small shared pieces -------------------------------------------------------------------------

def emit(data: dict) -> None:
    """A child's result: one marked JSON line on stdout (run_child reads the last one)."""
    print(MARK + json.dumps(data), flush=True)


@functools.lru_cache(maxsize=1)
def compile_events() -> list[float]:
    """Every XLA compile of this process from now on, as its duration in seconds (jax.monitoring's
    backend_compile events). Registered once; callers compare lengths before and after."""
    import jax.monitoring

    events: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: events.append(secs) if event == "/jax/core/compile/backend_compile_duration" else None)
    return events


def shown_widgets(captured) -> list:
    """The widgets a cell displayed (IPython's capture_output), found by the model ids in the
    captured mime bundles, as the test suite finds them."""
    from ipywidgets.widgets.widget import _instances  # ipywidgets' registry of live widgets, by model id

    found = []
    for output in captured.outputs:
        ref = output.data.get("application/vnd.jupyter.widget-view+json")
        if ref is not None and ref["model_id"] in _instances:
            found.append(_instances[ref["model_id"]])
    return found
