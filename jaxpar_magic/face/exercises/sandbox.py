"""A check's re-run of an exercise cell (``attempt(NAME).follows(...)``) leaves no trace (issue 40).

Before the re-run: a snapshot of what the cell can change (face/exercises/snapshot.py: the
namespace, its containers and NumPy arrays, functions, hooks), the attributes of the notebook's own
objects (classes defined in the notebook, a counter on one of them), the state of every Flax NNX
object the namespace holds (a model, its optimizer: a training cell's write-back), and the files
under the notebook's folder when the cell looks like it writes some. The inputs a cell may donate
(``--donate w``, ``donate_argnums``) run as copies, so the check never deletes the student's arrays.
After it, all of it is put back; what cannot be (a large NumPy array changed in place, a file
outside a copy) is named in the check's line. A cell whose effects cannot be undone at all (it runs
a process or a shell command, or deletes files) is not run again: the check says so.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

from .snapshot import Snapshot

_MOST_FILES = 2000
_MOST_FILE_BYTES = 4 * 2**20  # one file's content kept to put back
_MOST_KEPT_BYTES = 64 * 2**20
_WRITES = re.compile(r"open\(|\.write|save|dump|to_csv|to_parquet|Path\(|writefile|mkdir|touch")
# Calls whose effects a re-run cannot undo: (module or object, attribute) as the cell spells them.
_FOR_GOOD = {("subprocess", None), ("os", "system"), ("os", "popen"), ("os", "remove"), ("os", "unlink"),
             ("os", "rmdir"), ("os", "removedirs"), ("os", "rename"), ("os", "renames"), ("os", "replace"),
             ("os", "kill"), ("os", "killpg"), ("os", "fork"), ("os", "execv"), ("os", "spawnv"), ("shutil", None),
             ("get_ipython()", "system"), ("get_ipython()", "getoutput"), ("socket", None), ("urllib", None),
             ("requests", None), ("webbrowser", None)}
_SHELL_MAGICS = ("bash", "sh", "script", "system", "sx", "html", "javascript", "js")


def cannot_undo(body: str) -> str | None:
    """What in the cell a re-run could not undo (``runs `subprocess.run` ``), or None."""
    for text in _sources(body):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                spelled = _spelled(node.func)
                if spelled is None:
                    continue
                owner, _, attribute = spelled.rpartition(".")
                root = owner.split(".")[0]
                if (root, None) in _FOR_GOOD or (owner, attribute) in _FOR_GOOD or (root, attribute) in _FOR_GOOD:
                    return f"runs `{spelled}`"
                if spelled.endswith("run_cell_magic") and node.args and isinstance(node.args[0], ast.Constant) \
                        and node.args[0].value in _SHELL_MAGICS:
                    return f"runs `%%{node.args[0].value}`"
    return None


def _sources(body: str) -> list[str]:
    """The cell as Python, and the body of each cell magic in it (`%%shard ...` holds code as text)."""
    from IPython.core.inputtransformer2 import TransformerManager

    texts, text = [], body
    while True:
        python = TransformerManager().transform_cell(text)
        texts.append(python)
        stripped = text.lstrip()
        if not stripped.startswith("%%"):
            return texts
        magic = stripped.split(None, 1)[0][2:]
        if magic in _SHELL_MAGICS:
            texts.append(f"get_ipython().run_cell_magic({magic!r}, '', '')")
            return texts
        text = stripped.partition("\n")[2]


def _spelled(func) -> str | None:
    """`os.system`, `subprocess.run`, `get_ipython().system` for a call's function, or None."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        owner = _spelled(func.value)
        return None if owner is None else f"{owner}.{func.attr}"
    if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "get_ipython":
        return "get_ipython()"
    return None


class Sandbox:
    """Everything a re-run of `body` could change, kept to be put back (the module's docstring)."""

    def __init__(self, shell, body: str):
        self.shell = shell
        self.snapshot = Snapshot(shell, contents=True)
        namespace = shell.user_ns
        reachable = _reachable(namespace)
        self.objects = [(obj, dict(vars(obj))) for obj in reachable if _notebook_object(obj)]
        donating = "donate" in body
        self.models = _nnx_states(reachable, copy=donating)
        self.files = _Files(Path.cwd(), keep=bool(_WRITES.search(body)))
        self.donating = donating
        self.copies = {}
        if donating:  # a donated input runs as a copy: the student's own arrays are never deleted
            words = set(re.findall(r"[A-Za-z_]\w*", body))
            self.copies = {name: _private(value) for name, value in namespace.items()
                           if name in words and _holds_arrays(value)}

    def __enter__(self) -> "Sandbox":
        self.shell.user_ns.update(self.copies)
        for model, _, copied in self.models:
            if copied is not None:
                _nnx_update(model, copied)
        return self

    def given(self, value):
        """An input the check gives (`follows(w=...)`), as the re-run gets it: a copy where the cell may
        donate it, since the check's value may be one of the student's own arrays."""
        return _private(value) if self.donating and _holds_arrays(value) else value

    def __exit__(self, *exc) -> None:
        self.left = self.restore()

    def restore(self) -> list[str]:
        """Put everything back; what could not be, each as what the re-run did ("changes `x` in place")."""
        self.snapshot.restore()
        for obj, attributes in self.objects:
            now = vars(obj)
            if now.keys() != attributes.keys() or any(now[k] is not v for k, v in attributes.items()):
                now.clear()
                now.update(attributes)
        for model, state, _ in self.models:
            _nnx_update(model, state)
        return self.files.restore() + self.snapshot.changes()


