"""Executing the example notebooks once per test session, shared by the notebook, export and
JupyterLab tests.

The kernel is this interpreter's own ipykernel (never a kernelspec found in someone's home), and
it starts in a temporary folder: a kernel started in the repository root would import
``jaxpar_magic`` from the source tree, which lacks the ``jaxpar_magic.js`` package data that only
an installed copy has.
"""

from __future__ import annotations

import copy
import fcntl
import functools
import pickle
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import nbformat

from jaxpar_magic.face.checks import said

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CELL_TIMEOUT_S = 600  # a plan compiled by XLA:TPU for 256 chips (the planning chapter) takes minutes on 2 cores
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# Every notebook run in a kernel this session, (name, seconds), in order; tests/conftest.py prints it at
# the end. Each example chapter must appear once: every test that reads a chapter shares `_executed`.
RUNS: list[tuple[str, float]] = []

# Under pytest-xdist: the run's temporary folder, shared by its worker processes (tests/conftest.py
# sets it), where `once_per_run` keeps what one worker computed for the others. None: one process.
SHARED: Path | None = None

T = TypeVar("T")


def once_per_run(key: str, compute: Callable[[], T]) -> T:
    """`compute()`, run by one process of the test run: under xdist the first worker to ask computes
    and pickles it to SHARED while the others wait on the lock, then read it (a chapter runs once per
    run, not once per worker). Callers cache the result in their process."""
    if SHARED is None:
        return compute()
    with open(SHARED / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        done = SHARED / f"{key}.pickle"
        if done.exists():
            return pickle.loads(done.read_bytes())
        result = compute()
        partial = done.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(result))
        partial.rename(done)
        return result


def example_notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("*.ipynb"))


@dataclass(frozen=True)
class Exercise:
    """An exercise of a notebook: the cell tagged `exercise`, the next code cell (tagged `check`),
    and the solution in the collapsed block of the markdown cell after the check."""

    index: int  # the exercise cell
    check_index: int
    skeleton: str  # what the notebook ships in the exercise cell
    solution: str  # what the tests run there
    answers: tuple[str, ...]  # the names on its `%%exercise` line


_SOLUTION = re.compile(r"<details>\s*<summary>\s*Solution.*?```python\n(.*?)\n```.*?</details>", re.S)


def exercises(nb: nbformat.NotebookNode) -> list[Exercise]:
    """The notebook's exercises, each with its check and solution (AssertionError when the contract
    of face/exercises/ is broken: no check after it, no solution after the check)."""
    found = []
    cells = nb.cells
    for index, cell in enumerate(cells):
        if "exercise" not in cell.metadata.get("tags", []):
            continue
        first = cell.source.splitlines()[0] if cell.source else ""
        assert first.startswith("%%exercise "), f"exercise cell {index} must start with `%%exercise NAMES`"
        check_index = next((i for i in range(index + 1, len(cells)) if cells[i].cell_type == "code"), None)
        assert check_index is not None and "check" in cells[check_index].metadata.get("tags", []), (
            f"the code cell after exercise cell {index} must be tagged `check`")
        solution = None
        for later in cells[check_index + 1:]:
            if later.cell_type == "code" and "exercise" in later.metadata.get("tags", []):
                break
            match = _SOLUTION.search(later.source) if later.cell_type == "markdown" else None
            if match:
                solution = match.group(1)
                break
        assert solution is not None, f"no <details><summary>Solution block after the check of exercise cell {index}"
        assert solution.splitlines()[0] == first, f"exercise {index}: the solution starts with another line: {solution!r}"
        found.append(Exercise(index, check_index, cell.source, solution, tuple(first.split()[1:])))
    return found


