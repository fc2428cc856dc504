"""`--profile` on a real accelerator (the device tier): the MLP step of bench/profile_mlp.py profiled on
the chip, its measured step within 10 % of a wall-clock median of the same jitted step, and every op
the profile names an instruction of the compiled program.

The test process runs JAX on simulated CPU devices (tests/conftest.py), so the check runs in a fresh
Python that sees the machine's own devices. It is skipped where the machine has no accelerator (no
TPU or GPU device node), which is every CI machine; on a TPU v5e it takes about a minute.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ACCELERATORS = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(not any(glob.glob(p) for p in ACCELERATORS),
                       reason="no accelerator on this machine (no TPU or GPU device node): the device tier runs on one"),
]


def test_the_chips_profile_matches_its_wall_clock_and_its_program(tmp_path):
    out = tmp_path / "mlp.json"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)  # appended
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_mlp.py"), "--json", str(out)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    if figures["source"].startswith("XLA:CPU"):
        pytest.skip(f"JAX found no accelerator here ({figures['devices'][:2]}): nothing to hold to the chip's figures")
    assert figures["source"] == "TPU device trace, 5 steps" or figures["source"].startswith("TPU device trace")
    assert figures["lanes"] == [f"TPU {k}" for k in range(len(figures["devices"]))]
    assert abs(figures["ratio"] - 1) <= 0.10, (figures["step_s"], figures["program_wall_median_s"])
    assert figures["ops_named"] > 0 and figures["unmatched"] == []
    assert figures["top_ops"][0]["kind"] == "compute" and figures["top_ops"][0]["line"] == 1
    assert figures["beside_same_machine"] is True and figures["estimate_s"] > 0, figures["beside"]
    print(done.stdout)
