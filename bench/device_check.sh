#!/usr/bin/env bash
# The device check (issue 39): everything a TPU VM can tell that CPU tests cannot, in one command
# from a checkout, on a host with no network and no sockets where one process at a time holds the
# chip (the project's shared TPU.md). From the repository root, with .whl-tpu/ made beforehand by
# `bash bench/device_wheels.sh` on a machine with an index:
#
#   bash bench/device_check.sh                       # writes under $OUT (default ./device-out)
#
# On the device machine through `run`: command `bash bench/device_check.sh`, carry [".whl-tpu"].
# Each part has its own timeout (just under 10 minutes in all at most) and a log, $OUT/<part>.log:
#
#   1. install (120 s) the carried wheels with `pip install --target $SITE` (IPython, the widgets,
#      ipyparallel, psutil, Equinox and their dependencies, and this package's wheel), Flax and optax
#      from the host's own index (`--index-url file:///opt/pypi/simple --target $LIBS`), both folders
#      appended to PYTHONPATH: the host's own JAX, libtpu and NumPy stay first. This checkout comes
#      before them all, so it is this checkout's jaxpar_magic that runs (the wheel is installed to
#      check that it installs).
#   2. info    (45 s) the chip, JAX, where each library comes from and whether it counts as library code
#   3. tests   (250 s) the device tier in one process: JPM_DEVICE=1 python -m pytest tests/device
#      (every magic against its plain-JAX twin, plans against the chip's compile, %devices, the NNX
#      compile count with Flax installed --target-style)
#   4. bench   (150 s) the bench/run.py sections for re-run overhead that exist: $BENCH_CPU on 8
#      simulated CPU devices (default "9 14"), $BENCH_DEVICE on the chip (JAX_PLATFORMS left empty;
#      default "15": cell loops against asynchronous jax.jit loops, issue 39's overhead targets);
#      sections bench/run.py does not have yet are listed and left out
#   5. summary (15 s) $OUT/summary.md (bench/device_summary.py): pass/fail counts and failures, the
#      plan-vs-chip figures, the NNX compile counts, %devices' text, the bench ratios
#
# JPM_DEVICE_PARTS="install bench" runs only those parts (install always first), for a shorter look.
#
# A dry run elsewhere: JAX_PLATFORMS=cpu bash bench/device_check.sh (the device tests then compare
# with plain JAX on one CPU device and skip what needs a chip). PYTHON picks the interpreter.
set -u
OUT=${OUT:-$PWD/device-out}
PY=${PYTHON:-python3}
SCRATCH=${SCRATCH:-${TMPDIR:-/tmp}/jpm-device}
SITE=$SCRATCH/site   # the carried wheels
LIBS=$SCRATCH/libs   # Flax and optax, as the host's index gives them
INDEX=${INDEX:-file:///opt/pypi/simple}
BENCH_CPU=${BENCH_CPU:-"9 14"}
BENCH_DEVICE=${BENCH_DEVICE:-15}
BENCH_ARGS=${BENCH_ARGS:-"--reps 10 --async-steps 100 --async-rounds 3"}
mkdir -p "$OUT" "$SCRATCH"
: > "$OUT/parts.txt"
export PYTHONUNBUFFERED=1 OUT PY SITE LIBS INDEX BENCH_CPU BENCH_DEVICE BENCH_ARGS
export PYTHONPATH="$PWD:${PYTHONPATH:+$PYTHONPATH:}$SITE:$LIBS"  # the host's own folder keeps its place
export IPYTHONDIR=$SCRATCH/ipython MPLCONFIGDIR=$SCRATCH/matplotlib  # the home folder may be read-only
CHIP_OWN="jax jaxlib libtpu numpy scipy ml_dtypes opt_einsum"
export CHIP_OWN

part() {  # part NAME SECONDS: run the function NAME with its own timeout, log to $OUT/NAME.log, say how it ended
    local name=$1 limit=$2 began rc
    began=$(date +%s)
    echo "== $name (timeout ${limit} s)"
    timeout --kill-after=10 "$limit" bash -c "$name" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc after $(( $(date +%s) - began )) s$([ $rc -eq 124 ] && echo ' (timed out)')" | tee -a "$OUT/parts.txt"
    tail -n 12 "$OUT/$name.log"
}

install() {
    pip=("$PY" -m pip install --isolated --disable-pip-version-check --no-warn-script-location)
    shopt -s nullglob
    wheels=(.whl-tpu/*.whl)
    if [ ${#wheels[@]} -eq 0 ]; then
        echo "no carried wheels in .whl-tpu/: run bash bench/device_wheels.sh where there is an index, and carry .whl-tpu"
    elif ! "${pip[@]}" --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}"; then
        echo "-- all at once failed; one by one:"
        for wheel in "${wheels[@]}"; do
            "${pip[@]}" --no-index --no-deps --upgrade --target "$SITE" "$wheel" >/dev/null 2>&1 || echo "FAILED: $wheel"
        done
    fi
    # Flax and optax with what `from flax import nnx; import optax` imports; all of their dependencies
    # (orbax, tensorstore, a second JAX...) only if that is not enough.
    lean=(flax optax msgpack rich markdown-it-py mdurl pyyaml treescope typing-extensions absl-py)
    "${pip[@]}" --no-deps --upgrade --index-url "$INDEX" --target "$LIBS" "${lean[@]}" \
        || echo "-- the lean install of Flax failed"
    if ! "$PY" -c "from flax import nnx; import optax" 2>/dev/null; then
        echo "-- Flax does not import with the lean install; installing every dependency"
        "${pip[@]}" --upgrade --index-url "$INDEX" --target "$LIBS" flax optax
        for name in $CHIP_OWN; do  # the host's own stay the ones imported: never a second copy
            rm -rf "$LIBS/$name" "$LIBS/$name"-*.dist-info "$LIBS/$name".libs
        done
    fi
    "$PY" -c "import IPython, ipywidgets, anywidget, equinox, optax; from flax import nnx; import jaxpar_magic; print('imports: ok')"
}

info() {
    "$PY" - <<'EOF'
import importlib, platform, subprocess, sys, sysconfig
print("python", platform.python_version(), sys.executable)
print("git", subprocess.run(["git", "log", "-1", "--format=%h %s"], capture_output=True, text=True).stdout.strip())
import jax
print("jax", jax.__version__, "backend", jax.default_backend(), "devices", jax.devices())
for d in jax.devices():
    stats = d.memory_stats() or {}
    print(" ", d.id, d.platform, getattr(d, "device_kind", "?"), {k: stats.get(k) for k in ("bytes_limit", "bytes_in_use")})
from jaxpar_magic.cell.origins import is_library_file
print("site-packages:", sysconfig.get_paths()["purelib"])
for name in ("jax", "jaxlib", "libtpu", "numpy", "flax", "optax", "equinox", "jaxtyping", "IPython", "traitlets",
             "ipywidgets", "anywidget", "ipyparallel", "jaxpar_magic"):
    try:
        module = importlib.import_module(name)
        where = getattr(module, "__file__", "") or ""
        said = "library" if where and is_library_file(where) else "USER CODE"
        print(f"{name:12s} {getattr(module, '__version__', '?'):12s} {said:9s} {where}")
    except Exception as exc:  # a report line, whatever the reason
        print(f"{name:12s} missing ({type(exc).__name__}: {exc})")
EOF
}

tests() {
    JPM_DEVICE=1 JPM_DEVICE_OUT="$OUT" "$PY" -m pytest -p no:cacheprovider -q -rsfE --durations=15 \
        --junitxml="$OUT/device-tests.xml" tests/device
}

bench() {
    set -o pipefail
    local status=0
    known=$("$PY" - <<'EOF'
import ast
tree = ast.parse(open("bench/run.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECTIONS" for t in node.targets):
        print(" ".join(ast.literal_eval(node.value)))
EOF
)
    pick() { local s found=""; for s in $1; do case " $known " in *" $s "*) found="$found $s";; *) echo "bench/run.py has no section $s yet: left out" >&2;; esac; done; echo $found; }
    cpu=$(pick "$BENCH_CPU")
    device=$(pick "$BENCH_DEVICE")
    : > "$OUT/bench.txt"
    if [ -n "$cpu" ]; then
        echo "-- on 8 simulated CPU devices: $cpu"
        JAX_PLATFORMS=cpu "$PY" bench/run.py --only $cpu $BENCH_ARGS | tee -a "$OUT/bench.txt" || status=$?
    fi
    if [ -n "$device" ]; then
        echo "-- on the chip: $device"
        JAX_PLATFORMS= "$PY" bench/run.py --only $device $BENCH_ARGS | tee -a "$OUT/bench.txt" || status=$?
    fi
    return $status
}

summary() {
    "$PY" bench/device_summary.py "$OUT"
}

export -f install info tests bench summary
PARTS=${JPM_DEVICE_PARTS:-"install info tests bench summary"}  # a shorter run names fewer (install first)
declare -A LIMIT=([install]=120 [info]=45 [tests]=250 [bench]=150 [summary]=15)
for name in $PARTS; do part "$name" "${LIMIT[$name]}"; done
# The device machine sends back at most 8 files: the ones read first stay, the rest go into one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files install.log info.log bench.log summary.log device-tests.xml 2>/dev/null)
echo "everything is under $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
