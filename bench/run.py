"""Benchmark of jaxpar_magic against hand-written JAX doing the same work.

Run from the repository root with the project's venv, after installing the package (clear
setuptools' build/lib first: files deleted or renamed in the source tree stay in it and would be
installed again):

    rm -rf build/lib && .venv/bin/pip install --no-deps -q .
    .venv/bin/python bench/run.py

It prints one table (markdown) of ratios against hand-written JAX, then the details each row
rests on. Speed is measured here, never in the tests. The machine this was written for has 2
cores and no GPU; the script asks JAX for 8 simulated CPU devices before the backend starts.

Sections (numbers match the table):
  1. re-running a cached `%%pmap` cell (block mode, --no-show) vs a hand-written `jax.pmap`
     (1b: both as whole `run_cell` cells; 1c: with the result view shown, the default;
     1d: control, the cell's compiled program called directly). An identical re-run takes the
     engine's short path (runner.Rerun: same input shapes and dtypes, same constants) straight
     to the compiled program; the profile shows whether it did.
  2. a `%%pmap`-defined function (ParallelFunction) vs `jax.pmap`; 2b: what the CPU-collective
     guard (blocking on every call of a program with collectives) costs, with and without them
  3. cold start in fresh subprocesses: `%load_ext` + first `%%pmap` cell vs `import jax` + first
     pmap call; and `import jaxpar_magic` + `%load_ext` vs `import jax`
  4. re-running a cached `%%shard` cell vs `jax.jit` on NamedSharding inputs (4b: control; 4c: both as
     whole `run_cell` cells)
  5. the collectives of the compiled `%%shard` program vs the hand-written one
  6. bytes each view sends to the browser, small vs large
  7. Chromium rendering the 4,096-device mesh view (skipped, with the reason, when Chromium,
     Playwright or js/mesh.js is missing)
  8. memory over 300 distinct `%%pmap` cells, each over a fresh 8 MiB input, vs hand-written
     `jax.pmap` over 300 distinct functions: RSS and heap growth over the last 200, what our caches
     hold, the same after `jax.clear_caches()` (fresh processes; sections_memory.py)
  9. re-running a cached `%%shard_map` cell (block matmul, 4x2 mesh) vs a hand-written
     `jax.jit(jax.shard_map(...))` (9b: control; sections_engines.py)
 10. `--collectives`: a cell's first run with it vs without it (fresh cell texts, both compile);
     10b: a cached re-run without the flag after one with it vs a plain cached re-run
     (sections_engines.py)
 11. `%%shard --plan` of the issue's train step on 512 simulated devices vs the bare
     `jax.jit(f).lower(...).compile()` (fresh processes; sections_plan.py)
11d. the same kind of plan compiled by XLA:TPU for a v5e 4x4 slice (16 chips, libtpu) vs a bare
     XLA:TPU compile for the same compile-only slice (fresh processes; skipped without libtpu)
 12. `%cluster` with 2 processes x 4 devices on loopback: start, a cached `%%pmap` re-run on the
     cluster vs the same computation sent by hand through ipyparallel (as `%%px` sends it),
     `%cluster gather` of 8 MiB, stop (one child process; sections_cluster.py; its rows say why when
     the cluster magics are not there or not wired yet)
 13. a training step over a 64-leaf params pytree (8 devices): a cached `%%shard` re-run that binds a
     new params dict every run vs `jax.jit` (13b: both as whole cells), and the same step defined
     in a `%%pmap` cell (function mode) vs `jax.pmap` (13c; sections_pytrees.py)
 14. a Flax NNX training step (nnx.Optimizer) through `%%shard --out loss`, the gradients a
     temporary, vs `nnx.jit` (14b: the cell without --out, binding the gradients too); 14c the same
     MLP in Equinox vs `eqx.filter_jit`, 14d as a params dict with an optax state vs `jax.jit`
     (sections_flax.py)
 15. loops of cached cells vs loops of asynchronous `jax.jit` calls that never wait, a tiny step and
     a ~2 ms one, each loop timed until its last result is ready: `%%shard --no-show` (15), with
     `--in x=P()` (15b), and shown cells, `%%shard` with its sharding view and `%%shard_map` with its
     result view (15c: what showing adds over --no-show) (sections_async.py). On a TPU VM:
     `JAX_PLATFORMS=tpu python bench/run.py --only 15` uses the chips there are.
When a ratio misses its target (and always with --profile), the run ends with where our time per
call goes, step by step, measured in place. `--skip 2 3 7` leaves out the slowest subprocess and
browser sections; `--only 9 10` runs just those. Shared helpers (timing, the table, children,
the profiler) live in benchkit.py; the sections 8-12 in the sections_*.py modules beside this file.

Timing method: every comparison interleaves its cases (ours, hand-written, ours, ...; the order
flips every repetition), times batches of calls with `time.perf_counter`, and reports the median
(and the minimum) per call over the repetitions. Both sides block on each result: on a 2-core
machine XLA's CPU collectives deadlock when ~50-70 collective programs are in flight, so the
hand-written side has to block too to survive (our engine blocks for the same reason).

First runs (section 10) and one-off figures (3, 8, 11, 12) are timed once per run or per fresh
process and reported as medians, with every run in the details.

`--child MODE` is internal: the script runs itself in fresh subprocesses for the cold-start,
guard, memory, 512-device plan and cluster measurements (each with a timeout: a hang or a crash
there must not take the whole run down, and the run never waits forever).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Every section simulates CPU devices: with the optional libtpu installed (section 11d), JAX would
# otherwise probe for a TPU first and print libtpu's start-up warnings (children inherit this).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sections_async  # noqa: E402
import sections_cluster
import sections_engines
import sections_flax
import sections_memory
import sections_plan
import sections_pytrees
from benchkit import (
    DETAILS, DEVICES, RATIO_TARGET, ChildFailed, Timing, compare_row, detail, device_mesh, emit, fmt_bytes,
    fmt_us, interleaved, ipython_steps, log, make_shell, paired_ratio, print_profile, print_table, profile_steps, row,
    replay_steps, run_child, shown_widgets, start_jax, tune, under_action,
)

PMAP_SRC = "y = lax.psum(x @ x, 'i')\n"
PMAP_FN_SRC = "def step(x):\n    return lax.psum(x @ x, 'i')\n"
SHARD_SRC = "c = a @ b\n"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ORIGIN = "http://jpm.bench"


def engine_module():
    """The %%pmap run stage's module, found through its public twin (its file name has changed before)."""
    import jaxpar_magic

    return sys.modules[jaxpar_magic.pmap_cell.__module__]


