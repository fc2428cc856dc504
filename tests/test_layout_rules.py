"""The package's layout rules (README "How the code is laid out"), read from the source with ast,
nothing imported: no module reaches into another's `_private` names, no import cycle, no module
(Python or JavaScript) over 600 lines, and imports flow one way between the subpackages."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxpar_magic"
MAX_LINES = 600

# What each subpackage may import from the package besides itself (errors.py is shared by all).
MAY_IMPORT = {
    "cell": set(),
    "engines": {"cell"},
    "views": {"cell"},
    "stages": {"cell", "engines", "views"},
    "cluster": {"cell", "views"},
    "face": {"cell", "engines", "views", "stages", "cluster"},
    "grade": {"face"},  # python -m jaxpar_magic.grade: runs notebooks, reads what the checks saved
}
SHARED = {"jaxpar_magic", "jaxpar_magic.errors"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: pathlib.Path, known: dict) -> list[tuple[str, str]]:
    """(module imported, the name taken from it) for every package import, lazy ones included."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("jaxpar_magic"):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                found.append((full, "") if full in known else (source, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("jaxpar_magic")]
    return found


def subpackage(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else None


def test_no_private_names_cross_modules():
    known = modules()
    crossing = [f"{name} imports {source}.{taken}" for name, path in known.items()
                for source, taken in imports(name, path, known)
                if taken.startswith("_") and not taken.startswith("__") and source != name]
    assert not crossing, crossing


def test_no_import_cycles():
    known = modules()
    edges = {name: {source for source, _ in imports(name, path, known) if source in known and source != name
                    and not (path.name == "__init__.py" and source.startswith(name + "."))}
             for name, path in known.items()}
    seen, on_path, cycles = set(), [], []

    def visit(node):
        if node in on_path:
            cycles.append(on_path[on_path.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        on_path.append(node)
        for target in sorted(edges[node]):
            visit(target)
        on_path.pop()

    for node in sorted(edges):
        visit(node)
    assert not cycles, cycles[:3]


def test_no_module_over_600_lines():
    files = list(PACKAGE.rglob("*.py")) + list((ROOT / "js").glob("*.js"))
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_imports_flow_one_way_between_subpackages():
    known = modules()
    assert set(MAY_IMPORT) <= {subpackage(n) for n in known}, "every layer is a subpackage"
    flat = [n for n in known if n.count(".") == 1 and n not in SHARED and subpackage(n) is None]
    assert not flat, f"modules outside the subpackages: {flat}"
    wrong = []
    for name, path in known.items():
        layer = subpackage(name)
        if layer is None:
            continue
        for source, _ in imports(name, path, known):
            target = subpackage(source) if source not in SHARED else None
            if target is not None and target != layer and target not in MAY_IMPORT[layer]:
                wrong.append(f"{name} ({layer}) imports {source} ({target})")
    assert not wrong, wrong


def test_every_subpackage_is_in_the_wheel():
    """pyproject.toml lists the packages a wheel holds (setuptools does not look for them): a new
    subpackage left off that list imports from a source checkout and is missing from an install
    (jaxpar_magic.grade was, and CI's installed package failed test_grade with ModuleNotFoundError)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in PACKAGE.rglob("__init__.py")}
    assert found - listed == set()
