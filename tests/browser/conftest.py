"""Browser fixtures: one Debian Chromium per session, driven by Playwright (PyPI), and a page
on a made-up origin (``http://jpm.test/``) that serves the harness, the installed ``js/``
files, and each view's bundled ES module exactly as the widget class ships it.

Never run ``playwright install`` here: it downloads a browser. We launch /usr/bin/chromium.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import screenshot
from sample_states import sharding_state

from jaxpar_magic.views.base import assets

ORIGIN = "http://jpm.test"
HARNESS = Path(__file__).with_name("harness.html")


def _view_classes() -> dict[str, Any]:
    from jaxpar_magic.views import (CollectivesView, DevicesView, MemoryView, MeshView, PlanView, ProfileView, ResultView,
                                    ShardingView, TreeView)
    from jaxpar_magic.views.explorer import ExplorerView

    return {"devices": DevicesView, "results": ResultView, "mesh": MeshView, "sharding": ShardingView,
            "collectives": CollectivesView, "plan": PlanView, "tree": TreeView, "memory": MemoryView,
            "explorer": ExplorerView, "profile": ProfileView}


@pytest.fixture(scope="session")
def jpm_browser() -> Iterator[Any]:
    from chromium import shared_browser

    yield shared_browser()  # one Chromium for every browser test of the run; tests/conftest.py stops it


@pytest.fixture(scope="session")
def artifacts(pytestconfig: pytest.Config) -> Path:
    out = pytestconfig.rootpath / "test-artifacts"
    out.mkdir(exist_ok=True)
    return out


def _serve(route: Any) -> None:
    from urllib.parse import urlparse

    path = urlparse(route.request.url).path
    body: bytes | None = None
    ctype = "text/plain"
    if path == "/harness.html":
        body, ctype = HARNESS.read_bytes(), "text/html"
    elif path.startswith("/js/"):
        name = path[len("/js/") :]
        asset = assets().joinpath(name)
        if "/" not in name and asset.is_file():
            body = asset.read_bytes()
            ctype = mimetypes.guess_type(name)[0] or "text/plain"
            if name.endswith(".js"):
                ctype = "text/javascript"
    elif path.startswith("/bundle/") and path.endswith(".js"):
        cls = _view_classes().get(path[len("/bundle/") : -len(".js")])
        if cls is not None:
            body, ctype = cls._bundle.encode("utf-8"), "text/javascript"
    elif path == "/esm/loader.js":  # what every view model ships as `_esm`
        body, ctype = _view_classes()["results"]._esm.encode("utf-8"), "text/javascript"
    elif path == "/library.json":  # the ViewLibrary's synced traits, every view added
        import json

        from jaxpar_magic.views.base import ViewLibrary

        lib = ViewLibrary(css=assets().joinpath("views.css").read_text(encoding="utf-8"))
        for cls in _view_classes().values():
            lib.add(cls._bundle)
        body, ctype = json.dumps({"css": lib.css, "code": lib.code, "needs": lib.needs}).encode("utf-8"), "application/json"
        lib.close()
    if body is None:
        route.fulfill(status=404, body="not found")
    else:
        route.fulfill(status=200, body=body, headers={"content-type": f"{ctype}; charset=utf-8"})


class ViewPage:
    """A harness page plus helpers to mount views and take screenshots."""

    def __init__(self, page: Any, artifacts: Path) -> None:
        self.page = page
        self.artifacts = artifacts

    def mount(self, view: str, state: dict[str, Any], *, mode: str = "bundle", theme: str = "light",
              lib: str | None = None, twin: str | None = None, attach: str = "before", area: bool = False) -> Any:
        options = {"mode": mode, "theme": theme, "lib": lib, "twin": twin, "attach": attach, "area": area}
        index = self.page.evaluate("([v, s, o]) => window.jpm.mount(v, s, o)", [view, state, options])
        return self.page.locator(f'.jpm-host[data-index="{index}"]')

    def set_state(self, host: Any, state: dict[str, Any]) -> None:
        index = int(host.get_attribute("data-index"))
        self.page.evaluate("([i, s]) => window.jpm.mounted[i].model.set('state', s)", [index, state])

    def shot(self, host: Any, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        screenshot(host, path)
        return path


class _HarnessTab:
    """One context and page per test process, reused by every browser test: each test opens the harness
    afresh (a new document: no view, listener or style of the last test survives), in the default
    window size (VIEWPORT) and the light colour scheme, whatever the last test set. A new context and page per test cost ~0.2-0.6 s each."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
        self.errors: list[str] = []
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("console", lambda msg: self.errors.append(f"console.{msg.type}: {msg.text}")
                     if msg.type == "error" else None)
        # Everything on the made-up origin is served from here; nothing else is reachable.
        self.context.route("**/*", lambda route: _serve(route) if route.request.url.startswith(ORIGIN + "/")
                           else route.abort())

    def fresh(self) -> Any:
        self.page.set_viewport_size(VIEWPORT)
        self.page.emulate_media(color_scheme="light")
        self.page.goto(f"{ORIGIN}/harness.html")
        self.page.wait_for_function("window.jpmReady === true")
        self.errors.clear()  # what the last test's document said as it was left
        return self.page


