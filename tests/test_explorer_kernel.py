"""The explorer view in a real kernel: a choice sent as the page sends it (`model.send`, a comm message
on the shell channel) is planned on the explorer's worker thread, and the new state reaches the front
end as the widget's update on IOPub, with no traceback."""
from __future__ import annotations

import html
import json
import os
import queue
import tempfile
import time

import pytest

pytestmark = pytest.mark.slow

SETUP = """\
%load_ext jaxpar_magic
%devices --simulate 8
import jax, jax.numpy as jnp
%mesh data=4 model=2 --axis-types auto --no-show
x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
w = jax.ShapeDtypeStruct((128, 256), jnp.float32)
"""
CELL = "%%shard --plan --explore --in x=data,None\ny = x @ w\n"
WAIT_S = 240  # a deadline for a loaded machine, not a timing


def _states(kc, until, updates: list) -> list[dict]:
    """The explorer states the kernel sent on IOPub (comm updates), until `until(states, updates)` or the
    deadline; `updates` gets the update_display_data messages (the static twin kept current)."""
    states, deadline = [], time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not until(states, updates):
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        assert msg["msg_type"] != "error", msg["content"]
        if msg["msg_type"] == "comm_msg" and "state" in msg["content"]["data"].get("state", {}):
            states.append(json.loads(msg["content"]["data"]["state"]["state"]))
        if msg["msg_type"] == "update_display_data":
            updates.append(msg["content"])
    return states


def test_a_choice_from_the_page_updates_the_view_from_the_worker_thread():
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    with tempfile.TemporaryDirectory(prefix="jpm-explorer-") as cwd:
        km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
        km.start_kernel(cwd=cwd, env={**env, "JAX_PLATFORMS": "cpu"})
        try:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            assert kc.execute_interactive(SETUP, timeout=WAIT_S)["content"]["status"] == "ok"
            shown = []
            reply = kc.execute_interactive(CELL, timeout=WAIT_S, output_hook=shown.append)
            assert reply["content"]["status"] == "ok"
            models = [m["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for m in shown
                      if "application/vnd.jupyter.widget-view+json" in m["content"].get("data", {})]
            assert len(models) == 1
            choice = {"kind": "choose", "name": "w", "spec": [[], ["model"]]}
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": models[0],
                                                              "data": {"method": "custom", "content": choice}}))
            updates: list = []
            states = _states(kc, lambda seen, twins: any(s["generation"] == 2 for s in seen) and twins, updates)
            assert [s["generation"] for s in states][-1] == 2
            final = states[-1]
            assert final["status"]["busy"] is False and final["message"] is None
            assert final["inputs"][1] == {"name": "w", "group": "w", "shape": [128, 256], "dtype": "float32",
                                          "spec": [[], ["model"]], "paths": ["w"], "count": 1}
            assert [r["current"] for r in final["tried"]].count(True) == 1 and len(final["tried"]) == 2
            # The static twin (shown before the widget, with a display id) is the record: updated from the
            # worker thread, it now lists both tried layouts, so a saved or exported notebook shows them.
            (twin,) = [m["content"] for m in shown if "text/html" in m["content"].get("data", {})]
            twin_id = twin["transient"]["display_id"]
            assert all(u["transient"]["display_id"] == twin_id for u in updates)
            record = updates[-1]["data"]
            for row in final["tried"]:
                assert row["line"] in record["text/plain"].splitlines()
                assert html.escape(row["line"]) in record["text/html"]
            assert "Tried layouts (2)" in record["text/html"] and "planning" not in record["text/plain"]
            check = kc.execute_interactive("assert _explorer.generation == 2 and _explorer.plan.axes['model'] == 2",
                                           timeout=WAIT_S)
            assert check["content"]["status"] == "ok"
            kc.stop_channels()
        finally:
            km.shutdown_kernel(now=True)