def _reachable(namespace: dict) -> list:
    """The namespace's values and what its dicts, lists and tuples hold, two levels down."""
    found, seen = [], set()

    def walk(value, depth):
        if id(value) in seen or len(seen) > 5000:
            return
        seen.add(id(value))
        found.append(value)
        if depth < 2 and isinstance(value, (dict, list, tuple)):
            for item in list(value.values() if isinstance(value, dict) else value)[:1000]:
                walk(item, depth + 1)

    for name, value in list(namespace.items()):
        if not name.startswith("_"):
            walk(value, 0)
    return found


def _notebook_object(obj) -> bool:
    """An instance of a class the notebook defined (a counter, a logger), with attributes to keep."""
    cls = type(obj)
    return cls.__module__ == "__main__" and not isinstance(obj, type) and hasattr(obj, "__dict__") and not _is_nnx(obj)


def _is_nnx(value) -> bool:
    nnx = sys.modules.get("flax.nnx")
    base = getattr(nnx, "Pytree", None) or getattr(nnx, "Object", None)
    return base is not None and isinstance(value, base)


def _nnx_states(reachable: list, copy: bool) -> list:
    """(object, its state, a copy of it to run on or None) for every Flax NNX object reachable."""
    found = []
    for value in reachable:
        if _is_nnx(value):
            from flax import nnx

            import jax

            live = nnx.state(value)  # its Variables themselves: a step changes them in place
            state = jax.tree.map(lambda leaf: leaf, live)  # new Variables holding today's arrays
            copied = None
            if copy:
                copied = jax.tree.map(lambda leaf: _copy_array(leaf) if _is_jax_array(leaf) else leaf, live)
            found.append((value, state, copied))
    return found


def _nnx_update(model, state) -> None:
    from flax import nnx

    nnx.update(model, state)


def _is_jax_array(value) -> bool:
    import jax

    return isinstance(value, jax.Array)


def _holds_arrays(value) -> bool:
    """A JAX array, or a dict, list or tuple holding some (`--donate params` gives every leaf)."""
    if _is_jax_array(value):
        return True
    if isinstance(value, (dict, list, tuple)):
        import jax

        return any(_is_jax_array(leaf) for leaf in jax.tree.leaves(value))
    return False


def _private(value):
    """`value` with each JAX array a copy of its own (the containers new too)."""
    import jax

    return jax.tree.map(lambda leaf: _copy_array(leaf) if _is_jax_array(leaf) else leaf, value)


def _copy_array(array):
    import jax

    if array.is_deleted():
        return array
    return jax.device_put(array, array.sharding, may_alias=False)


class _Files:
    """The files under the notebook's folder: their sizes and times, and their contents when the
    cell looks like it writes (a re-run that changes a file it did not keep names it)."""

    def __init__(self, folder: Path, keep: bool):
        self.folder = folder
        self.seen: dict[str, tuple] = {}
        self.kept: dict[str, bytes] = {}
        kept_bytes = 0
        for path in _files(folder):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            self.seen[path] = (stat.st_mtime_ns, stat.st_size)
            if keep and stat.st_size <= _MOST_FILE_BYTES and kept_bytes + stat.st_size <= _MOST_KEPT_BYTES:
                try:
                    self.kept[path] = Path(path).read_bytes()
                    kept_bytes += stat.st_size
                except OSError:
                    pass

    def restore(self) -> list[str]:
        lost = []
        for path in _files(self.folder):
            if path not in self.seen:
                try:
                    os.remove(path)  # a file the re-run made
                except OSError:
                    lost.append(f"makes the file {os.path.relpath(path, self.folder)}")
                continue
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if (stat.st_mtime_ns, stat.st_size) != self.seen[path]:
                if path in self.kept:
                    Path(path).write_bytes(self.kept[path])
                else:
                    lost.append(f"writes the file {os.path.relpath(path, self.folder)}")
        for path in self.seen:
            if not os.path.exists(path):
                if path in self.kept:
                    Path(path).write_bytes(self.kept[path])
                else:
                    lost.append(f"deletes the file {os.path.relpath(path, self.folder)}")
        return lost


def _files(folder: Path) -> list[str]:
    """Up to _MOST_FILES files under `folder`, three levels down, hidden folders left out."""
    found = []
    for root, dirs, names in os.walk(folder):
        depth = len(Path(root).relative_to(folder).parts)
        dirs[:] = [] if depth >= 3 else [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in names:
            found.append(os.path.join(root, name))
            if len(found) >= _MOST_FILES:
                return found
    return found
