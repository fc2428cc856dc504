"""Executing the example notebooks once per test session, shared by the notebook, export and
JupyterLab tests.

The kernel is this interpreter's own ipykernel (never a kernelspec found in someone's home), and
it starts in a temporary folder: a kernel started in the repository root would import
``jaxpar_magic`` from the source tree, which lacks the ``jaxpar_magic.js`` package data that only
an installed copy has.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CELL_TIMEOUT_S = 300
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def example_notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("*.ipynb"))


@functools.cache
def _executed(path: Path) -> nbformat.NotebookNode:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # No kernel folders: only the native kernel of the interpreter running the tests.
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    with tempfile.TemporaryDirectory(prefix="jpm-kernel-") as cwd:
        client = NotebookClient(
            nb,
            km=km,
            timeout=CELL_TIMEOUT_S,
            startup_timeout=120,
            resources={"metadata": {"path": cwd}},
            store_widget_state=True,
        )
        client.execute()  # raises CellExecutionError on any error a cell is not tagged to expect
    return nb


def executed(path: Path) -> nbformat.NotebookNode:
    """A deep copy of the notebook at ``path`` after running it top to bottom (cached)."""
    return copy.deepcopy(_executed(Path(path).resolve()))


def rich_outputs(nb: nbformat.NotebookNode):
    """(cell index, output) for every display_data / execute_result output."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("display_data", "execute_result"):
                yield index, output


def expected_views(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, view kind) for every view the notebook's magics should display.

    `%devices` shows a ``devices`` view; a block-mode `%%pmap` cell (no `def`, no `--no-show`)
    shows a ``results`` view; a cell tagged ``raises-exception`` shows nothing.
    """
    import re

    views = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        source = cell.source.lstrip()
        first = source.splitlines()[0] if source else ""
        views += [(index, "devices")] * len(re.findall(r"^%devices\b", source, re.M))
        if first.startswith("%%pmap") and "--no-show" not in first and not re.search(r"^def ", source, re.M):
            views.append((index, "results"))
    return views
