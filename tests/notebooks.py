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


def _assigned_names(body: str) -> list[str]:
    """Names a cell body assigns at its top level, in order (IPython syntax allowed)."""
    import ast

    from IPython.core.inputtransformer2 import TransformerManager

    names: list[str] = []

    def add(target) -> None:
        if isinstance(target, ast.Name) and target.id not in names:
            names.append(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                add(element)

    for node in ast.parse(TransformerManager().transform_cell(body)).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                add(target)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            add(node.target)
    return names


def expected_views(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, view kind) for every view the notebook's magics should display, in page order.

    * `%devices` shows a ``devices`` view;
    * a block-mode `%%pmap` cell (no `def`, no `--no-show`) shows a ``results`` view;
    * `%mesh` (no `--no-show`) shows a ``mesh`` view;
    * `%sharding a b` shows one ``sharding`` view per name;
    * `%%shard` (no `--no-show`) shows one ``sharding`` view per `--in` name, then one per name
      its body assigns at top level (every such name must hold an array); with `--report` it then
      shows a ``results`` view (the program report), even with `--no-show`;
    * a plain cell whose last line is ``[jaxpar_magic.]show_<kind>(...)`` shows that view;
    * a cell tagged ``raises-exception`` shows nothing.
    """
    import re

    views = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        source = cell.source.lstrip()
        first = source.splitlines()[0] if source else ""
        body = source.partition("\n")[2]
        if first.startswith("%%pmap"):
            if "--no-show" not in first and not re.search(r"^def ", source, re.M):
                views.append((index, "results"))
            continue
        if first.startswith("%%shard"):
            if "--no-show" not in first:
                ins = re.search(r"--in((?:\s+(?!-)\S+)+)", first)
                # `--in v1s=data w=P(None, 'model')`: a word starting `name=` names an input.
                placed = re.findall(r"(?:^|\s)([A-Za-z_]\w*)=", ins.group(1)) if ins else []
                views += [(index, "sharding")] * (len(placed) + len(_assigned_names(body)))
            if re.search(r"\s--report\b", first):
                views.append((index, "results"))
            continue
        if first.startswith("%%"):
            continue
        for line in source.splitlines():
            if re.match(r"%devices\b", line):
                views.append((index, "devices"))
            elif re.match(r"%mesh\b", line) and "--no-show" not in line:
                views.append((index, "mesh"))
            elif re.match(r"%sharding\b", line):
                views += [(index, "sharding")] * len(line.split()[1:])
        last = source.rstrip().splitlines()[-1] if source.strip() else ""
        shown = re.match(r"(?:jaxpar_magic\.)?show_(devices|mesh|sharding)\(.*\)$", last)
        if shown:
            views.append((index, shown.group(1)))
    return views