# --- 1 and 2: %%pmap ------------------------------------------------------------------------------

def bench_pmap(jax, sh, args):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = device_mesh(jax)
    sharding = NamedSharding(mesh, P("i"))
    hand = jax.pmap(lambda x: lax.psum(x @ x, "i"), axis_name="i")

    def build(n):
        x = jax.device_put(jnp.ones((DEVICES, n, n), jnp.float32), sharding)
        return lambda: jax.block_until_ready(hand(x))

    n, tuned_us = tune(build, [96, 128, 160, 192, 224, 256, 320], "pmap workload n")
    x = jax.device_put(jnp.ones((DEVICES, n, n), jnp.float32), sharding)
    detail(f"1-2. workload: per device `lax.psum(x @ x, 'i')` with x[{DEVICES}, {n}, {n}] float32, already "
           f"distributed (NamedSharding P('i'), as a previous cell's output would be); hand-written "
           f"`jax.pmap` blocking each call: {tuned_us:.0f} µs when tuned.")

    sh.user_ns.update(x=x, lax=lax, jax=jax, hand=hand)
    sh.run_cell_magic("pmap", "--no-show", PMAP_SRC)  # compile once: every later run hits the cache
    ns = {}

    def hand_call():
        ns["y"] = hand(x)
        jax.block_until_ready(ns["y"])

    engine = engine_module()
    program = engine._block_cache[next(k for k in engine._block_cache if k[0] == PMAP_SRC)]
    cases = {
        "ours": lambda: sh.run_cell_magic("pmap", "--no-show", PMAP_SRC),
        "hand": hand_call,
        "ours' program": lambda: jax.block_until_ready(program.jitted([x])),
        "ours (run_cell)": lambda: sh.run_cell("%%pmap --no-show\n" + PMAP_SRC),
        "hand (run_cell)": lambda: sh.run_cell("y = hand(x)\n_ = jax.block_until_ready(y)"),
    }
    t = interleaved(cases, reps=args.reps, batch=20)
    from IPython.utils.capture import capture_output

    def captured(fn):
        def go():
            with capture_output():  # the view's text form would go to the terminal
                fn()
        return go

    t_show = interleaved({"ours (view)": captured(lambda: sh.run_cell_magic("pmap", "", PMAP_SRC)),
                          "hand": captured(hand_call)}, reps=max(5, args.reps // 4), batch=10)
    r1 = compare_row(1, "cached `%%pmap` cell re-run (block mode, --no-show) vs `jax.pmap` + block, "
                        "per call (`shell.run_cell_magic` vs a direct call)", t, "ours", "hand")
    compare_row("1b", "same, both through `shell.run_cell` (a whole notebook cell each side)", t,
                "ours (run_cell)", "hand (run_cell)", target=None)
    compare_row("1c", "same cell re-run showing its result view (the default; builds the per-device summary and "
                      "the widget, output captured) vs `jax.pmap` + block", t_show, "ours (view)", "hand", target=None)
    compare_row("1d", "control: the cell's cached compiled program (`jit(shard_map)`) called directly + block "
                      "vs `jax.pmap` + block: the engine's program itself", t, "ours' program", "hand", target=None)
    assert sh.user_ns["y"].shape == (DEVICES, n, n)

    # 2. function mode: the cell binds `step` as our ParallelFunction.
    sh.run_cell_magic("pmap", "--no-show", PMAP_FN_SRC)
    step = sh.user_ns["step"]
    jax.block_until_ready(step(x))
    t2 = interleaved({
        "ours": lambda: jax.block_until_ready(step(x)),
        "hand": lambda: jax.block_until_ready(hand(x)),
    }, reps=args.reps, batch=20)
    r2 = compare_row(2, f"`%%pmap`-defined function call ({type(step).__name__}) vs `jax.pmap`, both "
                        "blocking each call", t2, "ours", "hand")
    return n, x, {"1": r1, "2": r2}


def child_guard(n: int, reps: int) -> dict:
    """2b, in its own process: what blocking on every call costs, for programs without and with
    collectives. Streams dispatch 4 calls, then block once (4 in flight stays far below the
    ~50-70 at which 2-core CPU collectives deadlock, and already lets Python dispatch overlap the
    devices' work, which is all that blocking takes away)."""
    jax = start_jax()
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxpar_magic import pmap as our_pmap  # the twin of %%pmap in function mode

    mesh = device_mesh(jax)
    x = jax.device_put(jnp.ones((DEVICES, n, n), jnp.float32), NamedSharding(mesh, P("i")))
    stream = 4

    def with_coll(v):
        return lax.psum(v @ v, "i")

    def without(v):
        return jnp.tanh(v @ v)

    result = {}
    for label, fn in (("without", without), ("with", with_coll)):
        ours = our_pmap(fn, axis_name="i")
        hand = jax.pmap(fn, axis_name="i")
        jax.block_until_ready(ours(x))
        jax.block_until_ready(hand(x))
        slots = list(getattr(ours, "_jitted", {}).values())  # [program, needs the guard] per configuration
        guarded = bool(slots[0][1]) if slots else "unknown"

        def run_stream(f):
            def go():
                outs = [f(x) for _ in range(stream)]
                jax.block_until_ready(outs)
            return go

        def run_each(f):
            def go():
                for _ in range(stream):
                    jax.block_until_ready(f(x))
            return go

        t = interleaved({
            "ours stream": run_stream(ours), "hand stream": run_stream(hand),
            "ours each": run_each(ours), "hand each": run_each(hand),
        }, reps=reps, batch=3)
        result[label] = {"guarded": guarded, **{k: [v.median / stream, v.min / stream, [s / stream for s in v.samples]]
                                                for k, v in t.items()}}
    return result


def bench_guard(n: int, args):
    try:
        data = run_child(["guard", str(n), str(args.reps)], timeout=240)
    except ChildFailed as exc:
        row("2b", "CPU-collective guard", "failed", "", "", "", str(exc)[:120])
        return
    for label in ("without", "with"):
        d = {k: Timing(*v) for k, v in data[label].items() if k != "guarded"}
        guarded = data[label]["guarded"]
        o, h = d["ours stream"], d["hand stream"]
        row("2b", f"program {label.upper()} collectives (our guard {'blocks' if guarded else 'does not block'}): "
                  f"ours called 4× back to back then one block, vs `jax.pmap` the same way (per call)",
            fmt_us(o.median), fmt_us(h.median), f"{o.median / h.median:.2f} (paired {paired_ratio(o, h):.2f})",
            f"{(o.median - h.median) * 1e6:+.0f} µs", "")
        he = d["hand each"]
        row("2b", f"program {label.upper()} collectives: what blocking every call costs hand-written `jax.pmap` "
                  "(block each vs 4 in flight)", fmt_us(he.median), fmt_us(h.median),
            f"{he.median / h.median:.2f} (paired {paired_ratio(he, h):.2f})", f"{(he.median - h.median) * 1e6:+.0f} µs", "")
        detail(f"2b. {label} collectives: ours streamed {fmt_us(o.median)}, ours blocking each {fmt_us(d['ours each'].median)}, "
               f"pmap streamed {fmt_us(h.median)}, pmap blocking each {fmt_us(he.median)} (medians per call; "
               f"guard active in ours: {guarded}).")


# --- 3: cold start ---------------------------------------------------------------------------------

def child_cold(kind: str, n: int) -> dict:
    """One cold start, timed from a ready IPython shell (a kernel has one before any cell runs)."""
    sh = make_shell()
    setup = ("import jax\nimport jax.numpy as jnp\nfrom jax import lax\n"
             f"x = jnp.ones(({DEVICES}, {n}, {n}), jnp.float32)\n")
    start = time.perf_counter()
    if kind == "import-ours":
        import jaxpar_magic  # noqa: F401

        sh.run_line_magic("load_ext", "jaxpar_magic")
        return {"s": time.perf_counter() - start, "jax_imported": "jax" in sys.modules}
    if kind == "import-jax":
        import jax  # noqa: F401

        return {"s": time.perf_counter() - start, "jax_imported": True}
    import jax.monitoring  # imports jax inside the clock, as both sides must anyway; counts XLA compiles

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(secs) if event == "/jax/core/compile/backend_compile_duration" else None)
    if kind.startswith("ours"):
        sh.run_line_magic("load_ext", "jaxpar_magic")
        exec(setup, sh.user_ns)
        from IPython.utils.capture import capture_output

        with capture_output():  # the view's text form would go to the terminal
            sh.run_cell_magic("pmap", "" if kind == "ours-show" else "--no-show", PMAP_SRC)
        y = sh.user_ns["y"]
    else:
        ns = {}
        exec(setup + "hand = jax.pmap(lambda x: lax.psum(x @ x, 'i'), axis_name='i')\ny = hand(x)\n", ns)
        y = ns["y"]
    import jax

    jax.block_until_ready(y)
    elapsed = time.perf_counter() - start
    assert jax.device_count() == DEVICES and y.shape == (DEVICES, n, n)
    return {"s": elapsed, "compiles": len(compiles), "compile_s": sum(compiles),
            "widgets_imported": "anywidget" in sys.modules}


def bench_cold(n: int, args):
    env = {"JAX_NUM_CPU_DEVICES": str(DEVICES)}  # both sides: 8 devices without %devices --simulate
    runs: dict[str, list[float]] = {k: [] for k in ("ours-show", "ours", "hand", "import-ours", "import-jax")}
    extra = {}
    for i in range(args.cold_runs):
        for kind in (("ours-show", "ours", "hand") if i % 2 == 0 else ("hand", "ours", "ours-show")):
            data = run_child(["cold", kind, str(n)], timeout=180, env_extra=env)
            runs[kind].append(data["s"])
            extra[kind] = data
        log(f"cold start run {i + 1}/{args.cold_runs}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items() if v))
    for i in range(args.cold_runs):
        for kind in ("import-ours", "import-jax") if i % 2 == 0 else ("import-jax", "import-ours"):
            data = run_child(["cold", kind, str(n)], timeout=120, env_extra=env)
            runs[kind].append(data["s"])
            if kind == "import-ours":
                extra["jax_imported"] = data["jax_imported"]
    med = {k: statistics.median(v) for k, v in runs.items()}
    for kind, what in (("ours-show", "first `%%pmap` cell, showing its result view (the default)"),
                       ("ours", "first `%%pmap --no-show` cell")):
        row(3, f"cold start: `%load_ext jaxpar_magic` + {what} vs `import jax` + first `jax.pmap` call "
               f"(fresh process, median of {args.cold_runs})",
            f"{med[kind]:.2f} s", f"{med['hand']:.2f} s", f"{med[kind] / med['hand']:.2f}",
            f"{med[kind] - med['hand']:+.2f} s", "")
    row(3, f"import alone: `import jaxpar_magic` + `%load_ext` vs `import jax` (median of {args.cold_runs}; "
           f"jax imported by ours: {extra.get('jax_imported')})",
        f"{med['import-ours'] * 1e3:.0f} ms", f"{med['import-jax'] * 1e3:.0f} ms",
        f"{med['import-ours'] / med['import-jax']:.2f}", f"{(med['import-ours'] - med['import-jax']) * 1e3:+.0f} ms", "")
    detail("3. cold-start runs (s): " + "; ".join(f"{k}: {', '.join(f'{v:.2f}' for v in vals)}" for k, vals in runs.items()))
    detail("3. XLA compiles in the last run of each (jax.monitoring backend_compile events): " + "; ".join(
        f"{k}: {extra[k]['compiles']} compiles, {extra[k]['compile_s'] * 1e3:.0f} ms, anywidget imported: "
        f"{extra[k]['widgets_imported']}" for k in ("ours-show", "ours", "hand")))
    detail("3. each run is a fresh `python` with JAX_NUM_CPU_DEVICES=8; the clock starts once an InteractiveShell "
           "exists (Python and IPython start-up are outside it, on both sides) and stops when y is ready.")


# --- 4 and 5: %%shard -------------------------------------------------------------------------------

def bench_shard(jax, sh, args):
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxpar_magic.stages.run.shard as shard_engine
    from jaxpar_magic.cell.hlo import collectives

    sh.run_line_magic("mesh", "data=8 --no-show")
    mesh = sh.user_ns["mesh"]
    spec_a, spec_b = P(None, "data"), P("data", None)  # contraction dimension split: partial sums, all-reduce
    hand = jax.jit(lambda a, b: a @ b)

    def build(k):
        a = jax.device_put(jnp.ones((k, k), jnp.float32), NamedSharding(mesh, spec_a))
        b = jax.device_put(jnp.ones((k, k), jnp.float32), NamedSharding(mesh, spec_b))
        return lambda: jax.block_until_ready(hand(a, b))

    k, tuned_us = tune(build, [256, 384, 512, 640, 768, 1024], "shard workload k")
    a = jax.device_put(jnp.ones((k, k), jnp.float32), NamedSharding(mesh, spec_a))
    b = jax.device_put(jnp.ones((k, k), jnp.float32), NamedSharding(mesh, spec_b))
    detail(f"4-5. workload: `c = a @ b` with a, b [{k}, {k}] float32, a split P(None, 'data'), b split "
           f"P('data', None) over the 8-device mesh (the contraction is split: partial sums, then an "
           f"all-reduce); hand-written `jax.jit` blocking each call: {tuned_us:.0f} µs when tuned.")
    line = "--mesh mesh --in a=None,data b=data,None --no-show"
    sh.user_ns.update(a=a, b=b)
    sh.run_cell_magic("shard", line, SHARD_SRC)
    assert sh.user_ns["a"] is a, "re-placing an already placed input should return it unchanged"
    ns = {}

    def hand_call():
        ns["c"] = hand(a, b)
        jax.block_until_ready(ns["c"])

    program = shard_engine._cache[next(k for k in shard_engine._cache if k[0] == SHARD_SRC)]

    def program_call():  # the engine enters the mesh inside its traced function, so a plain call
        jax.block_until_ready(program.jitted([a], [b]))  # one flat list of leaves per input

    sh.user_ns.update(shard_hand=hand, jax=jax)
    t = interleaved({"ours": lambda: sh.run_cell_magic("shard", line, SHARD_SRC), "hand": hand_call,
                     "ours' program": program_call,
                     "ours (run_cell)": lambda: sh.run_cell(f"%%shard {line}\n{SHARD_SRC}"),
                     "hand (run_cell)": lambda: sh.run_cell("c = shard_hand(a, b)\n_ = jax.block_until_ready(c)")},
                    reps=args.reps, batch=20)
    r4 = compare_row(4, "cached `%%shard` cell re-run (--no-show) vs `jax.jit` on NamedSharding inputs + block",
                     t, "ours", "hand")
    compare_row("4b", "control: the cell's cached compiled program called directly + block "
                      "vs the hand-written `jax.jit` + block", t, "ours' program", "hand", target=None)
    compare_row("4c", "same as 4, both through `shell.run_cell` (a whole notebook cell each side)", t,
                "ours (run_cell)", "hand (run_cell)", target=None)
    import numpy as np

    assert np.allclose(np.asarray(sh.user_ns["c"]), np.asarray(ns["c"]))

    # 5. the compiled programs' collectives.
    ids = [d.id for d in mesh.devices.flat]
    ours_text = program.jitted.lower([a], [b]).compile().as_text()
    hand_text = hand.lower(a, b).compile().as_text()
    ours_c, hand_c = collectives(ours_text, ids), collectives(hand_text, ids)
    report = shard_engine.shard_cell(SHARD_SRC, dict(sh.user_ns), mesh=mesh,
                                     in_specs={"a": (None, "data"), "b": ("data", None)}, want_facts=True, bind=False)

    def key(c):
        return (c.op, c.shape, c.bytes, c.groups, c.pairs)

    match = [key(c) for c in ours_c] == [key(c) for c in hand_c]
    row(5, "collectives in the compiled `%%shard` program vs the hand-written `jax.jit` (count, bytes per device)",
        f"{len(ours_c)}: {sum(c.bytes for c in ours_c)} B", f"{len(hand_c)}: {sum(c.bytes for c in hand_c)} B",
        "match" if match else "DIFFER", "", "same collectives")
    for name, found in (("ours", ours_c), ("hand-written", hand_c), ("ours, as --report shows it", report.facts.collectives)):
        detail(f"5. {name}: " + ("; ".join(f"{c.op} {c.shape} {c.bytes} B groups={c.groups}" for c in found) or "none"))
    return {"4": r4}


# --- 6: bytes sent to the browser --------------------------------------------------------------------

def view_sizes(view) -> dict:
    """What a view costs on the wire: its synced `state` as JSON (jupyter_client's packer:
    json.dumps, default separators), the whole widget state (adds the bundled ES module and CSS,
    sent with every instance), and the static text/html and text/plain forms."""
    return {
        "state": len(json.dumps(view.state, ensure_ascii=False).encode()),
        "widget": len(json.dumps(view.get_state(), ensure_ascii=False, default=str).encode()),
        "html": len(view.to_html().encode()),
        "text": len(view.to_text().encode()),
    }


def bench_views(jax, sh, n_pmap):
    import jax.numpy as jnp

    from jaxpar_magic.face.magics import show_mesh, show_sharding
    from jaxpar_magic.engines.shard import make_mesh, place, plan
    from jaxpar_magic.views.values import per_device_summary
    from jaxpar_magic.views import ResultView

    mesh8 = make_mesh("data=8")
    big = make_mesh("x=16 y=16 z=16", abstract=True)
    pairs = []
    pairs.append(("mesh view: 4,096-position AbstractMesh (16,16,16) vs 8-device mesh",
                  show_mesh(big), show_mesh(mesh8)))
    pairs.append(("sharding view: 4,096 shards (plan [4096,4096,4096] f32 over the (16,16,16) AbstractMesh, "
                  "P(x,y,z)) vs 8 shards (jax.Array [64,128] f32, P(data))",
                  show_sharding(plan((4096, 4096, 4096), jnp.float32, big, ("x", "y", "z")), "big"),
                  show_sharding(place(jnp.ones((64, 128), jnp.float32), mesh8, ("data", None)), "small")))
    pairs.append(("sharding view, 2-D layout: 4,096 shards (plan [4096,4096] f32, P((x,y),z)) vs 8 shards",
                  show_sharding(plan((4096, 4096), jnp.float32, big, (("x", "y"), "z")), "big2d"),
                  show_sharding(place(jnp.ones((64, 128), jnp.float32), mesh8, ("data", None)), "small")))
    pairs.append(("sharding view: abstract array of 2^40 ≈ 1.1e12 elements (plan [2^20, 2^20] f32) vs 10^3 "
                  "(plan [8, 125] f32), both P(data) over 8 devices",
                  show_sharding(plan((2**20, 2**20), jnp.float32, mesh8, ("data", None)), "huge"),
                  show_sharding(plan((8, 125), jnp.float32, mesh8, ("data", None)), "tiny")))

    def result_view(count: int):
        ids = list(range(count))
        coords = [(i,) for i in ids]
        stacked = jnp.arange(count * 4, dtype=jnp.float32).reshape(count, 4)  # a different value per device
        summary = per_device_summary("y", stacked, 1, ids, coords)
        return ResultView(state={"title": f"%%pmap over {count} devices (axis i)", "axes": [{"name": "i", "size": count}],
                                 "device_ids": ids, "outputs": [summary], "collectives": [], "report": None})

    pairs.append(("result view: per-device summary for 4,096 fake device ids vs 8 devices "
                  "(per_device_summary of a [n, 4] f32 output)", result_view(4096), result_view(8)))
    for what, large, small in pairs:
        lg, sm = view_sizes(large), view_sizes(small)
        row(6, what + " — synced `state` JSON", fmt_bytes(lg["state"]), fmt_bytes(sm["state"]),
            f"×{lg['state'] / sm['state']:.1f}", "", "")
        row(6, "  … static text/html · text/plain", f"{fmt_bytes(lg['html'])} · {fmt_bytes(lg['text'])}",
            f"{fmt_bytes(sm['html'])} · {fmt_bytes(sm['text'])}", f"×{lg['html'] / sm['html']:.1f} · ×{lg['text'] / sm['text']:.1f}",
            "", "")
        detail(f"6. {what}: large {lg}, small {sm} (bytes; 'widget' = the whole synced widget state, "
               "ES module and CSS included)")
    # The real 8-device result view of the %%pmap cell above, with its collectives, as the magic shows it.
    from IPython.utils.capture import capture_output
    from jax import lax

    if "x" not in sh.user_ns:  # section 1 was skipped
        sh.user_ns.update(x=jnp.ones((DEVICES, n_pmap, n_pmap), jnp.float32), lax=lax)
    with capture_output() as captured:
        sh.run_cell_magic("pmap", "--report", PMAP_SRC)
    (shown,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    real = view_sizes(shown)
    detail(f"6. the real result view of the benchmark's %%pmap cell (y [{n_pmap},{n_pmap}] per device, one "
           f"all-reduce, --report): {real}")
    widget = view_sizes(show_mesh(mesh8))
    row(6, "every view instance also syncs its bundled ES module + CSS (mesh view, 8 devices: whole widget "
           "state vs `state`)", fmt_bytes(widget["widget"]), fmt_bytes(widget["state"]), "", "", "")


# --- 7: Chromium -------------------------------------------------------------------------------------

HARNESS = """<!doctype html>
<html><head><meta charset="utf-8"><link rel="stylesheet" href="/views.css">
<style>body{margin:0;padding:12px;font-family:system-ui,sans-serif}.jpm-host{width:940px}</style></head>
<body><div id="root"></div>
<script type="module">
class FakeModel {
  constructor(data) { this.data = { ...data }; this.listeners = new Map(); }
  get(key) { return this.data[key]; }
  set(key, value) { this.data[key] = value; for (const cb of [...(this.listeners.get(`change:${key}`) || [])]) cb(); }
  on(event, cb) { if (!this.listeners.has(event)) this.listeners.set(event, new Set()); this.listeners.get(event).add(cb); }
  off(event, cb) { if (!event) { this.listeners.clear(); return; } const s = this.listeners.get(event); if (s) { if (cb) s.delete(cb); else this.listeners.delete(event); } }
  save_changes() {}
  send() {}
}
const modules = {};
async function load(view) {  // as anywidget does: module text -> Blob URL -> import()
  if (!modules[view]) {
    const text = await (await fetch(`/bundle/${view}.js`)).text();
    const url = URL.createObjectURL(new Blob([text], { type: "text/javascript" }));
    try { modules[view] = await import(url); } finally { URL.revokeObjectURL(url); }
  }
  return modules[view];
}
window.bench = async (view, state) => {
  const mod = await load(view);
  const el = document.createElement("div");
  el.className = "jpm-host";
  document.getElementById("root").replaceChildren(el);
  const model = new FakeModel({ state });
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));  // start from an idle frame
  const t0 = performance.now();
  const cleanup = mod.default.render({ model, el });
  const t1 = performance.now();
  el.getBoundingClientRect();  // forces style and layout of the new DOM
  const t2 = performance.now();
  await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));  // the frame that paints it
  const t3 = performance.now();
  const nodes = el.querySelectorAll("*").length;
  const cells = el.querySelectorAll(".jpm-cell").length;
  const error = el.querySelector(".jpm-error") ? el.textContent : null;
  if (typeof cleanup === "function") cleanup();
  return { render: t1 - t0, layout: t2 - t0, frame: t3 - t0, nodes, cells, error };
};
window.benchReady = true;
</script></body></html>
"""


def bench_chromium(args):
    reasons = []
    if not CHROMIUM.exists():
        reasons.append(f"no Chromium at {CHROMIUM}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reasons.append("playwright is not installed")
    from jaxpar_magic.views.base import assets  # the wheel's jaxpar_magic.js, or a source checkout's js/

    try:
        js = assets()
    except Exception as exc:  # whatever stops the package from finding its views' files is the reason to skip
        js, missing = None, f"the package finds no js/ folder ({type(exc).__name__}: {exc})"
    else:
        missing = None if js.joinpath("mesh.js").is_file() else "the package has no js/mesh.js yet"
    if missing:
        reasons.append(missing)
    if reasons:
        row(7, "Chromium render of the 4,096-device mesh view", "skipped: " + "; ".join(reasons), "", "", "", "")
        return
    from playwright.sync_api import sync_playwright

    from jaxpar_magic.engines.shard import make_mesh
    from jaxpar_magic.views.summaries import mesh_state
    from jaxpar_magic.views import MeshView

    def serve(route):
        path = route.request.url[len(ORIGIN):]
        if path == "/":
            body, ctype = HARNESS, "text/html"
        elif path == "/views.css":
            body, ctype = js.joinpath("views.css").read_text(encoding="utf-8"), "text/css"
        elif path == "/bundle/mesh.js":
            body, ctype = MeshView._esm, "text/javascript"
        else:
            route.fulfill(status=404, body="not found")
            return
        route.fulfill(status=200, body=body, headers={"content-type": f"{ctype}; charset=utf-8"})

    abstract = mesh_state(make_mesh("x=16 y=16 z=16", abstract=True), "mesh")
    coloured = dict(abstract, abstract=False, kinds=["cpu"])  # same ids, drawn as devices (colour per cell)
    small = mesh_state(make_mesh("data=8"), "mesh")
    errors: list[str] = []
    results = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1000, "height": 900})
            context.route("**/*", lambda r: serve(r) if r.request.url.startswith(ORIGIN + "/") else r.abort())
            page = context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(ORIGIN + "/")
            page.wait_for_function("window.benchReady === true")
            for label, state in (("abstract", abstract), ("coloured", coloured), ("small", small)):
                runs = [page.evaluate("([v, s]) => window.bench(v, s)", ["mesh", state]) for _ in range(args.browser_runs + 1)][1:]
                results[label] = runs
        finally:
            browser.close()
    if errors or any(r["error"] for runs in results.values() for r in runs):
        row(7, "Chromium render of the 4,096-device mesh view", "failed", "", "", "",
            "; ".join(errors + [r["error"] for runs in results.values() for r in runs if r["error"]])[:200])
        return

    def med(label, key):
        return statistics.median(r[key] for r in results[label])

    for label, what in (("abstract", "AbstractMesh (16,16,16), grey positions"),
                        ("coloured", "the same 4,096 ids drawn as devices (a colour per cell)")):
        r = results[label][0]
        row(7, f"Chromium: render the 4,096-cell mesh view, {what} — render() · +style/layout · to next frame "
               f"(median of {args.browser_runs}; {r['nodes']} DOM nodes, {r['cells']} cells)",
            f"{med(label, 'render'):.1f} · {med(label, 'layout'):.1f} · {med(label, 'frame'):.1f} ms",
            f"{med('small', 'render'):.1f} · {med('small', 'layout'):.1f} · {med('small', 'frame'):.1f} ms (8 devices)",
            "", "", "")
    detail("7. Chromium runs (ms, render/layout/frame): " + "; ".join(
        f"{k}: " + ", ".join(f"{r['render']:.1f}/{r['layout']:.1f}/{r['frame']:.1f}" for r in v) for k, v in results.items()))


# --- where the time goes (when a ratio misses its target) ---------------------------------------------

def profile_pmap_rerun(jax, sh, calls: int = 2000):
    import jaxpar_magic.cell.analysis as cells
    import jaxpar_magic.cell.programs as programs
    import jaxpar_magic.engines.pmap as pmap_engine
    import jaxpar_magic.stages.run.program as runner

    engine = engine_module()
    eng = "jaxpar_magic/stages/run/" + Path(engine.__file__).name
    program = engine._block_cache[next(k for k in engine._block_cache if k[0] == PMAP_SRC)]
    owners = ipython_steps(sh, "pmap") + replay_steps(engine, runner, program, jax) + under_action([
        (engine, "pmap_cell", f"    {eng}:pmap_cell"),
        (engine, "mesh_for", "      jaxpar_magic/engines/pmap.py:mesh_for"),
        (engine, "run_block", f"      {eng}:run_block"),
        (engine, "_full_path", f"        {eng}:_full_path (prepare and compile: only when the short path declines)"),
        (cells, "check_axis_names", "          jaxpar_magic/cell/analysis.py:check_axis_names"),
        (pmap_engine, "classify", "          jaxpar_magic/cell/inputs.py:classify"),
        (engine, "run_program", "        jaxpar_magic/stages/run/program.py:run_program"),
        (runner, "shape_signature", "          jaxpar_magic/cell/programs.py:shape_signature (the short path reuses the first run's)"),
        (programs.Rerun, "remember", "        jaxpar_magic/cell/programs.py:Rerun.remember"),
        (engine, "_block_result", f"        {eng}:_block_result (binds the outputs)"),
    ])
    return profile_steps(owners, lambda: sh.run_cell_magic("pmap", "--no-show", PMAP_SRC), calls)


def profile_pmap_view(jax, sh, calls: int = 300):
    """Where a re-run that shows the per-device result view (the default) spends its time."""
    from IPython.utils.capture import capture_output

    import jaxpar_magic.face.actions as actions
    import jaxpar_magic.face.magics as magics
    import jaxpar_magic.stages.run.program as runner
    import jaxpar_magic.views.values as values
    from jaxpar_magic.views.base import ViewBase

    engine = engine_module()
    eng = "jaxpar_magic/stages/run/" + Path(engine.__file__).name
    owners = [
        (sh.magics_manager.magics["cell"], "pmap", "jaxpar_magic/face/magics.py:JaxparMagics.pmap (everything)"),
        # actions.run dispatches through its table of actions: the entry there is what gets called.
        (getattr(actions, "_ACTIONS", actions), "pmap", "  jaxpar_magic/face/actions.py:pmap (the run and the view's state)"),
        (engine, "pmap_cell", f"    {eng}:pmap_cell (the run itself, with want_facts)"),
        (runner, "facts_for", "      jaxpar_magic/stages/run/program.py:facts_for (the program's collectives and costs, cached)"),
        (values, "result_parts", "    jaxpar_magic/views/values.py:result_parts (dispatches each output's summary)"),
        (values, "result_state", "    jaxpar_magic/views/values.py:result_state (the same, and waits for the values)"),
        (magics, "view_of", "  jaxpar_magic/face/magics.py:view_of (the widget for a state)"),
        (ViewBase, "__init__", "    jaxpar_magic/views/base.py:ViewBase.__init__ (anywidget/ipywidgets widget)"),
        (ViewBase, "_ipython_display_", "  jaxpar_magic/views/base.py:ViewBase._ipython_display_ (the view's outputs: "
                                        "text/html and text/plain, then the widget)"),
    ]

    def run():
        with capture_output():
            sh.run_cell_magic("pmap", "", PMAP_SRC)
    return profile_steps(owners, run, calls)


def profile_function_call(jax, step, x, calls: int = 2000):
    engine = sys.modules[type(step).__module__]
    eng = "jaxpar_magic/stages/run/" + Path(engine.__file__).name
    cls = type(step)
    owners = [
        (cls, "__call__", f"{eng}:ParallelFunction.__call__ (everything)"),
        (engine, "traced", "  jaxpar_magic/cell/programs.py:traced"),
        (cls, "_jitted_for", f"  {eng}:ParallelFunction._jitted_for"),
        (cls, "_effective_in_axes", "    ParallelFunction._effective_in_axes"),
        (cls, "_arg_names", "      ParallelFunction._arg_names (read once, then cached)"),
        (engine, "block_on_cpu_collectives", "  jaxpar_magic/stages/run/program.py:block_on_cpu_collectives (the guard)"),
    ]
    return profile_steps(owners, lambda: step(x), calls)


def profile_shard_rerun(jax, sh, calls: int = 2000):
    import jaxpar_magic.cell.programs as programs
    import jaxpar_magic.engines.shard as shard_engine
    import jaxpar_magic.stages.run.program as runner
    import jaxpar_magic.stages.run.shard as shard_run

    line = "--mesh mesh --in a=None,data b=data,None --no-show"
    program = shard_run._cache[next(k for k in shard_run._cache if k[0] == SHARD_SRC)]
    owners = ipython_steps(sh, "shard") + replay_steps(shard_run, runner, program, jax) + under_action([
        (shard_run, "shard_cell", "    jaxpar_magic/stages/run/shard.py:shard_cell"),
        (shard_run, "resolve_mesh", "      jaxpar_magic/engines/shard.py:resolve_mesh"),
        (shard_run, "run_shard", "      jaxpar_magic/stages/run/shard.py:run_shard"),
        (shard_run, "_full_path", "        jaxpar_magic/stages/run/shard.py:_full_path (prepare and compile: only when the short path declines)"),
        (shard_engine, "classify", "          jaxpar_magic/cell/inputs.py:classify"),
        (shard_engine, "place_leaves", "          jaxpar_magic/engines/shard.py:place_leaves (each --in input)"),
        (shard_run, "run_program", "        jaxpar_magic/stages/run/program.py:run_program"),
        (runner, "shape_signature", "          jaxpar_magic/cell/programs.py:shape_signature (the short path reuses the first run's)"),
        (programs.Rerun, "remember", "        jaxpar_magic/cell/programs.py:Rerun.remember"),
    ])
    return profile_steps(owners, lambda: sh.run_cell_magic("shard", line, SHARD_SRC), calls)


def package_provenance() -> str:
    """Which jaxpar_magic was measured: the installed files compared, blob by blob, with the
    repository's HEAD (package sources under jaxpar_magic/, ES modules and CSS under js/)."""
    import hashlib

    import jaxpar_magic

    installed = Path(jaxpar_magic.__file__).parent
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "HEAD", "--", "jaxpar_magic", "js"],
                                 capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"jaxpar_magic {jaxpar_magic.__version__} installed at {installed} (no git checkout to compare with)"
    committed = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith((".py", ".js", ".css")):
            committed[path] = meta.split()[2]
    found = {}
    files = [(file, file.relative_to(installed).as_posix()) for file in installed.rglob("*")]
    source_checkout = installed == repo / "jaxpar_magic"  # pip install -e . (or the root on sys.path)
    if source_checkout:  # the package reads its ES modules from the checkout's js/ then
        files += [(file, "js/" + file.relative_to(repo / "js").as_posix()) for file in (repo / "js").rglob("*")]
    for file, rel in files:
        if file.suffix in (".py", ".js", ".css") and "__pycache__" not in file.parts:
            path = rel if rel.startswith("js/") else f"jaxpar_magic/{rel}"  # the wheel carries js/ as jaxpar_magic/js
            data = file.read_bytes()
            found[path] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    where = f"from the source checkout at {repo} (editable)" if source_checkout else f"installed at {installed}"
    changed = sorted(p for p in found if p in committed and found[p] != committed[p])
    extra = sorted(p for p in found if p not in committed)
    missing = sorted(p for p in committed if p not in found)
    if not (changed or extra or missing):
        return f"jaxpar_magic {jaxpar_magic.__version__} {where}, identical to commit {head}"
    parts = [f"changed: {', '.join(changed)}" if changed else "", f"not in the commit: {', '.join(extra)}" if extra else "",
             f"missing: {', '.join(missing)}" if missing else ""]
    return (f"jaxpar_magic {jaxpar_magic.__version__} {where}, DIFFERS from commit {head} "
            f"({'; '.join(p for p in parts if p)})")


# --- main --------------------------------------------------------------------------------------------

CHILD_MODES = {
    "cold": lambda kind, n: child_cold(kind, int(n)),
    "guard": lambda n, reps: child_guard(int(n), int(reps)),
    "memory": lambda mode, cells, window: sections_memory.child_memory(mode, int(cells), int(window)),
    "plan": lambda mode: sections_plan.child_plan(mode),
    "cluster": lambda n, reps, gathers: sections_cluster.child_cluster(int(n), int(reps), int(gathers)),
}
SECTIONS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "11d", "12", "13", "14", "15")
DEFAULT_N = 160  # the %%pmap workload when section 1 (which tunes it) is skipped


