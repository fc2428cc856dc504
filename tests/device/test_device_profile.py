"""`--profile` on the chip (issue 43): the MLP step of bench/profile_mlp.py profiled on the attached
TPU, in this process (one process at a time can hold the chip): its measured step within 10 % of a
wall-clock median of the same jitted step, and every op the profile names an instruction of the
compiled program."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.device

BENCH = Path(__file__).resolve().parents[2] / "bench" / "profile_mlp.py"


def _profile_mlp():
    spec = importlib.util.spec_from_file_location("profile_mlp", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chips_profile_matches_its_wall_clock_and_its_program(tpu, tmp_path, figures):
    result = _profile_mlp().main(["--json", str(tmp_path / "mlp.json")])
    figures["profile_mlp"] = result
    assert result["source"].startswith("TPU device trace"), result["source"]
    assert result["lanes"] == [f"TPU {k}" for k in range(len(result["devices"]))]
    assert abs(result["ratio"] - 1) <= 0.10, (result["step_s"], result["program_wall_median_s"])
    assert result["ops_named"] > 0 and result["unmatched"] == []
    assert result["top_ops"][0]["kind"] == "compute" and result["top_ops"][0]["line"] == 1
    assert result["beside_same_machine"] is True and result["estimate_s"] > 0, result["beside"]
