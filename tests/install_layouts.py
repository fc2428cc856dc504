"""Flax, optax and Equinox installed the ways people install them, built cheaply from this
environment's own installation (a helper module of tests/test_install_layouts.py).

Each layout copies the files each distribution's RECORD lists (hard links where the file system
allows, else copies; never symbolic links, which would resolve back into this environment's
site-packages) into a folder shaped as pip, Debian or an editable install leaves it, and says how a
fresh interpreter reaches it: environment variables, and a few lines to run before anything imports
Flax. The interpreter's own site-packages keeps its copies, so each layout must come first on the
path, as it would on a machine where it is the only copy.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

# What `from flax import nnx; import optax, equinox` imports beside JAX and NumPy, by distribution: a
# host without network (a TPU VM) gets them with `pip install --target` (bench/device_check.sh).
DISTRIBUTIONS = ("flax", "optax", "equinox", "jaxtyping", "treescope", "wadler-lindig", "absl-py", "msgpack",
                 "rich", "PyYAML")
EDITABLE = ("flax", "optax", "equinox")  # the libraries a researcher hacks on from a checkout


@dataclass
class Layout:
    name: str
    folder: Path  # where the libraries' files are
    env: dict[str, str] = field(default_factory=dict)
    preamble: str = ""  # run in the fresh interpreter before Flax is imported


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _files(name: str):
    """(path relative to its folder, the installed file) of each file a distribution installed in its
    folder (not its scripts in bin/, not compiled .pyc files, which the interpreter writes again)."""
    dist = importlib.metadata.distribution(name)
    for relative in dist.files or ():
        if relative.parts[0] == ".." or relative.suffix == ".pyc":
            continue
        installed = Path(dist.locate_file(relative))
        if installed.is_file():
            yield Path(*relative.parts), installed


def install_into(folder: Path, names=DISTRIBUTIONS) -> Path:
    """What `pip install --target folder` would leave for these distributions: packages and metadata."""
    for name in names:
        for relative, installed in _files(name):
            _link_or_copy(installed, folder / relative)
    return folder


def _path_first(folder: Path) -> dict[str, str]:
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(folder)] + ([existing] if existing else []))}


def target(root: Path) -> Layout:
    """`pip install --target DIR` with DIR first on PYTHONPATH (how the TPU VM has them)."""
    folder = install_into(root / "target")
    return Layout("target", folder, _path_first(folder))


def dist_packages(root: Path) -> Layout:
    """Debian's system folder, /usr/lib/python3/dist-packages (apt's python3-* packages)."""
    folder = install_into(root / "usr" / "lib" / "python3" / "dist-packages")
    return Layout("dist-packages", folder, _path_first(folder))


def user(root: Path) -> Layout:
    """`pip install --user` under PYTHONUSERBASE. A virtual environment turns the user's site off; the
    preamble turns it back on as a plain interpreter has it, first on the path."""
    base = root / "userbase"
    folder = Path(sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(base)}))
    install_into(folder)
    preamble = (
        "import site, sys\n"
        f"assert site.getusersitepackages() == {str(folder)!r}, site.getusersitepackages()\n"
        "site.ENABLE_USER_SITE = True\n"
        "sys.path.insert(0, site.getusersitepackages())\n"
    )
    return Layout("user", folder, {"PYTHONUSERBASE": str(base)}, preamble)


FINDER = '''\
"""What setuptools' editable finder does: map top-level names to source folders off sys.path."""
import importlib.machinery
import os
import sys

MAPPING = {mapping!r}


class EditableFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname not in MAPPING:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [os.path.dirname(MAPPING[fullname])])


def install():
    sys.meta_path.insert(0, EditableFinder)  # setuptools appends it; first here, before this venv's own copy
'''


def editable(root: Path) -> Layout:
    """`pip install -e` of source checkouts of Flax, optax and Equinox, as setuptools writes it when
    the sources are not on sys.path: a finder that maps each top-level name to its checkout, loaded
    by a .pth file, and metadata whose direct_url.json names the checkout as editable."""
    site_dir, sources = root / "editable-site", root / "src"
    mapping = {}
    for name in EDITABLE:
        dist = importlib.metadata.distribution(name)
        checkout = sources / name
        top = name  # these three import as their own names
        for relative, installed in _files(name):
            if relative.parts[0] == top:
                _link_or_copy(installed, checkout / relative)
        mapping[top] = str(checkout / top)
        info = site_dir / f"{name}-{dist.version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(dist.read_text("METADATA") or f"Name: {name}\n")
        (info / "top_level.txt").write_text(top + "\n")
        (info / "direct_url.json").write_text(json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}}))
        (info / "INSTALLER").write_text("pip\n")
    (site_dir / "__editable___finder.py").write_text(FINDER.format(mapping=mapping))
    (site_dir / "__editable__.libraries.pth").write_text("import __editable___finder; __editable___finder.install()\n")
    preamble = f"import site\nsite.addsitedir({str(site_dir)!r})  # as the interpreter does for its site folders\n"
    return Layout("editable", sources, _path_first(site_dir), preamble)


LAYOUTS = {"target": target, "dist-packages": dist_packages, "user": user, "editable": editable}
