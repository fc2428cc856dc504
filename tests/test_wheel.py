"""The built wheel carries the widgets' JavaScript, and a copy installed from it (not the source
tree) serves every view's ES module and renders its three forms.

`js/` lives beside the package in the repository and becomes ``jaxpar_magic/js`` only in the
wheel (``[tool.setuptools.package-dir]``), so this is the check that a user's install works.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from notebooks import ROOT

pytestmark = pytest.mark.slow

# Left out of the build copy: environments, outputs, and setuptools' own build/ folder, whose stale
# files would otherwise end up in the wheel.
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "test-artifacts", "node_modules", "*.egg-info",
                              "__pycache__", ".pytest_cache", ".hypothesis")


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
    probe = textwrap.dedent(
        """
        import re, sys
        from pathlib import Path
        import jaxpar_magic
        assert Path(jaxpar_magic.__file__).is_relative_to(Path(sys.argv[1])), jaxpar_magic.__file__

        import jax
        jax.config.update("jax_platforms", "cpu")
        from IPython.core.interactiveshell import InteractiveShell
        from jaxpar_magic import views

        kinds = {}
        for name in dir(views):
            cls = getattr(views, name)
            if isinstance(cls, type) and issubclass(cls, views.base.ViewBase) and cls is not views.base.ViewBase:
                esm = cls._esm
                # One self-contained module: a blob: URL cannot resolve relative imports.
                assert "render" in esm and 'from "./' not in esm and "from './" not in esm, name
                assert ".jpm-" in cls._css, name
                kinds[name] = len(esm)
        assert {"DevicesView", "ResultView"} <= set(kinds), kinds

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "jaxpar_magic")
        view = jaxpar_magic.show_devices(simulate=4)
        shell.run_cell("import jax.numpy as jnp\\nfrom jax import lax\\nx = jnp.arange(4.0)")
        bundles = [view._repr_mimebundle_()[0]]
        from IPython.utils.capture import capture_output
        with capture_output() as shown:
            shell.run_cell_magic("pmap", "-a d", "total = lax.psum(x, 'd')")
        bundles += [o.data for o in shown.outputs]
        assert len(bundles) == 2, len(bundles)
        for data in bundles:
            assert "application/vnd.jupyter.widget-view+json" in data
            assert re.search(r'<div class="jpm-view jpm-[a-z-]+"', data["text/html"])
            assert data["text/plain"].strip()
        print("ok", sorted(kinds))
        """
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok"), done.stdout
