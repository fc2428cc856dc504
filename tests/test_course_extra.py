"""`pip install 'jaxpar_magic[course]'` installs everything the course notebooks import (issue 25: the
ecosystem chapter imported Flax and optax, which neither `.[lab]` nor `scripts/demo` installed, and a
teacher following the README met 13 tracebacks)."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

import nbformat
from IPython.core.inputtransformer2 import TransformerManager
from notebooks import ROOT, example_notebooks


def imported_modules(path) -> set[str]:
    """Top-level module names the notebook's code cells import (in the kernel or on a cluster)."""
    nb = nbformat.read(path, as_version=4)
    found: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        while source.lstrip().startswith("%%"):  # a cell magic's body is Python too (%%exercise, %%cluster, ...)
            source = source.lstrip().partition("\n")[2]
        for node in ast.walk(ast.parse(TransformerManager().transform_cell(source))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_course_extra_installs_what_the_notebooks_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    provided = requirement_names(project["dependencies"]) | requirement_names(project["optional-dependencies"]["course"])
    distributions = packages_distributions()
    missing = {}
    for path in example_notebooks():
        for module in imported_modules(path) - set(sys.stdlib_module_names) - {"jaxpar_magic"}:
            names = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
            if not names & provided:
                missing.setdefault(module, []).append(path.name)
    assert not missing, f"imported by the course but not in the course extra or the dependencies: {missing}"


def test_the_course_extra_is_what_the_readme_and_the_demo_install():
    demo = (ROOT / "scripts" / "demo").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "'.[course]'" in demo and ".[lab]" not in demo
    assert "jaxpar_magic[course]" in readme or ".[course]" in readme
