"""JupyterLab end to end: a real server and kernel, each example notebook run in Chromium, and our
live widgets (drawn by their ES modules, not the static HTML) visible on the page.

One server for the module. It gets its own HOME and Jupyter/IPython folders (no old workspaces,
nothing written to the real home), the news toast and autosave are switched off, and it serves
temporary copies of the notebooks, so nothing is written back into examples/. Each notebook opens
in a workspace of its own (so Lab does not restore the previous one) and its kernel is shut down
after its test. The server is stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from chromium import artifacts_dir, browser, collect_errors, require_chromium, screenshot
from notebooks import example_notebooks, expected_views
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NOTEBOOKS = example_notebooks()
# JupyterLab renders a widget output as a Panel (no data-mime-type); static HTML outputs are
# `.jp-RenderedHTMLCommon[data-mime-type="text/html"]` and must not be what we see.
WIDGET_OUTPUT = ".jp-OutputArea-output.lm-Panel"
STATIC_OUTPUT = '.jp-OutputArea-output[data-mime-type="text/html"]'
SERVER_START_S = 90
RUN_ALL_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, proc: subprocess.Popen, url: str, token: str, log: Path) -> None:
        self.proc, self.url, self.token, self.log = proc, url, token, log

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def wait_until_serving(proc: subprocess.Popen, url: str, token: str, log: Path) -> None:
    """Poll /api/status; between polls, wait on the process itself (it must not exit)."""
    for _ in range(int(SERVER_START_S / 0.25)):
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            code = proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            continue
        pytest.fail(f"jupyter lab exited with {code}:\n{log.read_text(errors='replace')[-4000:]}")
    pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{log.read_text(errors='replace')[-4000:]}")


@contextlib.contextmanager
def jupyter_server(tmp_path: Path, app: str) -> Iterator[Lab]:
    """A Jupyter server (``app``: ``jupyterlab`` or ``notebook``, Notebook 7) of its own: a home and
    Jupyter/IPython folders in `tmp_path`, no news toast, no autosave, copies of the examples in its
    root; stopped with SIGTERM."""
    require_chromium()
    home, root = tmp_path / "home", tmp_path / "root"
    env = dict(os.environ)
    for name, sub in [("HOME", "home"), ("JUPYTER_CONFIG_DIR", "home/config"), ("JUPYTER_DATA_DIR", "home/data"),
                      ("JUPYTER_RUNTIME_DIR", "home/runtime"), ("IPYTHONDIR", "home/ipython")]:
        env[name] = str(tmp_path / sub)
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    env.pop("JUPYTER_PATH", None)
    overrides = {
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    }
    labconfig = home / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "default_setting_overrides.json").write_text(json.dumps(overrides))
    root.mkdir()
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, root / notebook.name)

    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / f"{app}.log"
    expose = "--LabApp.expose_app_in_browser=True" if app == "jupyterlab" else "--JupyterNotebookApp.expose_app_in_browser=True"
    command = [
        sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
        expose, "--ServerApp.port_retries=0",
    ]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url, token, log)
        yield Lab(proc, url, token, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return artifacts_dir()


def shut_down_kernels(lab: Lab) -> None:
    """Delete every session (and so its kernel), leaving the server to the next notebook."""
    api = f"{lab.url}/api/sessions"
    with urllib.request.urlopen(f"{api}?token={lab.token}", timeout=10) as reply:
        sessions = json.load(reply)
    for session in sessions:
        request = urllib.request.Request(f"{api}/{session['id']}?token={lab.token}", method="DELETE")
        urllib.request.urlopen(request, timeout=30).close()


# A view's root, not a picture another view draws inside itself (a tree view's layouts).
TOP_VIEW = ".jpm-view:not(.jpm-view .jpm-view)"


def live_view(page, kind: str, has_text: str | None = None):
    views = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-{kind}")
    return views.filter(has_text=has_text) if has_text else views


def shot_in_viewport(page, locator, path: Path) -> None:
    """The whole window, scrolled to `locator`: Lab 4 paints off-screen cells lazily
    (content-visibility), so wait until it is really in the viewport."""
    locator.scroll_into_view_if_needed()
    expect(locator).to_be_in_viewport(ratio=0.5)
    screenshot(page, path)


def shoot_view(page, view, path: Path) -> None:
    """A screenshot of one view; of a view taller than the window, its top part as the window
    shows it (an element screenshot of a box larger than Lab's scroll area comes out garbled)."""
    view.evaluate("el => el.scrollIntoView({block: 'start'})")
    expect(view).to_be_in_viewport()
    box = view.bounding_box()
    room = page.viewport_size["height"] - STATUS_BAR_PX - box["y"]
    if box["height"] <= room:
        screenshot(view, path)
    else:
        screenshot(page, path, clip={**box, "height": room})


def run_all_and_check(page, lab: Lab, notebook: Path, expected: list[tuple[int, str]], artifacts: Path) -> None:
    # A workspace of its own: Lab must not reopen the notebook an earlier test left open.
    page.goto(f"{lab.url}/lab/workspaces/{notebook.stem}/tree/{notebook.name}?token={lab.token}")
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(timeout=SERVER_START_S * 1000)

    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    # Done when every code cell has an execution count and the kernel is idle again. (Run All
    # goes on past a cell tagged raises-exception, as nbclient does.)
    page.wait_for_function(
        """name => {
            const panel = window.jupyterapp.shell.currentWidget;
            if (!panel || !panel.content || panel.context?.path !== name) return false;
            const cells = panel.content.widgets.filter(c => c.model.type === 'code');
            const done = cells.every(c => c.model.executionCount !== null);
            return done && panel.sessionContext.session?.kernel?.status === 'idle';
        }""",
        arg=notebook.name,
        timeout=RUN_ALL_S * 1000,
    )

    page.locator(f"{WIDGET_OUTPUT} {TOP_VIEW}").nth(len(expected) - 1).wait_for(state="attached", timeout=60_000)
    kinds = page.evaluate(
        """sel => [...document.querySelectorAll(sel)].map(
               el => [...el.classList].find(c => c.startsWith('jpm-') && c !== 'jpm-view'))""",
        f"{WIDGET_OUTPUT} {TOP_VIEW}",
    )
    kinds = ["jpm-sharding" if k == "jpm-tree" else k for k in kinds]  # a pytree's one view per name
    assert kinds == [f"jpm-{k}" for _, k in expected], f"live views {kinds}, expected {expected}"
    # Each view's static twin (the output before its widget) is hidden once the widget has drawn.
    shown_static = page.evaluate(
        "sel => [...document.querySelectorAll(sel)].filter(v => v.offsetParent !== null).length", f"{STATIC_OUTPUT} .jpm-view")
    assert shown_static == 0, f"{shown_static} static views still show beside their live widgets"
    widget_errors = page.locator(WIDGET_OUTPUT).filter(has_text="Error displaying widget").count()
    assert widget_errors == 0, "JupyterLab could not display some widgets"

    # Every view, one at a time in the viewport, is a visible box with text in it. (Off-screen
    # cells skip rendering (content-visibility): their innerText is empty and their size a
    # placeholder until they are painted, hence the waits.)
    views = page.locator(f"{WIDGET_OUTPUT} {TOP_VIEW}")
    for i, (cell, kind) in enumerate(expected):
        view = views.nth(i)
        view.scroll_into_view_if_needed()
        expect(view, f"cell {cell}: the {kind} view is not in the viewport").to_be_in_viewport()
        expect(view, f"cell {cell}: the {kind} view shows no text").to_have_text(re.compile(r"\S"))
        box = view.bounding_box()
        assert view.is_visible() and box, f"cell {cell}: the {kind} view is not visible"
        assert box["width"] >= MIN_VIEW[0] and box["height"] >= MIN_VIEW[1], f"cell {cell}: the {kind} view is too small: {box}"
    for kind in dict.fromkeys(k for _, k in expected):
        shoot_view(page, live_view(page, kind).first, artifacts / f"jupyterlab-{notebook.stem}-{kind}.png")

    CHECKS[notebook.name](page, artifacts / f"jupyterlab-{notebook.stem}")


def check_pmap_chapter(page, shots: Path) -> None:
    devices_text = live_view(page, "devices").first.text_content()
    assert "8" in devices_text and "cpu" in devices_text.lower(), devices_text
    ring = live_view(page, "results", "collective-permute")
    # The ppermute cell; the exercise ships unsolved, so its view lists no permute and its check says so.
    assert ring.count() == 1, "the ppermute cell's view does not list its collective-permute"
    assert output_with(page, "✗ not yet:").count() == 1, "the unsolved exercise's check does not say 'not yet'"
    shot_in_viewport(page, ring.first, shots.with_name(shots.name + ".png"))


def check_sharding_chapter(page, shots: Path) -> None:
    meshes = live_view(page, "mesh").all_text_contents()
    names = ["mesh", "grid", "pod"]  # %mesh data=8, ... --name grid, --abstract --name pod
    assert len(meshes) == len(names) and all(n in t for n, t in zip(names, meshes, strict=True)), meshes
    assert "abstract" in meshes[-1].lower() and "4096" in meshes[-1], meshes[-1]
    # The 4 x 2 cell: the batch split one way, the weights the other, the product both ways.
    cell = page.locator(".jp-CodeCell").filter(
        has=page.locator(".jp-InputArea", has_text="%%shard --mesh grid --in x=data,None w=None,model"))
    two_d = cell.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-sharding")
    texts = two_d.all_text_contents()
    assert len(texts) == 3, f"the 4 x 2 %%shard cell shows {len(texts)} views"
    for text, (name, spec) in zip(texts, [("x", "P('data', None)"), ("w", "P(None, 'model')"), ("y", "P('data', 'model')")],
                                  strict=True):
        assert text.startswith(name) and spec in text, f"expected {name} with {spec}: {text[:200]}"
    reports = live_view(page, "results", "all-reduce")
    # column_totals, the product with out_sharding=P(), and the Auto-axes a @ a.T each list an all-reduce.
    assert reports.count() == 3, "the three --report views with an all-reduce should each list it"
    for i in range(reports.count()):
        assert "compile" in reports.nth(i).text_content(), reports.nth(i).text_content()
    # The Explicit-axes cell (tagged raises-exception) explains itself, and Run All went past it.
    # (The mesh and sharding views name their axis types too: match the explanation's own words.)
    explained = page.locator(".jp-OutputArea-output").filter(has_text="every operation must say how its result is sharded")
    assert explained.count() == 1, "the Explicit-axes cell does not show its explanation"
    # The two big ones: a 16 x 16 x 16 abstract mesh and a 4,096-block layout.
    for name, view in [("pod", live_view(page, "mesh", "pod").first), ("big", live_view(page, "sharding", "4096").first)]:
        shoot_view(page, view, shots.with_name(f"{shots.name}-{name}.png"))
    shot_in_viewport(page, two_d.first, shots.with_name(shots.name + ".png"))
    shot_in_viewport(page, reports.first, shots.with_name(shots.name + "-report.png"))
    shot_in_viewport(page, explained.first, shots.with_name(shots.name + "-explicit.png"))
    # The explorer, live: the first layout and the four moves made in code, the last one current and fitting.
    explorer = live_view(page, "explorer")
    assert explorer.count() == 1
    expect(explorer.locator(".jpm-ex-tried tbody tr")).to_have_count(5)
    assert explorer.locator(".jpm-ex-fit").text_content().startswith("fits:")
    assert explorer.locator(".jpm-ex-spec").all_text_contents() == ["P(('data', 'model'), None)", "P(None, ('data', 'model'))"]
    # Its exercise ships unsolved, like the first: both checks say "not yet".
    assert output_with(page, "✗ not yet:").count() == 2
    shoot_view(page, explorer.first, shots.with_name(shots.name + "-explorer.png"))


def output_with(page, text: str):
    """Cell outputs (any kind: stream, error, rich) whose text contains `text`."""
    return page.locator(".jp-OutputArea-output").filter(has_text=text)


def check_shard_map_chapter(page, shots: Path) -> None:
    # The block product: every device's 2 x 4 block, labelled with its slice of the global c.
    product = live_view(page, "results", "c[2:4, 0:4]")
    assert product.count() == 1, "the block-product view does not label the blocks with their slices"
    tiles = product.first.locator(".jpm-tile-slice").all_text_contents()
    assert tiles[:4] == ["c[0:2, 0:4]", "c[0:2, 0:4]", "c[2:4, 0:4]", "c[2:4, 0:4]"], tiles
    # Its values came after the cell (views/later.py): the hidden static twin, what a saved notebook keeps, was
    # rewritten with them by its display id, and no twin still waits.
    expect(page.locator(".jpm-static").filter(has_text="c[2:4, 0:4]")).to_have_count(1)
    expect(page.locator(".jpm-static").filter(has_text="waiting for the devices")).to_have_count(0)
    assert "all-reduce" in product.first.text_content()
    # Rank-reducing %%pmap beside rank-preserving %%shard_map on the same rows.
    assert "float32[4]" in live_view(page, "results", "centred").first.text_content()
    assert "float32[1, 4]" in live_view(page, "results", "centred_blocks").first.text_content()
    # The two cells tagged to fail explain themselves, and Run All went on past them.
    forgot_psum = output_with(page, "can differ between devices along mesh axis 'y'")
    no_out = output_with(page, "--out row_sums=x")
    assert forgot_psum.count() == 1 and no_out.count() == 1, "the varying-values errors are not shown"
    cards = live_view(page, "collectives")
    assert cards.count() == 1, "the all_gather/psum_scatter cell shows no collective cards"
    ops = cards.first.locator(".jpm-ccard").evaluate_all("els => els.map(e => e.dataset.op)")
    assert ops == ["all_gather", "psum_scatter"], ops
    code = output_with(page, "jax.shard_map(")
    assert code.count() == 1, "the --as-code cell printed no jax.shard_map call"
    shot_in_viewport(page, product.first, shots.with_name(shots.name + ".png"))
    shot_in_viewport(page, forgot_psum.first, shots.with_name(shots.name + "-varying.png"))
    shoot_view(page, cards.first, shots.with_name(shots.name + "-cards.png"))
    shot_in_viewport(page, code.first, shots.with_name(shots.name + "-as-code.png"))


RING_STEPS_8 = 14  # a ring all-reduce over 8 devices: 7 reduce-scatter steps, then 7 all-gather steps


def check_collectives_chapter(page, shots: Path) -> None:
    views = live_view(page, "collectives")
    ops = set(views.locator(".jpm-ccard").evaluate_all("els => els.map(e => e.dataset.op)"))
    wanted = {"psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute", "pshuffle",
              "axis_index"}
    assert wanted <= ops, f"no card for {wanted - ops}"

    # Click through the psum card's ring, one step at a time, until `next` is disabled.
    card = views.first.locator('.jpm-ccard[data-op="psum"]')
    expect(card).to_have_count(1)
    label, step_next = card.locator(".jpm-step-label"), card.locator('button[data-action="next"]')
    card.scroll_into_view_if_needed()
    expect(label).to_have_text("whole movement")
    expect(card.locator("div[data-step]")).to_have_attribute("data-step", "0")
    screenshot(card, shots.with_name(f"{shots.name}-psum-step-0.png"))
    labels = [label.text_content()]
    while step_next.get_attribute("aria-disabled") != "true":
        assert len(labels) <= RING_STEPS_8, f"the step control did not stop: {labels}"
        step_next.click()
        expect(label).not_to_have_text(labels[-1])  # each click shows another step
        labels.append(label.text_content())
        step = len(labels) - 1
        expect(card.locator("div[data-step]")).to_have_attribute("data-step", str(step))
        assert labels[-1].startswith(f"step {step} of {RING_STEPS_8}: "), labels[-1]
        if step in (RING_STEPS_8 // 2, RING_STEPS_8):
            screenshot(card, shots.with_name(f"{shots.name}-psum-step-{step}.png"))
    assert len(labels) == RING_STEPS_8 + 1, labels
    phases = [text.split(": ", 1)[1] for text in labels[1:]]
    half = RING_STEPS_8 // 2
    assert all(p.startswith("reduce-scatter") for p in phases[:half]), phases
    assert all(p.startswith("all-gather") for p in phases[half:]), phases

    # The loop's card: ran 3 times, with its first and last iteration a click apart.
    loop = views.locator('.jpm-ccard[data-op="ppermute"]').filter(has_text="ran 3×")
    expect(loop).to_have_count(1)
    last = loop.locator('button[data-iteration="last"]')
    last.scroll_into_view_if_needed()
    last.click()
    expect(last).to_have_attribute("aria-pressed", "true")
    expect(loop.locator("div[data-iteration]")).to_have_attribute("data-iteration", "last")  # the drawing
    screenshot(loop, shots.with_name(f"{shots.name}-loop.png"))
    # Function mode: the first call shows the cards. The exercise's card (over col) comes after its
    # check, beside the section "Several axes": two views over the row × col mesh.
    assert live_view(page, "collectives", "share_of_total()").count() == 1
    assert live_view(page, "collectives", "(row, col)").count() == 2
    assert output_with(page, "✗ not yet:").count() == 1, "the unsolved exercise's check does not say 'not yet'"
    shoot_view(page, views.first, shots.with_name(shots.name + ".png"))
    # --profile: one lane per device, devices waiting at the psum, and a step selector that redraws.
    profile = live_view(page, "profile")
    expect(profile).to_have_count(1)
    expect(profile.locator(".jpm-pf-track")).to_have_count(8)
    assert profile.locator(".jpm-pf-bar.jpm-pf-wait").count() >= 5
    profile.locator("select.jpm-pf-step").select_option("1")
    expect(profile.locator(".jpm-pf-axis")).to_contain_text("step 2 of 2")
    shoot_view(page, profile, shots.with_name(shots.name + "-profile.png"))


def check_planning_chapter(page, shots: Path) -> None:
    devices_text = live_view(page, "devices").first.text_content()
    assert "256" in devices_text, devices_text[:200]
    plans = live_view(page, "plan")
    verdicts = plans.locator(".jpm-fit").all_text_contents()
    # Four plans with a verdict (data parallel, FSDP, tensor parallel, the chained update), then the
    # --compare view; the repeated gradient plan runs with --no-show.
    assert len(verdicts) == 4 and verdicts[0].startswith("does not fit"), verdicts
    assert all(v.startswith("fits:") for v in verdicts[1:]), verdicts
    expect(plans.first.locator(".jpm-fit.jpm-bad")).to_be_visible()
    fsdp = plans.nth(1)
    assert fsdp.locator("td.jpm-op").all_text_contents().count("all-gather") == 6
    assert "tpu-v5e" in fsdp.text_content()
    assert "Collectives the compiler inserted (0)" in plans.nth(3).text_content()  # the chained update
    compared = page.locator(f"{WIDGET_OUTPUT} .jpm-view.jpm-plan[data-kind='compare']")
    labels = ("data parallel", "FSDP", "tensor parallel")
    assert compared.count() == 1 and all(label in compared.first.text_content() for label in labels)
    assert live_view(page, "sharding", "8 distinct blocks on 256 devices").count() == 1
    shoot_view(page, plans.first, shots.with_name(shots.name + "-data-parallel.png"))
    shoot_view(page, fsdp, shots.with_name(shots.name + "-fsdp.png"))
    shoot_view(page, compared.first, shots.with_name(shots.name + "-compare.png"))
    shoot_view(page, live_view(page, "mesh", "tp").first, shots.with_name(shots.name + "-mesh.png"))
    # The explorer after the moves made in code: four layouts tried, the 64 x 4 mesh current.
    explorer = live_view(page, "explorer")
    assert explorer.count() == 1
    expect(explorer.locator(".jpm-ex-tried tbody tr")).to_have_count(4)
    assert explorer.locator(".jpm-ex-mesh").text_content() == "data=64,model=4"
    shoot_view(page, explorer.first, shots.with_name(shots.name + "-explorer.png"))


def check_cluster_chapter(page, shots: Path) -> None:
    devices_text = live_view(page, "devices").first.text_content()
    assert "process 0" in devices_text and "process 1" in devices_text and "2048" in devices_text, devices_text[:300]
    labelled = output_with(page, "[process 1] I am process 1 of 2")
    assert labelled.count() == 1, "the %%cluster cell's output is not labelled by process"
    total = live_view(page, "results", "same on all 8 devices")
    assert total.count() >= 1 and "52." in total.first.text_content()
    ring = live_view(page, "collectives")
    assert ring.count() == 1 and "ppermute" in ring.first.text_content()
    assert output_with(page, "array([52., 52.").count() == 1, "gather did not bring the psum into the kernel"
    held = live_view(page, "sharding", "process 1: devices 2048")
    assert held.count() >= 1, "the sharding views do not say which process holds each block"
    shoot_view(page, live_view(page, "devices").first, shots.with_name(shots.name + "-devices.png"))
    shoot_view(page, ring.first, shots.with_name(shots.name + "-ring.png"))
    shot_in_viewport(page, held.first, shots.with_name(shots.name + ".png"))


def check_index(page, shots: Path) -> None:
    devices = live_view(page, "devices")
    assert devices.count() == 1 and "8 cpu devices" in devices.first.text_content(), "the setup check shows no devices"
    shoot_view(page, devices.first, shots.with_name(shots.name + ".png"))


def check_training_chapter(page, shots: Path) -> None:
    reports = live_view(page, "results", "program")
    assert reports.count() == 6, f"the training chapter shows {reports.count()} --report views, not 6"
    # The exercise ships unsolved: its report lists no reduce-scatter, and its check says "not yet".
    assert live_view(page, "results", "reduce-scatter").count() == 0
    scatter = output_with(page, "✗ not yet:")
    assert scatter.count() == 1, "the unsolved exercise's check does not say 'not yet'"
    assert live_view(page, "results", "collective-permute").count() == 1, "the pipeline's report lists no permutes"
    shot_in_viewport(page, scatter.first, shots.with_name(shots.name + ".png"))


def check_ecosystem_chapter(page, shots: Path) -> None:
    trees = live_view(page, "tree")
    assert trees.count() == 2, f"the ecosystem chapter shows {trees.count()} live tree views, not 2 (grads, the split model)"
    split = live_view(page, "tree", "P(None, 'model')")
    assert split.count() == 1, "the split model's tree view does not show its kernel's spec"
    assert live_view(page, "plan").count() == 1, "the chapter's --plan view is not drawn"
    shot_in_viewport(page, split.first, shots.with_name(shots.name + ".png"))


def plans_and_unsolved_checks(chapter: str, plans_shown: str):
    """A topic chapter's check: its two live plan views (`plans_shown` says which), and its two
    exercises shipped unsolved, each check saying "not yet" in one line."""
    def check(page, shots: Path) -> None:
        plans = live_view(page, "plan")
        assert plans.count() == 2, f"the {chapter} chapter shows {plans.count()} live plan views, not 2 ({plans_shown})"
        unsolved = output_with(page, "✗ not yet:")
        assert unsolved.count() == 2, f"{unsolved.count()} of the {chapter} chapter's 2 unsolved checks say 'not yet'"
        shot_in_viewport(page, plans.last, shots.with_name(shots.name + ".png"))
    return check


def check_capstone(page, shots: Path) -> None:
    """The capstone: the --compare table and the chosen layout's plan live; its three exercises,
    shipped unsolved, each say "not yet" in one line."""
    plans = live_view(page, "plan")
    assert plans.count() >= 1, "the capstone shows no live plan view"
    unsolved = output_with(page, "✗ not yet:")
    assert unsolved.count() == 3, f"{unsolved.count()} of the capstone's 3 unsolved checks say 'not yet'"
    shot_in_viewport(page, plans.last, shots.with_name(shots.name + ".png"))


CHECKS: dict[str, Callable] = {
    "capstone.ipynb": check_capstone,
    "ecosystem_chapter.ipynb": check_ecosystem_chapter,
    "training_chapter.ipynb": check_training_chapter,
    "index.ipynb": check_index,
    "pmap_chapter.ipynb": check_pmap_chapter,
    "sharding_chapter.ipynb": check_sharding_chapter,
    "shard_map_chapter.ipynb": check_shard_map_chapter,
    "collectives_chapter.ipynb": check_collectives_chapter,
    "planning_chapter.ipynb": check_planning_chapter,
    "cluster_chapter.ipynb": check_cluster_chapter,
    "memory_chapter.ipynb": plans_and_unsolved_checks("memory", "the step, ZeRO-3 on v5p"),
    "model_parallel_chapter.ipynb": plans_and_unsolved_checks("model-parallel", "overlap, crossover"),
}
MIN_VIEW = (150, 40)  # px; every live view at least this wide and tall
STATUS_BAR_PX = 40


def test_checks_cover_every_example():
    assert sorted(CHECKS) == sorted(p.name for p in NOTEBOOKS), "add a check_<notebook> for each example"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_jupyterlab_and_shows_live_views(notebook: Path, lab: Lab, artifacts: Path):
    expected = expected_views(nbformat.read(notebook, as_version=4))
    refused: list[str] = []
    errors: list[str] = []
    with browser() as b:
        context = b.new_context(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)

        def only_local(route):
            if route.request.url.startswith(lab.url + "/"):
                route.continue_()
            else:
                refused.append(route.request.url)
                route.abort()

        context.route("**/*", only_local)
        page = context.new_page()
        collect_errors(page, errors)
        try:
            run_all_and_check(page, lab, notebook, expected, artifacts)
        except BaseException as failure:
            shot = f"jupyterlab-{notebook.stem}-failure.png"
            page.screenshot(path=str(artifacts / shot))
            failure.add_note(f"screenshot: test-artifacts/{shot}\nserver log:\n{lab.log_tail()}")
            raise
        finally:
            context.close()
            with contextlib.suppress(OSError):  # best effort: a dead server is reported below
                shut_down_kernels(lab)

    assert not errors, errors
    assert not refused, f"JupyterLab tried to reach the network: {refused}"
    assert lab.proc.poll() is None, lab.log_tail()
