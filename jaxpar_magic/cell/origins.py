"""Whether code is a library's or the user's, by where it was installed from rather than by folder.

Library code is never walked through its globals by the fingerprints (cell/fingerprints.py): its
module state is not the user's to change, and its mutable internals (a registry, a counter) would
change the key of every cell that reaches them. A file is library code when it is

- frozen, or in the standard library, the interpreter's own site-packages, or this package;
- a module of an installed distribution, wherever it was installed: `pip install --target DIR` with
  DIR on PYTHONPATH, `pip install --user`, Debian's `dist-packages`, a legacy `setup.py develop`: a
  file under a folder on sys.path, in a top-level package or module that the metadata in that same
  folder (`*.dist-info`, `*.egg-info`) declares (its `top_level.txt`, else its RECORD's paths);
- a module of an editable install (`pip install -e`): a distribution whose `direct_url.json` says
  "editable", for the top-level names it declares (else its own normalised name), where the import
  system finds them, if that lies in the source folder the install names.

Everything else is the user's: a notebook cell, `__main__`, a script, and the user's own modules in a
folder on sys.path with no metadata declaring them (which keep every re-run guarantee of the README's
"Re-running cells, and memory"). A source checkout put on sys.path with no metadata is the user's too:
nothing tells it from the user's own folder of modules.

The answer for a file is cached (the fingerprints ask per function); what a folder's metadata declares
is cached by the folder's modification time, so a package installed while the kernel runs is seen.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import urllib.parse
import urllib.request

_METADATA = (".dist-info", ".egg-info")


@functools.lru_cache(maxsize=4096)
def is_library_file(filename: str) -> bool:
    """Whether code from `filename` is library code (see the module docstring)."""
    if filename.startswith("<"):  # <ipython-input-…>, <string> (dataclass methods) are the user's
        return filename.startswith("<frozen")
    path = os.path.realpath(filename)
    if path.startswith(_fixed_roots()):
        return True
    return _declared_on_sys_path(path) or path.startswith(_editable_roots(_import_folders()))


@functools.lru_cache(maxsize=1)
def _fixed_roots() -> tuple[str, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # jaxpar_magic itself
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


def _import_folders() -> tuple[tuple[str, int], ...]:
    """(real path, modification time) of each folder on sys.path, in order."""
    found = []
    for entry in sys.path:
        real = _real_folder(entry or os.curdir)
        if real is not None:
            try:
                found.append((real, os.stat(real).st_mtime_ns))
            except OSError:  # removed since
                pass
    return tuple(found)


def _real_folder(entry: str) -> str | None:
    real = os.path.realpath(entry)
    return real if os.path.isdir(real) else None


def _declared_on_sys_path(path: str) -> bool:
    """Whether `path` lies in a top-level package or module that the metadata of the folder on sys.path
    holding it declares."""
    for folder, mtime in _import_folders():
        inside = os.path.join(folder, "")
        if path.startswith(inside):
            top = _top_name(path[len(inside):])
            if top in _declared(folder, mtime):
                return True
    return False


def _top_name(relative: str) -> str:
    """The top-level import name of a file at `relative` below a folder on sys.path: `flax` for
    flax/nnx/module.py, `six` for six.py, `_yaml` for _yaml.cpython-311-x86_64-linux-gnu.so."""
    first = relative.split(os.sep, 1)[0]
    return first.split(".", 1)[0]


@functools.lru_cache(maxsize=64)
def _declared(folder: str, mtime: int) -> frozenset[str]:
    """The top-level names the distributions installed in `folder` declare (`mtime` keys the cache)."""
    names: set[str] = set()
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(_METADATA) and e.is_dir()]
    except OSError:
        return frozenset()
    for entry in entries:
        names.update(_top_names(entry.path))
    return frozenset(names)


def _top_names(metadata: str) -> set[str]:
    """A distribution's top-level names, from its metadata folder: top_level.txt, else the first part
    of each path its RECORD lists (not its metadata, not files installed outside the folder)."""
    listed = _read(metadata, "top_level.txt")
    if listed is not None:
        return {line.strip().replace("/", os.sep).split(os.sep)[0] for line in listed.splitlines() if line.strip()}
    record = _read(metadata, "RECORD") or _read(metadata, "installed-files.txt") or ""
    own = os.path.basename(metadata)
    names = set()
    for line in record.splitlines():
        first = line.split(",", 1)[0].split("/", 1)[0]
        if first and first != own and first not in ("..", "__pycache__") and not first.endswith(_METADATA):
            names.add(first.split(".", 1)[0])
    return names


def _read(folder: str, name: str) -> str | None:
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=8)
def _editable_roots(folders: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    """Where the import system finds the top-level packages of the editable installs in `folders`,
    kept when that lies in the source folder the install names."""
    roots = []
    for folder, _ in folders:
        for source, names in _editable_installs(folder):
            for name in names:
                roots += [place for place in _found_at(name) if place.startswith(source)]
    return tuple(roots)


def _found_at(name: str) -> list[str]:
    """Where the import system finds top-level `name` (already imported, or as it would be): its
    package folders (ending in a separator), or its one file; nothing when it is not found."""
    import importlib.util

    module = sys.modules.get(name)
    try:
        spec = getattr(module, "__spec__", None) or importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a finder that refuses the name: not found
        return []
    if spec is None:
        return []
    folders = [os.path.join(os.path.realpath(p), "") for p in spec.submodule_search_locations or ()]
    return folders or ([os.path.realpath(spec.origin)] if spec.origin else [])


def _editable_installs(folder: str) -> list[tuple[str, set[str]]]:
    """(source folder, top-level names) of each editable install whose metadata is in `folder`."""
    found = []
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".dist-info") and e.is_dir()]
    except OSError:
        return found
    for entry in entries:
        direct = _read(entry.path, "direct_url.json")
        if direct is None:
            continue
        try:
            info = json.loads(direct)
        except ValueError:
            continue
        url = info.get("url", "") if isinstance(info, dict) else ""
        if not (isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable")) or not url.startswith("file:"):
            continue
        source = os.path.join(os.path.realpath(urllib.request.url2pathname(urllib.parse.urlparse(url).path)), "")
        listed = _read(entry.path, "top_level.txt")
        names = {n.strip() for n in listed.splitlines() if n.strip()} if listed else {_module_name(entry.name)}
        found.append((source, names))
    return found


def _module_name(metadata_name: str) -> str:
    """The import name a distribution's own name suggests: `my_pkg` for my-pkg-0.1.dist-info."""
    project = metadata_name.rsplit("-", 1)[0] if "-" in metadata_name else metadata_name
    return re.sub(r"[-.]+", "_", project).lower()
