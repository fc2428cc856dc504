"""One graded run: a notebook, alone in a fresh folder, in a fresh kernel of this Python.

The folder holds a private copy of the submission and nothing else, so a notebook cannot read or
write another's. The kernel runs on 8 simulated CPU devices, with a time limit per cell and per
notebook; when the run ends, however it ends, the kernel and every process it started are ended
(grade/processes.py).

Verdicts come from the checks' own record (face/checks.py `ledger`), read after each check cell by
a *silent* request of the grader's (user_expressions: no cell runs, no hook fires, nothing is
printed), never from what the cell printed or displayed: a print, a display or a hook cannot
forge one.
"""
from __future__ import annotations

import ast
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from .processes import MARK, end_kernel_processes

_LEDGER = "__import__('jaxpar_magic.face.checks', fromlist=['ledger']).ledger({start})"


def execute(nb, source: bytes | None, cell_timeout: float, timeout: float, checks: set[int] = frozenset(),
            name: str = "submission.ipynb") -> tuple[list[str], dict[int, list[dict]]]:
    """Run every cell of `nb` (a copy of `source`, the submission's bytes, lies in the kernel's empty
    folder); (what went wrong outside the exercise cells, in words; the verdicts each cell in `checks`
    gave, by index)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    mark = uuid.uuid4().hex
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8", MARK: mark}
    # This Python's own kernel, never a kernelspec found in someone's home. Async: a blocking client
    # would wait for a hung cell's output forever, past nbclient's timeout.
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    problems: list[str] = []
    verdicts: dict[int, list[dict]] = {}
    started, index, kernel_pid = time.monotonic(), 0, None
    with tempfile.TemporaryDirectory(prefix="jpm-grade-") as scratch:
        folder = Path(scratch) / "notebook"
        folder.mkdir()
        if source is not None:
            (folder / name).write_bytes(source)
        client = NotebookClient(nb, km=km, timeout=cell_timeout, startup_timeout=120, allow_errors=True,
                                resources={"metadata": {"path": str(folder)}}, record_timing=False)
        try:
            client.reset_execution_trackers()
            with client.setup_kernel(env=env):
                kernel_pid = getattr(km.provisioner, "pid", None)
                given = 0
                for index, cell in enumerate(nb.cells):
                    left = timeout - (time.monotonic() - started)
                    if left <= 0:
                        problems.append(f"stopped at cell {index + 1}: the notebook ran past its {timeout:g} s")
                        break
                    client.timeout = max(1, int(min(cell_timeout, left)))
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                    if cell.cell_type == "code" and cell.source.strip():
                        given, verdicts[index] = _verdicts_since(client, given, run_sync)
                    error = next((o for o in cell.get("outputs", []) if o.output_type == "error"), None)
                    tags = cell.metadata.get("tags", [])
                    if error is not None and "exercise" not in tags and "raises-exception" not in tags:
                        problems.append(f"cell {index + 1} raised {error.ename}: {line_of(error.evalue)}")
        except CellTimeoutError:
            problems.append(f"cell {index + 1} ran past its {client.timeout} s (it may hang): stopped there")
        except DeadKernelError as error:
            problems.append(f"the kernel died at cell {index + 1} ({line_of(error)})")
        except Exception as error:  # the kernel would not start, or nbclient failed: this notebook only
            problems.append(f"could not run the notebook ({type(error).__name__}: {line_of(error)})")
        finally:  # never leave a kernel, or a process it started, behind, whatever happened above
            try:
                end_kernel_processes(kernel_pid, mark)  # the kernel's tree first, while it is one
                if km.has_kernel:
                    run_sync(km.shutdown_kernel)(now=True)
            finally:
                end_kernel_processes(None, mark)
    return problems, {index: found for index, found in verdicts.items() if index in checks}


def _verdicts_since(client, start: int, run_sync) -> tuple[int, list[dict]]:
    """(the ledger's length now, the verdicts given since `start`), by a silent request."""
    async def ask() -> dict:
        kc = client.kc
        msg_id = kc.execute("", silent=True, store_history=False,
                            user_expressions={"ledger": _LEDGER.format(start=int(start))})
        while True:
            reply = await kc.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]

    content = run_sync(ask)()
    value = content.get("user_expressions", {}).get("ledger", {})
    if value.get("status") != "ok":  # the checks' module is not there (no %load_ext): no verdicts
        return start, []
    found = json.loads(ast.literal_eval(value["data"]["text/plain"]))
    return found["count"], [v for v in found["verdicts"] if isinstance(v, dict)]


def line_of(error) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else text[:157] + "..."