def child_main(argv: list[str]) -> None:
    mode = argv[0]
    if mode not in CHILD_MODES:
        raise SystemExit(f"unknown child mode {mode!r}")
    emit(CHILD_MODES[mode](*argv[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=60, help="interleaved repetitions per comparison (default 60)")
    parser.add_argument("--cold-runs", type=int, default=5, help="fresh processes per cold-start case (default 5)")
    parser.add_argument("--browser-runs", type=int, default=5, help="Chromium renders per state (default 5)")
    parser.add_argument("--first-runs", type=int, default=10,
                        help="section 10: first runs per case, each of a fresh cell text (default 10, at most --reps)")
    parser.add_argument("--memory-cells", type=int, default=300,
                        help="section 8: distinct cells per process (default 300; growth is read over the last 200)")
    parser.add_argument("--memory-runs", type=int, default=3, help="section 8: fresh processes per side (default 3)")
    parser.add_argument("--plan-runs", type=int, default=5, help="section 11: fresh processes per side (default 5)")
    parser.add_argument("--cluster-gathers", type=int, default=5, help="section 12: timed gathers of 8 MiB (default 5)")
    parser.add_argument("--async-steps", type=int, default=200, help="section 15: steps a timed loop (default 200)")
    parser.add_argument("--async-rounds", type=int, default=5, help="section 15: interleaved rounds (default 5)")
    parser.add_argument("--async-devices", type=int, default=0,
                        help="section 15: the cells' mesh takes this many devices (default: all there are)")
    parser.add_argument("--profile", action="store_true", help="always print where our per-call time goes")
    parser.add_argument("--skip", nargs="*", default=[], metavar="N", choices=SECTIONS,
                        help="sections to skip, e.g. --skip 3 7 (1 skips 1-2, 2 the guard subprocess 2b, 4 or 5 both)")
    parser.add_argument("--only", nargs="*", default=None, metavar="N", choices=SECTIONS,
                        help="run only these sections, e.g. --only 8 9 10 11 12")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child)
        return
    skip = set(args.skip) | (set(SECTIONS) - set(args.only) if args.only is not None else set())

    def wanted(*sections) -> bool:
        """Whether any of these sections runs (`--only 4` runs the block of sections 4 and 5)."""
        return not all(s in skip for s in sections)

    began = time.perf_counter()
    jax = start_jax()
    import jaxlib

    sh = make_shell()
    sh.run_line_magic("load_ext", "jaxpar_magic")
    ratios: dict[str, tuple[float, float]] = {}  # section -> (ratio, its target)
    n, x = DEFAULT_N, None
    if wanted("1"):
        log("1-2: %%pmap re-run and function mode")
        n, x, r = bench_pmap(jax, sh, args)
        ratios.update({k: (v, RATIO_TARGET) for k, v in r.items()})
    if wanted("2"):
        log("2b: the CPU-collective guard (subprocess)")
        bench_guard(n, args)
    if wanted("3"):
        log("3: cold start (subprocesses)")
        bench_cold(n, args)
    if wanted("4", "5"):
        log("4-5: %%shard re-run and collectives")
        ratios.update({k: (v, RATIO_TARGET) for k, v in bench_shard(jax, sh, args).items()})
    if wanted("6"):
        log("6: view sizes")
        bench_views(jax, sh, n)
    if wanted("7"):
        log("7: Chromium")
        bench_chromium(args)
    if wanted("8"):
        sections_memory.bench_memory(args)
    if wanted("9"):
        log("9: %%shard_map re-run")
        ratios.update(sections_engines.bench_shard_map(jax, sh, args))
    if wanted("10"):
        log("10: --collectives")
        ratios.update(sections_engines.bench_collectives(jax, sh, args))
    if wanted("11"):
        log("11: --plan on 512 simulated devices (subprocesses)")
        sections_plan.bench_plan(args)
    if wanted("11d"):
        log("11d: --plan compiled by XLA:TPU for a v5e 4x4 slice (subprocesses)")
        sections_plan.bench_tpu(args)
    if wanted("12"):
        log("12: %cluster, 2 processes x 4 devices (subprocess)")
        sections_cluster.bench_cluster(args)
    if wanted("13"):
        ratios.update(sections_pytrees.bench_pytrees(jax, sh, args))
    if wanted("14"):
        ratios.update(sections_flax.bench_flax(jax, sh, args))
    if wanted("15"):
        log("15: cell loops vs asynchronous jax.jit loops")
        ratios.update(sections_async.bench_async(jax, sh, args))

    cpu = platform.processor() or platform.machine()
    print(f"# jaxpar_magic benchmark — {datetime.date.today().isoformat()}")
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    print(f"command: {python} bench/run.py {' '.join(sys.argv[1:])}".rstrip())
    devices = (f"CPU only, {jax.device_count()} simulated CPU devices" if jax.default_backend() == "cpu" else
               f"{jax.device_count()} {jax.devices()[0].device_kind} device(s)")
    print(f"machine: {os.cpu_count()} cores ({cpu}), {devices}; "
          f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python {platform.python_version()}")
    print(f"package: {package_provenance()}")
    print(f"timing: medians per call over {args.reps} interleaved repetitions of 20 calls (min and the median of "
          f"per-repetition ratios in brackets); both sides block on every result\n")
    print_table()
    print("\ndetails:")
    for d in DETAILS:
        print(f"- {d}")

    missed = {k for k, (ratio, target) in ratios.items() if ratio > target}
    if missed or args.profile:
        print("\nwhere the per-call time goes (inclusive µs per call, measured in place; indented = called by the line above):")
        if wanted("1"):
            if "1" in missed or args.profile:
                print_profile("1. cached %%pmap re-run:", profile_pmap_rerun(jax, sh))
            print_profile("1c. cached %%pmap re-run showing the result view (no target; for the record):",
                          profile_pmap_view(jax, sh))
        if "2" in missed or (args.profile and wanted("1")):
            print_profile("2. ParallelFunction call:", profile_function_call(jax, sh.user_ns["step"], x))
        if "4" in missed or (args.profile and wanted("4", "5")):
            print_profile("4. cached %%shard re-run:", profile_shard_rerun(jax, sh))
        if "9" in missed or (args.profile and wanted("9")):
            print_profile("9. cached %%shard_map re-run:", sections_engines.profile_shard_map_rerun(jax, sh))
        if "14" in missed or (args.profile and wanted("14")):
            print_profile("14. cached %%shard re-run of the Flax NNX step:", sections_flax.profile_flax_rerun(jax, sh))
        if any(k.startswith("15") for k in missed) or (args.profile and wanted("15")):
            print(sections_async.hot_functions(jax, sh))
    print(f"\ntotal bench time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
