"""Section 8 of bench/run.py: memory over many distinct cells (issue 6, item 5).

300 distinct `%%pmap --no-show` cells, each over a fresh 8 MiB input, against hand-written
`jax.pmap` over 300 distinct functions in the same loop; each mode in a fresh process. Reported
over the last 200 cells: the growth of the process's resident memory (RSS, what the system sees)
and of glibc's heap in use (what malloc handed out and nobody freed; RSS also counts freed pages
glibc keeps for reuse); what our caches held at the end (the heap freed by emptying them); the
same after `jax.clear_caches()` and after `malloc_trim`; and the jax arrays still alive. Both sides
compile one program per cell, and what JAX keeps per program grows on both. Our caches must add
nothing on top of that: the verdicts compare our growth with the hand-written one.
"""
from __future__ import annotations

import sys

from benchkit import ChildFailed, DEVICES, detail, log, row, run_child, start_jax

INPUT_SHAPE = (DEVICES, 512, 512)  # float32: 8 MiB
MiB = 1 << 20
TOLERANCE = 0.05  # memory figures are noisy (allocator arenas, page granularity): "nothing on top" within 5 %


class _MallInfo2:
    """glibc's mallinfo2(): what malloc has handed out (all arenas), as opposed to the pages it keeps."""

    def __init__(self):
        import ctypes

        class Fields(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                "keepcost")]

        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallinfo2.restype = Fields

    def in_use(self) -> int:
        info = self.libc.mallinfo2()
        return info.uordblks + info.hblkhd  # allocated small blocks + mmapped large ones

    def trim(self) -> None:
        self.libc.malloc_trim(0)


def _mallinfo() -> _MallInfo2 | None:
    try:
        return _MallInfo2()
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None


def _clear_our_caches() -> dict:
    """Empty every cache of ours a %%pmap cell fills; returns their sizes before."""
    import jaxpar_magic
    import jaxpar_magic.face.magics as magics
    import jaxpar_magic.cell.programs as runner

    engine = sys.modules[jaxpar_magic.pmap_cell.__module__]  # the %%pmap engine, found through its twin
    sizes = {"compiled cells": len(engine._block_cache), "re-run records": len(engine._reruns)}
    engine.clear_cache()
    for owner, name in ((runner, "analyse_cached"), (magics, "parse_line"), (magics, "_transformed")):
        cached = getattr(owner, name, None)
        if hasattr(cached, "cache_clear"):
            sizes[name] = cached.cache_info().currsize
            cached.cache_clear()
    return sizes


def child_memory(mode: str, cells: int, window: int) -> dict:
    """One mode in this fresh process: `ours` (the magic in an InteractiveShell) or `hand`."""
    import gc

    import psutil

    jax = start_jax()
    import numpy as np
    from jax import lax

    process = psutil.Process()
    malloc = _mallinfo()

    def measure() -> dict:
        gc.collect()
        return {"rss": process.memory_info().rss, "heap": malloc.in_use() if malloc else None}

    if mode == "ours":
        from IPython.utils.capture import capture_output

        from benchkit import make_shell

        sh = make_shell()
        sh.run_line_magic("load_ext", "jaxpar_magic")
        sh.user_ns["lax"] = lax

        def one_cell(k: int):
            sh.user_ns["x"] = np.full(INPUT_SHAPE, k, np.float32)  # a fresh 8 MiB input, as a new batch would be
            with capture_output():  # a first run over a second prints a progress line
                sh.run_cell_magic("pmap", "--no-show", f"y = lax.psum(x * {k + 1}.0, 'i')\n")
            return sh.user_ns["y"]
    elif mode == "hand":
        namespace = {}

        def one_cell(k: int):
            x = np.full(INPUT_SHAPE, k, np.float32)
            scale = float(k + 1)
            namespace["f"] = jax.pmap(lambda v: lax.psum(v * scale, "i"), axis_name="i")  # a distinct function
            namespace["y"] = jax.block_until_ready(namespace["f"](x))
            return namespace["y"]
    else:
        raise SystemExit(f"unknown memory mode {mode!r}")

    trail = []
    stages = {}
    for k in range(cells):
        y = one_cell(k)
        if k + 1 == cells - window:
            stages["start"] = measure()
        if (k + 1) % 50 == 0:
            trail.append((k + 1, process.memory_info().rss))
    expected = DEVICES * (cells - 1) * cells  # psum over 8 devices of x * (k + 1), x = k everywhere (last cell)
    assert np.allclose(np.asarray(y), expected), (np.asarray(y).ravel()[:4], expected)
    del y
    stages["end"] = measure()
    live = jax.live_arrays()
    live_count, live_bytes = len(live), sum(a.nbytes for a in live)
    del live
    caches = {}
    if mode == "ours":
        caches = _clear_our_caches()
    stages["ours cleared"] = measure()  # the same as "end" for the hand-written side
    jax.clear_caches()
    stages["jax cleared"] = measure()
    if malloc:
        malloc.trim()  # freed heap back to the system: what RSS shows once nothing is kept for reuse
        stages["trimmed"] = measure()
    return {"stages": stages, "trail": trail, "live_count": live_count, "live_bytes": live_bytes, "caches": caches}


