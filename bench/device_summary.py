"""The summary of bench/device_check.sh: what ran on the chip, in one page (issue 39).

    python bench/device_summary.py OUT        # reads OUT's parts.txt, device-tests.xml,
                                              # device_figures.json and bench.txt; writes OUT/summary.md

It prints the page too. Every input may be missing (a part that timed out or never ran): the page then
says so instead of failing.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def tests_section(out: Path) -> list[str]:
    path = out / "device-tests.xml"
    if not path.exists():
        return ["no test report (device-tests.xml): the tests part did not finish; see tests.log"]
    root = ElementTree.parse(path).getroot()
    cases = list(root.iter("testcase"))
    outcome = {}
    for case in cases:
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        found = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        outcome[name] = (found.tag if found is not None else "passed",
                         (found.get("message") or "").splitlines()[0][:300] if found is not None else "")
    counts = {kind: sum(1 for k, _ in outcome.values() if k == kind) for kind in ("passed", "failure", "error", "skipped")}
    lines = [f"{len(cases)} tests: {counts['passed']} passed, {counts['failure']} failed, {counts['error']} errors, "
             f"{counts['skipped']} skipped"]
    for name, (kind, message) in outcome.items():
        if kind != "passed":
            lines.append(f"- {kind.upper()} {name}: {message}")
    return lines


def figures_section(out: Path) -> list[str]:
    path = out / "device_figures.json"
    if not path.exists():
        return ["no figures (device_figures.json)"]
    figures = json.loads(path.read_text())
    lines = []
    for key, value in figures.items():
        if isinstance(value, dict) and isinstance(value.get("chip"), dict):  # a plan beside the chip's compile
            chip = value["chip"]
            same = all(value.get(k) == chip.get(k) for k in ("argument", "output", "temp", "alias", "flops"))
            lines.append(f"- {key}: {value.get('where')}; plan argument/output/temp/alias {value.get('argument')}/"
                         f"{value.get('output')}/{value.get('temp')}/{value.get('alias')} B, {value.get('flops')} FLOPs; "
                         f"chip {chip.get('argument')}/{chip.get('output')}/{chip.get('temp')}/{chip.get('alias')} B, "
                         f"{chip.get('flops')} FLOPs: {'the same' if same else 'DIFFERENT'}; capacity {value.get('capacity')} "
                         f"({value.get('capacity_source')}), fits {value.get('fits')}")
            if value.get("measured_s") is not None:
                lines.append(f"  step measured {value['measured_s'] * 1e3:.2f} ms, estimated "
                             f"{(value.get('estimate_s') or 0) * 1e3:.2f} ms, measured/estimated "
                             f"{value.get('measured_over_estimate')}")
        elif isinstance(value, str) and "\n" in value:
            lines += [f"- {key}:", "```", value, "```"]
        else:
            lines.append(f"- {key}: {json.dumps(value, default=str)}")
    return lines


def bench_section(out: Path) -> list[str]:
    path = out / "bench.txt"
    if not path.exists() or not path.read_text().strip():
        return ["no bench output (bench.txt)"]
    text = path.read_text().splitlines()
    return [line for line in text if line.startswith(("| ", "command:", "machine:", "total bench time"))]


def main(out: Path) -> str:
    parts = (out / "parts.txt").read_text().strip() if (out / "parts.txt").exists() else "(no parts.txt)"
    page = ["# bench/device_check.sh", "", "## Parts", "```", parts, "```", "", "## Device tests",
            *tests_section(out), "", "## Figures", *figures_section(out), "", "## Bench", *bench_section(out)]
    text = "\n".join(page) + "\n"
    (out / "summary.md").write_text(text)
    return text


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else "device-out")))
