"""Processes in the existing views (several ipyparallel engines, jpm_schemas.md section 3), without
a browser: the devices view names each process's host and pid, the results view labels tiles with
their process, the sharding view says which process holds each block. All three keys are optional:
a state without them (or with one process) renders exactly as before.

In Chromium: tests/browser/test_views_new_js.py (test_processes_*).
"""

from __future__ import annotations

import html
from typing import Any

import pytest

from jaxpar_magic.views import devices, results, sharding
from sample_states import sharding_state
from test_views_static import devices_state, result_state

HOSTILE = "<img src=x onerror=window.__xss=1>\"'&"


def body(page: str) -> str:
    return page.split("</style>", 1)[-1]


def hosts(n: int) -> dict[str, Any]:
    return {str(p): {"host": f"node-{p}", "pid": 1000 + p} for p in range(n)}


# --- devices --------------------------------------------------------------------------------


def test_devices_grouped_by_process_with_host_and_pid() -> None:
    state = {**devices_state(8, processes=2), "hosts": hosts(2)}
    page = body(devices.to_html(state))
    assert '<div class="jpm-h">process 0 · 4 devices<span class="jpm-mono"> · host node-0 · pid 1000</span></div>' in page
    assert '<div class="jpm-h">process 1 · 4 devices<span class="jpm-mono"> · host node-1 · pid 1001</span></div>' in page
    assert 'title="device 5 · cpu · process 1 · host node-1 · pid 1001"' in page
    lines = devices.to_text(state).splitlines()
    assert "process 1 (4 devices) · host node-1 · pid 1001" in lines
    # Keys may be ints (a Python state before JSON) as well as strings (after).
    as_ints = {**state, "hosts": {p: v for p, v in enumerate(hosts(2).values())}}
    assert devices.to_text(as_ints) == devices.to_text(state)


def test_devices_one_process_names_its_host() -> None:
    state = {**devices_state(8), "hosts": {"0": {"host": "laptop", "pid": 42}}}
    assert devices.to_text(state).splitlines()[0] == "Devices: 8 cpu devices · backend cpu · host laptop · pid 42 [simulated]"
    partial = {**devices_state(8, processes=2), "hosts": {"1": {"host": "node-1", "pid": None}}}
    text = devices.to_text(partial)
    assert "process 0 (4 devices)\n" in text and "process 1 (4 devices) · host node-1\n" in text


def test_devices_host_is_escaped() -> None:
    state = {**devices_state(8, processes=2), "hosts": {"0": {"host": HOSTILE, "pid": 1}}}
    page = devices.to_html(state)
    assert "<img" not in page and html.escape(HOSTILE) in page
    assert HOSTILE in devices.to_text(state)


# --- results --------------------------------------------------------------------------------


def test_results_tiles_say_their_process() -> None:
    state = {**result_state(8), "device_process": [0, 0, 0, 0, 1, 1, 1, 1]}
    page = body(results.to_html(state))
    assert page.count('<span class="jpm-proc">p1</span>') == 4 and page.count('<span class="jpm-proc">p0</span>') == 4
    assert 'title="device 6 (process 1)"' in page  # the same-on-all strip
    text = results.to_text(state)
    assert "  dev 5 (i=5) p1: [5. 6. 7.]" in text and "  dev 0 (i=0) p0: [0. 1. 2.]" in text


def test_results_tile_of_several_devices_across_processes() -> None:
    state = result_state(8)
    state["outputs"][0]["tiles"] = [{"devices": [3, 4], "coords": None, "text": "7."}]
    state["device_process"] = [0, 0, 0, 0, 1, 1, 1, 1]
    assert '<span class="jpm-proc">p0,1</span>' in results.to_html(state)
    assert "  dev 3,4 p0,1: 7." in results.to_text(state)


# --- sharding -------------------------------------------------------------------------------


def test_sharding_says_which_process_holds_each_block() -> None:
    state = sharding_state([8, 8], [("a", 2), ("b", 2)], ["a", "b"], name="w")
    state["device_process"] = {"0": 0, "1": 0, "2": 1, "3": 1}
    page = body(sharding.to_html(state))
    assert '<div class="jpm-note jpm-procs">process 0: devices 0,1 · holds 2 blocks</div>' in page
    assert '<div class="jpm-note jpm-procs">process 1: devices 2,3 · holds 2 blocks</div>' in page
    assert 'title="block (1, 0) · index [4:8, 0:4] · shard float32[4, 4] · device 2 · process 1"' in page
    lines = sharding.to_text(state).splitlines()
    assert "  process 1: devices 2,3 · holds 2 blocks" in lines
    assert "  block (0, 1) [0:4, 4:8] float32[4, 4] → device 1 · process 0" in lines


def test_sharding_block_replicated_across_processes() -> None:
    state = sharding_state([8, 8], [("a", 2), ("b", 2)], ["a", None], name="r")  # replicated over b
    state["device_process"] = {"0": 0, "1": 1, "2": 0, "3": 1}
    page = body(sharding.to_html(state))
    assert "devices 0,1 (2, replicated) · processes 0,1" in page
    assert "process 0: devices 0,2 · holds 2 blocks" in page  # each process has a copy of both rows
    assert "→ devices 2,3 (2, replicated) · processes 0,1" in sharding.to_text(state)


# --- old states render exactly as before -----------------------------------------------------


@pytest.mark.parametrize(
    "render,state,key,value",
    [
        (devices, devices_state(8, processes=2), "hosts", None),
        (devices, devices_state(8, processes=2), "hosts", {}),
        (results, result_state(8), "device_process", None),
        (results, result_state(8), "device_process", [0] * 8),
        (sharding, sharding_state([8, 8], [("a", 2), ("b", 2)], ["a", "b"]), "device_process", None),
        (sharding, sharding_state([8, 8], [("a", 2), ("b", 2)], ["a", "b"]), "device_process", {str(i): 3 for i in range(4)}),
    ],
)
def test_one_process_or_no_key_changes_nothing(render: Any, state: dict[str, Any], key: str, value: Any) -> None:
    with_key = {**state, key: value}
    assert render.to_html(with_key) == render.to_html(state)
    assert render.to_text(with_key) == render.to_text(state)
    assert "jpm-proc" not in body(render.to_html(state))