def bench_memory(args) -> None:
    import statistics

    cells, window = args.memory_cells, min(args.memory_cells - 1, 200)
    results: dict[str, list[dict]] = {"ours": [], "hand": []}
    for i in range(args.memory_runs):
        for mode in ("ours", "hand") if i % 2 == 0 else ("hand", "ours"):
            log(f"8: {cells} distinct cells, {mode}, run {i + 1}/{args.memory_runs} (subprocess)")
            try:
                results[mode].append(run_child(["memory", mode, str(cells), str(window)], timeout=900))
            except ChildFailed as exc:
                row(8, f"memory over {cells} distinct cells ({mode})", "failed", "", "", "", str(exc)[:160])
                return

    def growths(mode, stage, key) -> list[float]:
        return [(run["stages"][stage][key] - run["stages"]["start"][key]) / MiB for run in results[mode]]

    def shown(values: list[float], sign: str = "+") -> str:
        spread = f" ({', '.join(f'{v:{sign}.0f}' for v in values)})" if len(values) > 1 else ""
        return f"{statistics.median(values):{sign}.0f} MiB{spread}"

    def compare(label, stage, key, judged):
        ours, hand = growths("ours", stage, key), growths("hand", stage, key)
        o, h = statistics.median(ours), statistics.median(hand)
        meets = o <= h + TOLERANCE * abs(h)
        row(8, label, shown(ours), shown(hand), f"{o / h:.2f}" if h > 0 and o > 0 else "", f"{o - h:+.0f} MiB",
            f"≤ hand-written + {TOLERANCE:.0%}: {'meets' if meets else 'MISSES'}" if judged else "")

    runs = f"median of {args.memory_runs} fresh processes per side" if args.memory_runs > 1 else "one fresh process per side"
    compare(f"RSS growth over the last {window} of {cells} distinct `%%pmap --no-show` cells, each over a fresh 8 MiB "
            f"input, vs hand-written `jax.pmap` over {cells} distinct functions in the same loop ({runs}; each run in "
            "brackets)", "end", "rss", judged=True)
    last = {mode: results[mode][-1] for mode in results}
    if all(run["stages"]["start"]["heap"] is not None for mode in results for run in results[mode]):
        compare("  … heap in use over the same cells (glibc `mallinfo2`: what malloc handed out, not the pages it "
                "keeps for reuse)", "end", "heap", judged=True)
        held = [(run["stages"]["end"]["heap"] - run["stages"]["ours cleared"]["heap"]) / MiB for run in results["ours"]]
        row(8, "  … heap our caches held at the end (freed by emptying them: "
               + ", ".join(f"{v} {k}" for k, v in last["ours"]["caches"].items()) + ")",
            shown(held, sign="-"), "", "", "", "")
        compare("  … heap in use after `jax.clear_caches()` (and ours emptied) vs the window's start", "jax cleared",
                "heap", judged=False)
    if all("trimmed" in run["stages"] for mode in results for run in results[mode]):
        compare("  … RSS after `jax.clear_caches()` and glibc `malloc_trim(0)` vs the window's start", "trimmed", "rss",
                judged=False)
    row(8, "  … jax arrays alive at the end (`jax.live_arrays()`, last run): ours vs hand-written",
        f"{last['ours']['live_count']} ({last['ours']['live_bytes'] / MiB:.0f} MiB)",
        f"{last['hand']['live_count']} ({last['hand']['live_bytes'] / MiB:.0f} MiB)", "", "",
        "no more than hand-written: meets" if last["ours"]["live_bytes"] <= last["hand"]["live_bytes"] else
        "MORE than hand-written: MISSES")
    for mode, data in last.items():
        trail = ", ".join(f"{k}: {v / MiB:.0f}" for k, v in data["trail"])
        stages = "; ".join(f"{stage} RSS {v['rss'] / MiB:.0f}" + (f", heap {v['heap'] / MiB:.0f}" if v["heap"] else "")
                           for stage, v in data["stages"].items())
        detail(f"8. {mode}, last run: RSS (MiB) after cells {trail}. Stages (MiB): {stages}"
               + (f". Our caches at the end: {data['caches']}" if data["caches"] else "") + ".")
    detail(f"8. the cell: `y = lax.psum(x * K, 'i')` with K = 1, 2, …, {cells} (a new text each time: one compile each, "
           "on both sides); x a fresh numpy float32 [8, 512, 512] (8 MiB) per cell; both sides block on every result "
           "and rebind x, y (and the hand-written side its function f) each cell. Every figure is read after "
           f"`gc.collect()`. The verdicts allow {TOLERANCE:.0%} of the hand-written growth for allocator noise. RSS is "
           "what the system sees; the heap in use is what is really held (glibc keeps freed pages for reuse, which "
           "`malloc_trim` hands back), and it is the steadier of the two from run to run.")
