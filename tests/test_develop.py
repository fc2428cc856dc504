"""Contributors work the usual way: `python -m pytest` from the repository root and
`pip install -e .` both import the source tree, and its views find their JavaScript in `js/`."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from install_probe import SKIP, VIEW_PROBE
from notebooks import ROOT


def run_probe(python: str, place: Path, cwd: Path, env: dict) -> None:
    done = subprocess.run([python, "-c", VIEW_PROBE, str(place)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok"), done.stdout


def test_the_source_tree_renders_every_view(tmp_path: Path):
    """What `python -m pytest` from the root imports: the checkout, with js/ beside the package."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    run_probe(sys.executable, ROOT / "jaxpar_magic", tmp_path, env)


@pytest.mark.slow
def test_an_editable_install_renders_every_view(tmp_path: Path):
    """`pip install -e .` into a fresh environment (dependencies borrowed from this one), then the
    probe from outside the checkout."""
    source = tmp_path / "checkout"
    shutil.copytree(ROOT, source, ignore=SKIP)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # The dependencies, borrowed from this environment, without its own jaxpar_magic (an installed
    # copy there would be found before the editable one's finder).
    borrowed = tmp_path / "borrowed"
    borrowed.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("jaxpar_magic", "__editable__", "_jaxpar_magic")) and entry.suffix != ".pth":
            (borrowed / entry.name).symlink_to(entry)
    Path(site, "zz_borrowed.pth").write_text(f"{borrowed}\n")
    installed = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(source)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    run_probe(python, source / "jaxpar_magic", tmp_path, env)
