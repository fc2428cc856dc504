"""The built wheel carries the widgets' JavaScript, and a copy installed from it (not the source
tree) serves every view's ES module and renders its three forms.

`js/` lives beside the package in the repository and becomes ``jaxpar_magic/js`` only in the
wheel (``[tool.setuptools.package-dir]``), so this is the check that a user's install works.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from install_probe import SKIP, VIEW_PROBE
from notebooks import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = work / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("jaxpar_magic-*.whl")
    return built


def test_wheel_carries_every_js_and_css_file(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.split("/", 2)[2] for n in names if n.startswith("jaxpar_magic/js/") and not n.endswith(".py")}
    in_repo = {p.name for p in (ROOT / "js").iterdir() if p.suffix in (".js", ".css")}
    assert in_repo and shipped == in_repo, f"wheel ships {sorted(shipped)}, js/ has {sorted(in_repo)}"
    views = {p.name for p in (ROOT / "jaxpar_magic" / "views").glob("*.py")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("jaxpar_magic/views/")} >= views
    assert not [n for n in names if n.startswith(("tests/", "examples/", "js/"))], "stray top-level files"


def test_installed_copy_renders_every_view(wheel: Path, tmp_path: Path):
    """Unpack the wheel as site-packages would hold it; import it with the repository out of reach."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", VIEW_PROBE, str(site)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok"), done.stdout
