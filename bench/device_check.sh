#!/usr/bin/env bash
# One-shot check on a GPU machine (issue 31), from the repository root:
#
#   PYTHONPATH=/tmp/site:$PWD bash bench/device_check.sh
#
# /tmp/site holds the wheels the machine lacks (IPython, anywidget, ipywidgets, nbclient and their
# dependencies: bench/README.md lists them); the package is imported from this checkout, never
# installed (pyproject pins jax<0.11, the machine has what it has). Everything goes under $OUT
# (default ./device-out): summary.txt, one log per part, bench.txt, the executed chapter, plan.json.
# Each part has its own timeout; the four together stay under about 6 minutes.
#
#   1. info      the GPU (nvidia-smi), JAX's devices and backend, the library versions          (45 s)
#   2. bench     bench/run.py --only 4 9 13 14 on 8 simulated CPU devices (the sections need 8
#                devices; a quiet 16-core machine is what the 2-core one never is)               (160 s)
#   3. chapter   examples/pmap_chapter.ipynb executed headless by nbclient, when it is there     (90 s)
#   4. plan      `%%shard --plan` of a training step on the GPU vs that step compiled and run:
#                the plan's bytes against compiled.memory_analysis() and the device's measured
#                peak, its time estimate against the measured step                              (75 s)
set -u
OUT=${OUT:-$PWD/device-out}
PY=${PYTHON:-python3}
BENCH_ARGS=${BENCH_ARGS:-"--only 4 9 13 14 --reps 15 --profile"}  # a dry run elsewhere may ask for less
PLAN_SIZES=${PLAN_SIZES:-"4096 8 8192"}  # width, layers, batch of part 4's step
mkdir -p "$OUT"
: > "$OUT/summary.txt"
export PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS: run the function NAME with its own timeout, log to $OUT/NAME.log, say how it ended
    local name=$1 limit=$2 began rc
    began=$(date +%s)
    echo "== $name (timeout ${limit} s)"
    timeout --kill-after=10 "$limit" bash -c "$name" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc after $(( $(date +%s) - began )) s$([ $rc -eq 124 ] && echo ' (timed out)')" | tee -a "$OUT/summary.txt"
    tail -n 15 "$OUT/$name.log"
}

info() {
    nvidia-smi || echo "nvidia-smi: not found"
    "$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), "devices", jax.devices())
for d in jax.devices():
    print(" ", d.id, d.platform, getattr(d, "device_kind", "?"), {k: v for k, v in (d.memory_stats() or {}).items()
                                                            if k in ("bytes_limit", "bytes_in_use")})
for name in ("jaxlib", "flax", "optax", "equinox", "numpy", "IPython", "traitlets", "ipywidgets", "anywidget",
             "nbclient", "ipykernel", "jaxpar_magic"):
    try:
        module = importlib.import_module(name)
        print(f"{name:12s} {getattr(module, '__version__', '?'):12s} {getattr(module, '__file__', '')}")
    except Exception as exc:  # a report line, whatever the reason
        print(f"{name:12s} missing ({type(exc).__name__}: {exc})")
EOF
}

bench() {  # the sections that compare per-call overheads; CPU devices, as the script is written for 8
    JAX_PLATFORMS=cpu "$PY" bench/run.py $BENCH_ARGS > "$OUT/bench.txt"
}

