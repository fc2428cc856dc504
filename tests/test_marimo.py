"""marimo: the plain-Python twins' views under `marimo run`, in Chromium.

marimo has no `%magics`; its users call the twins (`show_devices`, `make_mesh` + `show_mesh`,
`show_sharding`), whose values are our anywidgets. marimo mounts each inside a shadow root, where a
stylesheet in the page's head does not reach: each view must bring its styles to its own root
(js/loader.js). The assertions are layout facts: the views' styles apply, the device cards stand in
a row, the mesh is a grid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from chromium import artifacts_dir, browser, collect_errors, require_chromium, screenshot
from test_jupyterlab import free_port

pytestmark = [pytest.mark.slow, pytest.mark.browser]

APP = textwrap.dedent('''
    import marimo

    app = marimo.App()


    @app.cell
    def _():
        import jaxpar_magic
        jaxpar_magic.simulate(8)
        return (jaxpar_magic,)


    @app.cell
    def _(jaxpar_magic):
        jaxpar_magic.show_devices()
        return


    @app.cell
    def _(jaxpar_magic):
        mesh = jaxpar_magic.make_mesh("data=4 model=2")
        jaxpar_magic.show_mesh(mesh)
        return (mesh,)


    @app.cell
    def _(jaxpar_magic, mesh):
        import jax.numpy as jnp
        x = jaxpar_magic.place(jnp.arange(64.0).reshape(8, 8), mesh, ("data", None))
        jaxpar_magic.show_sharding(x, "x")
        return


    if __name__ == "__main__":
        app.run()
''')

#: Inside marimo's shadow roots: each view's kind, its chip style, and where its cards and cells are.
FACTS_JS = """() => {
    const roots = [];
    const walk = (node) => {
        for (const el of node.querySelectorAll('*')) {
            if (el.shadowRoot) { roots.push(el.shadowRoot); walk(el.shadowRoot); }
        }
    };
    walk(document);
    return roots.flatMap((root) => [...root.querySelectorAll('.jpm-view:not(.jpm-view .jpm-view)')].map((v) => ({
        kind: [...v.classList].find((c) => c.startsWith('jpm-') && c !== 'jpm-view'),
        styled: !!root.querySelector('#jpm-views-css'),
        chipRadius: v.querySelector('.jpm-chip') ? getComputedStyle(v.querySelector('.jpm-chip')).borderTopLeftRadius : null,
        cardTops: [...v.querySelectorAll('.jpm-card')].map((e) => Math.round(e.getBoundingClientRect().top)),
        cellTops: [...v.querySelectorAll('.jpm-cell')].map((e) => Math.round(e.getBoundingClientRect().top)),
        cellLefts: [...v.querySelectorAll('.jpm-cell')].map((e) => Math.round(e.getBoundingClientRect().left)),
        blocks: v.querySelectorAll('.jpm-block').length,
        text: v.innerText.slice(0, 120),
    })));
}"""


def test_twins_under_marimo_run(tmp_path: Path):
    require_chromium()
    app = tmp_path / "app.py"
    app.write_text(APP)
    port = free_port()
    env = {**os.environ, "HOME": str(tmp_path), "MARIMO_SKIP_UPDATE_CHECK": "1"}
    log = tmp_path / "marimo.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "marimo", "run", str(app), "--headless", "--host", "127.0.0.1",
                                 "--port", str(port), "--no-token"], stdout=sink, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    errors: list[str] = []
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if proc.poll() is not None:
                    pytest.fail(f"marimo exited: {log.read_text(errors='replace')[-3000:]}")
                import time

                time.sleep(0.5)
        with browser() as b:
            context = b.new_context(viewport={"width": 1100, "height": 1200}, device_scale_factor=1)
            context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(url) else r.abort())
            page = context.new_page()
            collect_errors(page, errors, ignore=lambda text: "net::ERR_FAILED" in text)
            try:
                page.goto(url)
                page.wait_for_function(f"() => ({FACTS_JS})().length >= 3", timeout=180_000)
                page.wait_for_timeout(500)
                facts = page.evaluate(FACTS_JS)
                screenshot(page, artifacts_dir() / "marimo-twins.png", full_page=True)
            finally:
                context.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    kinds = [f["kind"] for f in facts]
    assert kinds == ["jpm-devices", "jpm-mesh", "jpm-sharding"], (kinds, log.read_text(errors="replace")[-2000:])
    for f in facts:
        assert f["styled"] and f["chipRadius"] not in (None, "0px"), f  # the stylesheet reached the shadow root
    devices, mesh, sharding = facts
    assert "8 cpu devices" in devices["text"]
    assert len(devices["cardTops"]) == 8 and len(set(devices["cardTops"])) == 1, devices  # in one row
    assert len(set(mesh["cellTops"])) == 4 and len(set(mesh["cellLefts"])) == 2, mesh  # a 4 × 2 grid
    assert sharding["blocks"] == 4 and "P('data', None)" in sharding["text"], sharding
