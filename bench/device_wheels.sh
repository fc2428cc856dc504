#!/usr/bin/env bash
# Make .whl-tpu/: what a TPU VM without network needs to run bench/device_check.sh from this checkout
# (issue 39; the host's facts are in the project's shared TPU.md). From the repository root, on a
# machine with an index (PyPI, or pip's configured one):
#
#   bash bench/device_wheels.sh
#
# It holds, as Python 3.11 manylinux x86_64 wheels: this package's own wheel; the dependencies of
# pyproject.toml the chip lacks (IPython, ipywidgets, anywidget, ipyparallel, psutil) with theirs; and
# Equinox, which the host's own index lacks, with its pure-Python dependencies (jaxtyping, wadler-lindig,
# typing-extensions) at the versions this environment tests, when it has them. Never JAX, jaxlib,
# libtpu, NumPy, SciPy, ml_dtypes or opt_einsum: the chip's own must be used (they are removed if a
# dependency pulled them in). About 25 MB.
#
# .whl-tpu/ is left out of git through the repository's info/exclude (a worktree shares its main
# checkout's), so the device machine's `run` must name it: carry [".whl-tpu"].
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=.whl-tpu
CHIP_OWN="jax jaxlib libtpu numpy scipy ml_dtypes opt_einsum"

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$DEST/" "$exclude" 2>/dev/null || echo "/$DEST/" >> "$exclude"

rm -rf "$DEST" build/lib build/bdist.*
mkdir -p "$DEST"
echo "+ this package's wheel"
"$PY" -m pip wheel --quiet --no-deps . -w "$DEST"

# pyproject's runtime dependencies, less what the chip has of its own.
needs=$("$PY" - "$CHIP_OWN" <<'EOF'
import re, sys, tomllib
own = set(sys.argv[1].split())
with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(d for d in deps if re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() not in own))
EOF
)
download=("$PY" -m pip download --quiet --only-binary=:all: --python-version 3.11 --implementation cp
          --abi cp311 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux_2_28_x86_64 --dest "$DEST")
echo "+ $(echo $needs) and their dependencies"
mapfile -t needs_list <<< "$needs"
"${download[@]}" "${needs_list[@]}"

# Equinox without JAX: its own dependencies by name, at this environment's versions where it has them.
pinned=$("$PY" - <<'EOF'
from importlib import metadata
for name in ("equinox", "jaxtyping", "wadler-lindig", "typing-extensions"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
EOF
)
echo "+ $(echo $pinned)"
mapfile -t pinned_list <<< "$pinned"
"${download[@]}" --no-deps "${pinned_list[@]}"

for name in $CHIP_OWN; do
    rm -f "$DEST/$name"-*.whl
done
echo "+ $DEST: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1)"
ls "$DEST"