VIEWPORT = {"width": 1000, "height": 900}
_tabs: list[_HarnessTab] = []


@pytest.fixture
def view_page(jpm_browser: Any, artifacts: Path) -> Iterator[ViewPage]:
    if not _tabs or _tabs[0].page.is_closed():
        _tabs[:] = [_HarnessTab(jpm_browser)]
    tab = _tabs[0]
    page = tab.fresh()
    yield ViewPage(page, artifacts)
    page.goto("about:blank")  # the test's errors are all in: leaving its document says nothing more
    assert not tab.errors, tab.errors


# ---------------------------------------------------------------------------------------------
# Sample states, shaped exactly like the engines' output.

HOSTILE = "<img src=x onerror=window.__xss=1>"


def devices_state(n: int = 8, *, processes: int = 1, platform: str = "cpu", kind: str = "cpu") -> dict[str, Any]:
    listed = min(n, 64)
    per = n // processes
    devices = [
        {
            "id": i,
            "platform": platform,
            "kind": kind,
            "process": i // per,
            "coords": None if platform == "cpu" else [i % 2, (i // 2) % 2, i // 4],
            "core": None if platform == "cpu" else i % 2,
            "mem_used": None if platform == "cpu" else (i % 16 + 1) * 900_000_000,
            "mem_limit": None if platform == "cpu" else 16 * 2**30,
        }
        for i in range(listed)
    ]
    counts = {"cpu": 0, "gpu": 0, "tpu": 0}
    counts[platform] = n
    return {
        "devices": devices,
        "total": n,
        "omitted": n - listed,
        "counts": counts,
        "processes": [{"process": p, "count": per} for p in range(processes)],
        "simulated": platform == "cpu",
        "backend": platform,
    }


def mesh_state(sizes: list[int], names: list[str] | None = None, *, abstract: bool = False) -> dict[str, Any]:
    names = names or ["data", "model", "seq", "x", "y"][: len(sizes)]
    n = 1
    for s in sizes:
        n *= s
    return {
        "name": "mesh",
        "axes": [{"name": a, "size": s} for a, s in zip(names, sizes)],
        "device_ids": list(range(n)),
        "axis_types": ["Auto"] * len(sizes),
        "abstract": abstract,
        "kinds": ["cpu"],
    }


def result_state(n: int = 8) -> dict[str, Any]:
    ids = list(range(n))
    shown = ids[:16]
    return {
        "title": f"%%pmap over {n} devices",
        "axes": [{"name": "i", "size": n}],
        "device_ids": ids,
        "outputs": [
            {
                "name": "y",
                "shape": [5],
                "dtype": "float32",
                "same_on_all": False,
                "tiles": [
                    {"devices": [i], "coords": [i], "text": "[" + " ".join(f"{i * 5 + k}." for k in range(5)) + "]"}
                    for i in shown
                ],
                "omitted": n - len(shown),
                "same_text": None,
            },
            {
                "name": "total",
                "shape": [],
                "dtype": "float32",
                "same_on_all": True,
                "tiles": [{"devices": ids[:64], "coords": None, "text": "780."}],
                "omitted": 0,
                "same_text": f"same on all {n} devices",
            },
        ],
        "collectives": [
            {
                "op": "all-reduce",
                "shape": "f32[]",
                "bytes": 4,
                "groups": [ids],
                "groups_text": f"1 group of {n}",
                "pairs": [],
                "pairs_omitted": 0,
                "source_line": "total = lax.psum(x.sum(), 'i')",
            },
            {
                "op": "collective-permute",
                "shape": "f32[5]",
                "bytes": 20,
                "groups": [],
                "groups_text": f"{n} pairs",
                "pairs": [[i, (i + 1) % n] for i in ids][:256],
                "pairs_omitted": max(0, n - 256),
                "source_line": "y = lax.ppermute(x, 'i', perm)",
            },
            {
                "op": "all-gather",
                "shape": "f32[2,5]",
                "bytes": 40,
                "groups": [ids[k : k + 2] for k in range(0, n, 2)][:64],
                "groups_text": f"{n // 2} groups of 2",
                "pairs": [],
                "pairs_omitted": 0,
                "source_line": None,
            },
        ],
        "report": {"compile_ms": 12.3, "run_ms": 0.402, "flops": 1234.0, "bytes_accessed": 5678.0},
    }


@pytest.fixture
def samples() -> Any:
    """The sample-state builders above, for the tests (fixtures, not imports of conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        HOSTILE=HOSTILE,
        devices=devices_state,
        mesh=mesh_state,
        result=result_state,
        sharding=sharding_state,
        basic=lambda view: {
            "devices": devices_state(8),
            "results": result_state(8),
            "mesh": mesh_state([2, 4]),
            "sharding": sharding_state([4000, 10000], [("data", 8)], ["data", None]),
        }[view],
    )
