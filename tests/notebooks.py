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
import re
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CELL_TIMEOUT_S = 600  # a plan compiled by XLA:TPU for 256 chips (the planning chapter) takes minutes on 2 cores
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


def executed_source(sources: list[str]) -> list:
    """The cells of a notebook made of `sources`, run top to bottom in a fresh kernel (not cached)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    with tempfile.NamedTemporaryFile(suffix=".ipynb", mode="w", delete=False) as f:
        nbformat.write(nb, f)
    try:
        return list(copy.deepcopy(_executed.__wrapped__(Path(f.name))).cells)
    finally:
        Path(f.name).unlink()


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


_CELL_MAGIC = re.compile(r"%%(pmap|shard_map|shard)\b")
_SHOW_LAST = re.compile(r"(?:jaxpar_magic\.)?show_(devices|mesh|sharding)\(.*\)$")
_RECORDED_AGAIN = re.compile(r"([A-Za-z_]\w*)\.collectives\(\)$")


def _flags(line: str) -> set[str]:
    """The `--options` of a magic line (a word that starts with `--`)."""
    return set(re.findall(r"(?<!\S)--[a-z][a-z-]*", line))


def _cell_magic_views(magic: str, first: str, body: str) -> tuple[list[str], list[str]]:
    """The view kinds a `%%pmap`/`%%shard`/`%%shard_map` cell shows, and the functions it binds to
    record their collectives on their first call (`%%pmap --collectives` in function mode)."""
    flags = _flags(first)
    if "--as-code" in flags:  # prints the plain JAX, runs nothing
        return [], []
    if "--plan" in flags:  # the plan view only; the names are bound as ShapeDtypeStructs
        return ([] if "--no-show" in flags else ["plan"]), []
    show = "--no-show" not in flags
    report = "--report" in flags
    kinds: list[str] = []
    if magic == "pmap":
        functions = re.findall(r"^def\s+([A-Za-z_]\w*)", body, re.M)
        if functions:  # function mode: the cell shows nothing; a first call may
            return [], functions if "--collectives" in flags else []
        if show:
            kinds.append("results")
    elif magic == "shard":
        if show:
            ins = re.search(r"--in((?:\s+(?!-)\S+)+)", first)
            # `--in v1s=data w=P(None, 'model')`: a word starting `name=` names an input.
            placed = re.findall(r"(?:^|\s)([A-Za-z_]\w*)=", ins.group(1)) if ins else []
            kinds += ["sharding"] * (len(placed) + len(_assigned_names(body)))
        if report:
            kinds.append("results")
    else:  # shard_map
        if show:
            kinds += ["results"] + ["sharding"] * len(_assigned_names(body))
        elif report:
            kinds.append("results")
    if "--collectives" in flags:
        kinds.append("collectives")
    return kinds, []


def expected_views(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, view kind) for every view the notebook's magics should display, in page order.

    * `%devices` shows a ``devices`` view;
    * a block-mode `%%pmap` cell (no `def`, no `--no-show`) shows a ``results`` view;
    * `%mesh` (no `--no-show`) shows a ``mesh`` view;
    * `%sharding a b` shows one ``sharding`` view per name (a ``tree`` view for a pytree: the test
      counts both as ``sharding``);
    * `%%shard` (no `--no-show`) shows one ``sharding`` view per `--in` name, then one per name
      its body assigns at top level (an array, or a pytree with array leaves); with `--report` it then
      shows a ``results`` view (the program report), even with `--no-show`;
    * `%%shard_map` (no `--no-show`) shows a ``results`` view (every device's block), then one
      ``sharding`` view per name its body assigns at top level (every such name must hold an
      array); with `--no-show`, `--report` still shows a ``results`` view;
    * `--collectives` then adds one ``collectives`` view (all the cell's cards), even with
      `--no-show`; in function mode (`%%pmap --collectives` over `def`s) the cell shows nothing,
      and the first later plain cell that calls such a function shows a ``collectives`` view
      (after the cell's line-magic views);
    * `--plan` shows only a ``plan`` view (none with `--no-show`); `--as-code` shows no view;
    * a plain cell whose last line is ``[jaxpar_magic.]show_<kind>(...)`` shows that view, and one
      whose last line is ``fn.collectives()`` a ``collectives`` view;
    * a cell tagged ``raises-exception`` shows nothing.

    A final expression that is an array is not counted: example cells end in a statement or a
    non-array value.
    """
    views = []
    recording: list[str] = []  # bound by `%%pmap --collectives`, not called yet
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        source = cell.source.lstrip()
        first = source.splitlines()[0] if source else ""
        body = source.partition("\n")[2]
        magic = _CELL_MAGIC.match(first)
        if magic:
            kinds, functions = _cell_magic_views(magic.group(1), first, body)
            views += [(index, kind) for kind in kinds]
            recording += [name for name in functions if name not in recording]
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
        for name in [n for n in recording if re.search(rf"(?<![\w.]){re.escape(n)}\(", source)]:
            views.append((index, "collectives"))
            recording.remove(name)
        last = source.rstrip().splitlines()[-1] if source.strip() else ""
        shown = _SHOW_LAST.match(last)
        if shown:
            views.append((index, shown.group(1)))
        elif _RECORDED_AGAIN.match(last):
            views.append((index, "collectives"))
    return views
