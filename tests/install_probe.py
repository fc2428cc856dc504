"""What every way of installing the package must give: a probe run in a fresh interpreter that
imports jaxpar_magic from the place under test (argv[1]), builds every view's self-contained ES
module, and renders a %devices and a %%pmap view with their widget, HTML and text forms."""
from __future__ import annotations

import shutil
import textwrap

# Left out of copies of the repository: environments, outputs, and setuptools' own build/ folder,
# whose stale files would otherwise end up in a wheel.
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "test-artifacts", "node_modules", "*.egg-info",
                              "__pycache__", ".pytest_cache", ".hypothesis")

VIEW_PROBE = textwrap.dedent(
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
            esm = cls._bundle
            # One self-contained module: a blob: URL cannot resolve relative imports.
            assert "render" in esm and 'from "./' not in esm and "from './" not in esm, name
            assert "widget_manager.get_model" in cls._esm, name  # what the model ships: the loader
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
