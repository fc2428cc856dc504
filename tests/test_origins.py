"""Which code is a library's and which is the user's (cell/origins.py): by the metadata of what was
installed, wherever it was installed; and the user's own module in a plain folder on sys.path keeps
every re-run guarantee (README "Re-running cells, and memory"), checked against plain JAX.

tests/test_install_layouts.py runs real Flax, optax and Equinox installs in fresh interpreters; this
file builds small folders and checks the rule itself, in this process.
"""
from __future__ import annotations

import importlib
import json
import os
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from IPython.extensions.autoreload import superreload

from jaxpar_magic.cell.origins import is_library_file

LINE = "--mesh data=8 --in v=data --no-show"


def write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path holding what `pip install --target` leaves: a package declared by its
    RECORD only (as flit and hatch write it), one declared by top_level.txt with an extension module,
    and a module of the user's dropped beside them that no metadata declares."""
    folder = tmp_path / "target"
    write(folder / "libpkg" / "__init__.py")
    write(folder / "libpkg" / "nested" / "mod.py")
    write(folder / "libpkg-1.0.dist-info" / "RECORD",
          "libpkg/__init__.py,,\nlibpkg/nested/mod.py,,\nlibpkg-1.0.dist-info/RECORD,,\n../../bin/libpkg-cli,,\n")
    write(folder / "other_pkg" / "__init__.py")
    write(folder / "_other_ext.cpython-311-x86_64-linux-gnu.so")
    write(folder / "Other_Pkg-2.0.dist-info" / "top_level.txt", "other_pkg\n_other_ext\n")
    write(folder / "mine.py")
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_package_installed_anywhere_on_sys_path_is_a_librarys(site):
    assert is_library_file(str(site / "libpkg" / "__init__.py"))
    assert is_library_file(str(site / "libpkg" / "nested" / "mod.py"))
    assert is_library_file(str(site / "other_pkg" / "__init__.py"))
    assert is_library_file(str(site / "_other_ext.cpython-311-x86_64-linux-gnu.so"))


def test_a_module_no_metadata_declares_is_the_users_even_beside_installed_ones(site, tmp_path, monkeypatch):
    assert not is_library_file(str(site / "mine.py"))
    plain = tmp_path / "notebooks"
    write(plain / "helpers.py")
    write(plain / "pkg_of_mine" / "__init__.py")
    monkeypatch.syspath_prepend(str(plain))
    assert not is_library_file(str(plain / "helpers.py"))
    assert not is_library_file(str(plain / "pkg_of_mine" / "__init__.py"))
    assert not is_library_file(str(tmp_path / "elsewhere.py"))  # on no folder of sys.path at all


def test_a_package_installed_while_the_kernel_runs_is_seen(site):
    assert not is_library_file(str(site / "mine.py"))  # the folder's metadata read once
    write(site / "late" / "__init__.py")
    write(site / "late-0.1.dist-info" / "top_level.txt", "late\n")
    os.utime(site, ns=(0, os.stat(site).st_mtime_ns + 10**9))  # pip's writes move the folder's time on
    assert is_library_file(str(site / "late" / "__init__.py"))


def test_the_standard_library_frozen_modules_and_cells(site):
    assert is_library_file(json.__file__)
    assert is_library_file("<frozen importlib._bootstrap>")
    assert not is_library_file("<ipython-input-3-abc>")
    assert not is_library_file("<string>")


def test_an_editable_install_is_a_librarys_where_its_metadata_says(tmp_path, monkeypatch):
    """`pip install -e checkout` (setuptools, src layout): metadata in a site folder with
    direct_url.json naming the checkout, the checkout's src/ on sys.path. The package it declares is a
    library's; a scratch module in the same src/ folder and the checkout's scripts are not."""
    checkout = tmp_path / "checkout"
    write(checkout / "src" / "edpkg_jpm" / "__init__.py")
    write(checkout / "src" / "scratch_jpm.py")
    write(checkout / "tools" / "plot.py")
    info = tmp_path / "site" / "edpkg_jpm-0.1.dist-info"
    write(info / "top_level.txt", "edpkg_jpm\n")
    write(info / "direct_url.json", json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}}))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(checkout / "src"))
    assert is_library_file(str(checkout / "src" / "edpkg_jpm" / "__init__.py"))
    assert not is_library_file(str(checkout / "src" / "scratch_jpm.py"))
    assert not is_library_file(str(checkout / "tools" / "plot.py"))


# --- the user's own module in a plain folder, against plain JAX ----------------------------------------

HELPERS = """
SCALE = 2.0

def g(v):
    return v + 1.0

def f(v):
    return g(v) * SCALE
"""


@pytest.fixture
def user_module(jx, tmp_path, monkeypatch):
    """`load(text)`: writes the user's module `jpm_user_helpers` into a plain folder first on sys.path,
    and a cell imports it and its `f`; `v` is on the devices. Returns the module's path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "jpm_user_helpers.py"

    def load(text: str) -> Path:
        write(path, text)
        importlib.sys.modules.pop("jpm_user_helpers", None)
        jx.run_cell("import jpm_user_helpers\nfrom jpm_user_helpers import f\nv = jnp.arange(8.0)",
                    store_history=False).raise_error()
        return path

    yield load
    importlib.sys.modules.pop("jpm_user_helpers", None)


def rerun(ip, expected_fn, compiles, recompiles: bool):
    """Run `y = f(v)` through %%shard and compare with `expected_fn` under a fresh `jax.jit` (it
    reads today's module)."""
    before = compiles.count
    ip.run_cell_magic("shard", LINE, "y = f(v)")
    assert (compiles.count > before) == recompiles, f"compiles {before} -> {compiles.count}"
    v = ip.user_ns["v"]
    np.testing.assert_array_equal(np.asarray(ip.user_ns["y"]), np.asarray(jax.jit(expected_fn)(v)))


def test_a_users_module_in_a_plain_folder_keeps_every_rerun_guarantee(jx, user_module, compiles):
    path = user_module(HELPERS)
    assert not is_library_file(str(path))
    rerun(jx, lambda v: (v + 1.0) * 2.0, compiles, recompiles=True)
    rerun(jx, lambda v: (v + 1.0) * 2.0, compiles, recompiles=False)  # nothing changed: the cached program
    jx.run_cell("jpm_user_helpers.SCALE = 3.0", store_history=False).raise_error()  # a global its function reads
    rerun(jx, lambda v: (v + 1.0) * 3.0, compiles, recompiles=True)
    write(path, HELPERS.replace("v + 1.0", "v - 1.0"))  # the file edited, the module reloaded
    jx.run_cell("import importlib\nimportlib.reload(jpm_user_helpers)", store_history=False).raise_error()
    rerun(jx, lambda v: (v - 1.0) * 2.0, compiles, recompiles=True)  # `f` is the old one; it calls the new `g`


def test_a_function_autoreload_changed_in_place_compiles_again(jx, user_module, compiles):
    """%autoreload swaps the code of the very function the notebook holds (IPython's superreload):
    the same object, reading no global, with new code."""
    path = user_module("def f(v):\n    return v * 2.0\n")
    rerun(jx, lambda v: v * 2.0, compiles, recompiles=True)
    held = jx.user_ns["f"]
    write(path, "def f(v):\n    return v * 5.0\n")
    superreload(importlib.sys.modules["jpm_user_helpers"])
    assert jx.user_ns["f"] is held
    rerun(jx, lambda v: v * 5.0, compiles, recompiles=True)