def with_solutions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of `nb` with every exercise cell holding its solution."""
    filled = copy.deepcopy(nb)
    for exercise in exercises(nb):
        filled.cells[exercise.index].source = exercise.solution
    return filled


@dataclass
class Probe:
    """What a check printed after the exercise cell was run with `source` (after a full run)."""

    label: str
    source: str
    exercise_failed: bool
    check_lines: list[str]


@functools.cache
def _executed(path: Path) -> tuple[nbformat.NotebookNode, dict[int, list[Probe]]]:
    if path.parent != EXAMPLES:
        return _execute(path)
    return once_per_run(f"chapter-{path.stem}", lambda: _execute(path))


def _execute(path: Path) -> tuple[nbformat.NotebookNode, dict[int, list[Probe]]]:
    from exercise_probes import probes_for
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    shipped = nbformat.read(path, as_version=4)
    nb = with_solutions(shipped)
    checks = {e.check_index: e for e in exercises(shipped)}
    probes: dict[int, list[Probe]] = {}
    # No kernel folders: only the native kernel of the interpreter running the tests.
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jpm-kernel-") as cwd:
        client = NotebookClient(
            nb,
            km=km,
            timeout=CELL_TIMEOUT_S,
            startup_timeout=120,
            resources={"metadata": {"path": cwd}},
            store_widget_state=True,
        )
        client.reset_execution_trackers()
        chapter = len(nb.cells)
        # cleanup_kc: shut the kernel down afterwards; nbclient keeps a kernel whose `km` it was given.
        with client.setup_kernel(cleanup_kc=True):
            for index in range(chapter):
                # Raises CellExecutionError on any error a cell is not tagged to expect.
                client.execute_cell(nb.cells[index], index, execution_count=client.code_cells_executed + 1)
                if index in checks:
                    probes[checks[index].index] = _probe(client, nb, checks[index], probes_for(path.name, checks[index]))
            client.set_widgets_metadata()
        del nb.cells[chapter:]  # the probes' cells (see _probe)
    RUNS.append((path.name if path.parent == EXAMPLES else "a test's own cells", time.monotonic() - started))
    return nb, probes


def _probe(client, nb, exercise: Exercise, sources: list[tuple[str, str]]) -> list[Probe]:
    """Run the exercise cell with each probe source, then its check, in the live kernel after the
    full run; then the solution and the check again, so the cells after it see what they expect.
    An empty probe source is skipped by nbclient, as JupyterLab skips an empty cell: only the check runs.

    nbclient keeps a cell it runs at its index in the notebook, and later display updates find it
    there, so the probes' cells are appended after the chapter's (and cut off after the run). Their
    widgets are dropped from the notebook's saved widget state."""
    widgets_before = set(client.widget_state)
    check = nb.cells[exercise.check_index]
    found = []
    for label, source in [*sources, ("solution again", exercise.solution)]:
        tried = nbformat.v4.new_code_cell(source, metadata={"tags": ["raises-exception"]})
        checked = nbformat.v4.new_code_cell(check.source)
        for cell in (tried, checked):
            nb.cells.append(cell)
            client.execute_cell(cell, len(nb.cells) - 1, execution_count=client.code_cells_executed + 1)
        printed = "".join(said(o) for o in checked.outputs)  # printed text, and a check's line
        found.append(Probe(label, source, any(o.output_type == "error" for o in tried.outputs), printed.splitlines()))
    for model_id in set(client.widget_state) - widgets_before:
        client.widget_state.pop(model_id, None)
        client.widget_buffers.pop(model_id, None)
    return found


def executed_source(sources: list[str]) -> list:
    """The cells of a notebook made of `sources`, run top to bottom in a fresh kernel (not cached)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    with tempfile.NamedTemporaryFile(suffix=".ipynb", mode="w", delete=False) as f:
        nbformat.write(nb, f)
    try:
        return list(_execute(Path(f.name))[0].cells)
    finally:
        Path(f.name).unlink()


def executed(path: Path) -> nbformat.NotebookNode:
    """A deep copy of the notebook at ``path`` (its exercises solved) after running it top to bottom
    (cached)."""
    return copy.deepcopy(_executed(Path(path).resolve())[0])


def exercise_probes(path: Path) -> dict[int, list[Probe]]:
    """For each exercise cell (by index): what its check printed for every probe source
    (tests/exercise_probes.py), run after the full run, and for the solution again."""
    return _executed(Path(path).resolve())[1]


def rich_outputs(nb: nbformat.NotebookNode):
    """(cell index, output) for every display_data / execute_result output."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") in ("display_data", "execute_result"):
                yield index, output


def _assigned_names(body: str) -> list[str]:
    """Names a cell body assigns at its top level, in order (IPython syntax allowed), less those a
    later top-level `del` removes: the cell binds them to nothing, so no view shows them."""
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
        elif isinstance(node, ast.Delete):
            deleted: list[str] = []
            for target in node.targets:
                for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    if isinstance(element, ast.Name):
                        deleted.append(element.id)
            names = [name for name in names if name not in deleted]
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
    if "--plan" in flags:  # the plan view (the explorer with --explore) only; names bound as ShapeDtypeStructs
        return ([] if "--no-show" in flags else ["explorer" if "--explore" in flags else "plan"]), []
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
    if "--profile" in flags:
        kinds.append("profile")
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
    * `--profile` then adds a ``profile`` view, even with `--no-show`;
    * `--plan` shows only a ``plan`` view (none with `--no-show`), `--plan --explore` an ``explorer``
      view instead; `--as-code` shows no view;
    * a plain cell whose last line is ``[jaxpar_magic.]show_<kind>(...)`` shows that view, and one
      whose last line is ``fn.collectives()`` a ``collectives`` view;
    * a cell tagged ``raises-exception`` shows nothing;
    * an exercise cell (``%%exercise NAMES`` first) shows what the rest of it shows.

    A final expression that is an array is not counted: example cells end in a statement or a
    non-array value.
    """
    views = []
    recording: list[str] = []  # bound by `%%pmap --collectives`, not called yet
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        source = cell.source.lstrip()
        if source.startswith("%%exercise"):  # the rest of an exercise cell runs as a cell of its own
            source = source.partition("\n")[2].lstrip()
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