chapter() {
    "$PY" - "$OUT" <<'EOF'
import sys, tempfile, time
from pathlib import Path
try:
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient
except ImportError as exc:
    print(f"skipped: nbclient (or its kernel machinery) is not importable here: {exc}")
    sys.exit(0)
out = Path(sys.argv[1])
path = Path("examples/pmap_chapter.ipynb")
nb = nbformat.read(path, as_version=4)
# The interpreter's own kernel (PYTHONPATH reaches it: the checkout and /tmp/site), in a scratch folder.
km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
began = time.perf_counter()
with tempfile.TemporaryDirectory(prefix="jpm-kernel-") as cwd:
    client = NotebookClient(nb, km=km, timeout=60, startup_timeout=60, resources={"metadata": {"path": cwd}},
                            allow_errors=True)
    try:
        client.execute()
    finally:
        nbformat.write(nb, out / "pmap_chapter.executed.ipynb")
errors = [(i, o.get("ename"), o.get("evalue", "")[:200]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
          for o in c.get("outputs", []) if o.get("output_type") == "error"]
expected = [i for i, c in enumerate(nb.cells) if "raises-exception" in c.get("metadata", {}).get("tags", [])]
print(f"{path}: {sum(c.cell_type == 'code' for c in nb.cells)} code cells in {time.perf_counter() - began:.1f} s; "
      f"errors in cells {[e[0] for e in errors]} (cells tagged raises-exception: {expected})")
for error in errors:
    print("  ", error)
sys.exit(1 if any(i not in expected for i, _, _ in errors) else 0)
EOF
}

plan() {
    "$PY" - "$OUT" <<'EOF'
import json, os, statistics, sys, time
from pathlib import Path
import jax, jax.numpy as jnp
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

out = Path(sys.argv[1])
device = jax.devices()[0]
print("device:", device.platform, getattr(device, "device_kind", "?"))
from traitlets.config import Config
config = Config()
config.HistoryManager.enabled = False  # no history database in a home folder that may be read-only
sh = InteractiveShell.instance(config=config)
sh.run_line_magic("load_ext", "jaxpar_magic")
with capture_output():
    sh.run_line_magic("mesh", "data=1 --no-show")  # the one GPU
WIDTH, LAYERS, BATCH = map(int, os.environ["PLAN_SIZES"].split())
setup = f"""
import jax, jax.numpy as jnp
def loss_fn(params, x):
    for w in params:
        x = jax.nn.relu(x @ w)
    return jnp.mean(x.astype(jnp.float32) ** 2)
params = [jax.random.normal(jax.random.key(i), ({WIDTH}, {WIDTH}), jnp.bfloat16) * 0.02 for i in range({LAYERS})]
x = jax.random.normal(jax.random.key(99), ({BATCH}, {WIDTH}), jnp.bfloat16)
"""
sh.run_cell(setup, store_history=False).raise_error()
STEP = "loss, grads = jax.value_and_grad(loss_fn)(params, x)\nparams = [w - 0.01 * g for w, g in zip(params, grads)]\n"
hardware = "h100"  # the nearest built-in profile (stages/plan/hardware.py has no H200); the estimate is read against it
memory = "141GB"  # an H200's HBM3e, as NVIDIA's H200 datasheet gives it (the H100 profile's is 80 GiB)
with capture_output() as shown:
    sh.run_cell_magic("shard", f"--plan --mesh mesh --hardware {hardware} --device-memory {memory}", STEP)
plan = sh.user_ns["_plan"]
print(plan.summary())
ns = sh.user_ns
loss_fn = ns["loss_fn"]

def step(params, x):
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    return loss, [w - 0.01 * g for w, g in zip(params, grads)]

params, x = ns["params"], ns["x"]
compiled = jax.jit(step).lower(params, x).compile()
analysis = compiled.memory_analysis()
stats_before = device.memory_stats() or {}
jitted = jax.jit(step)
loss, new = jitted(params, x)
jax.block_until_ready(new)
times = []
for _ in range(20):
    began = time.perf_counter()
    loss, new = jitted(params, x)
    jax.block_until_ready(new)
    times.append(time.perf_counter() - began)
stats = device.memory_stats() or {}
roofline = plan.roofline
report = {
    "device": getattr(device, "device_kind", str(device)), "jax": jax.__version__, "hardware_profile": hardware,
    "shapes": {"width": WIDTH, "layers": LAYERS, "batch": BATCH, "dtype": "bfloat16"},
    "plan": {"argument": plan.argument_bytes, "output": plan.output_bytes, "temp": plan.temp_bytes,
             "alias": plan.alias_bytes, "total": plan.total_bytes, "compiler": plan.compiler,
             "estimate_s": roofline.estimate_s if roofline else None, "flops": plan.flops,
             "bound": roofline.bound_text if roofline else None},
    "memory_analysis": {"argument": analysis.argument_size_in_bytes, "output": analysis.output_size_in_bytes,
                        "temp": analysis.temp_size_in_bytes, "alias": analysis.alias_size_in_bytes,
                        "peak": getattr(analysis, "peak_memory_in_bytes", None)},
    "device_memory": {"peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_in_use": stats.get("bytes_in_use"),
                      "bytes_in_use_before": stats_before.get("bytes_in_use"), "bytes_limit": stats.get("bytes_limit")},
    "step_s": {"median": statistics.median(times), "min": min(times), "runs": len(times)},
}
if roofline is not None:
    report["estimate_over_measured"] = roofline.estimate_s / statistics.median(times)
report["plan_total_over_memory_analysis"] = plan.total_bytes / max(1, analysis.argument_size_in_bytes
    + analysis.output_size_in_bytes + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)
(out / "plan.json").write_text(json.dumps(report, indent=2, default=str))
print(json.dumps(report, indent=2, default=str))
EOF
}

export OUT PY BENCH_ARGS PLAN_SIZES
export -f info bench chapter plan
part info 45
part bench 160
part chapter 90
part plan 75
echo "everything is under $OUT"
