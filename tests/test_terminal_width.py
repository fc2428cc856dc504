"""Text outputs fit an 80-column terminal: terminal IPython in a pseudo-terminal of 80 columns runs
a tour of magics (`%devices`, `%%pmap` with `--collectives`, `%mesh`, `%%shard`, `%sharding`,
`--plan`, `--as-code`), and no line it prints is longer than 80 characters."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

pytestmark = pytest.mark.slow

CELLS = [
    "%load_ext jaxpar_magic",
    "%devices --simulate 8",
    "import jax.numpy as jnp\nfrom jax import lax\nr = jnp.arange(8.0)",
    "%%pmap -a i --collectives\nt = lax.psum(r, 'i')\np = lax.ppermute(r, 'i', [(k, (k + 1) % 8) for k in range(8)])",
    "%mesh data=4 model=2",
    "x = jnp.arange(64.0).reshape(8, 8)\nw = jnp.ones((8, 4))",
    "%%shard --in x=data,None w=None,model --report\ny = x @ w",
    "%sharding x",
    "%%shard --plan --hardware tpu-v5e --in x=data,None w=None,model\nz = jnp.tanh(x @ w)",
    "%%shard_map --mesh mesh --in x=data,model --out c=data,None --as-code\nc = lax.psum(x, 'model')",
    "print('TOUR-DONE')",
]
COLUMNS = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\r")


def test_every_line_fits_80_columns(tmp_path):
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    env = {**os.environ, "COLUMNS": str(COLUMNS), "LINES": "50", "TERM": "dumb", "IPYTHONDIR": str(tmp_path / "ipython")}
    env.pop("CI", None)
    # Each cell through IPython's own cell runner, as typing it at the prompt runs it.
    program = "ip = get_ipython()\n" + "".join(f"_ = ip.run_cell({cell!r}, store_history=True)\n" for cell in CELLS)
    proc = subprocess.Popen([sys.executable, "-m", "IPython", "--colors=NoColor", "--no-banner",
                             "--HistoryManager.enabled=False", "-c", program], stdin=follower, stdout=follower,
                            stderr=follower, env=env, cwd=tmp_path, close_fds=True)
    os.close(follower)
    out = b""
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1)
            if ready:
                try:
                    out += os.read(leader, 65536)
                except OSError:  # the child closed the terminal
                    break
        with contextlib.suppress(OSError):
            while select.select([leader], [], [], 0.5)[0]:
                chunk = os.read(leader, 65536)
                if not chunk:
                    break
                out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    text = ANSI.sub("", out.decode("utf-8", "replace"))
    assert "\nTOUR-DONE" in text, text[-3000:]
    long = [line for line in text.splitlines() if len(line) > COLUMNS]
    assert not long, "\n".join(long)
    for said in ("8 cpu devices", "psum", "collective-permute", "Mesh 'mesh'", "P('data', None)", "tpu-v5e",
                 "jax.shard_map("):
        assert said in text, said
