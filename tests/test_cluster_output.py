"""What cluster engines write natively (Gloo's interleaved chatter, filtered at the file descriptor)
and how a stuck process says where it waits (the hang doctor). Fast: real file descriptors, real
threads and a real signal in a subprocess, no engines."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jaxpar_magic.cluster import hang_doctor
from jaxpar_magic.cluster.native_output import GlooFilter

PIECES = [b"[Gloo] Rank ", b"%d", b" is connected to ", b"7", b" peer ranks. ",
          b"Expected number of connected peer ranks is : ", b"7", b"\n"]


def interleaved(ranks, seed: int) -> bytes:
    """Gloo's messages as several threads write them at once: piece by piece, shuffled."""
    rng = random.Random(seed)
    queues = [[piece % rank if b"%d" in piece else piece for piece in PIECES] for rank in ranks]
    out = []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        out.append(queue.pop(0))
    return b"".join(out)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_interleaved_gloo_messages_are_dropped_and_the_rest_kept(seed, chunk):
    noise = interleaved(range(4 * (seed % 2), 4 * (seed % 2) + 4), seed)
    whole = [b"".join(piece % rank if b"%d" in piece else piece for piece in PIECES) for rank in range(8)]
    assert sum(message in noise for message in whole) < 4  # interleaved, as the issue saw it
    data = b"compiling took 12 s\n" + noise + b"W0000 some XLA warning 42\n" + noise + b"done 7\n"
    gloo = GlooFilter()
    kept = b"".join(gloo.feed(data[i:i + chunk]) for i in range(0, len(data), chunk)) + gloo.flush()
    assert kept == b"compiling took 12 s\nW0000 some XLA warning 42\ndone 7\n"


def test_text_that_only_looks_like_gloo_passes():
    gloo = GlooFilter()
    text = b"[Gloo is a library] Rank 3\n[Gloo] Ranking done\n"
    assert gloo.feed(text) + gloo.flush() == text
    assert gloo.feed(b"tail [Gl") == b"tail "  # perhaps the start of a message: held back a moment
    assert gloo.flush() == b"[Gl"


FD_WRITER = textwrap.dedent("""
    import os, sys, threading
    from jaxpar_magic.cluster import native_output
    native_output.quiet(1)
    pieces = [{pieces!r}]
    def write(rank):  # as Gloo's threads do: one write(2) per piece, straight to the descriptor
        for piece in pieces[0]:
            os.write(1, piece.replace(b"%d", str(rank).encode()))
    os.write(1, b"before\\n")
    threads = [threading.Thread(target=write, args=(rank,)) for rank in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    os.write(1, b"after\\n")
    native_output.release(1)
    print("released", flush=True)
""")


def test_the_filter_sits_on_the_file_descriptor():
    done = subprocess.run([sys.executable, "-c", FD_WRITER.format(pieces=PIECES)], capture_output=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"before\nafter\nreleased\n"


STUCK = textwrap.dedent("""
    import linecache, threading, sys
    from jaxpar_magic.cluster import hang_doctor
    hang_doctor.install()
    cell = "import time\\nready = True\\ndone.wait(20)  # stands for psum(x).block_until_ready()\\n"
    linecache.cache["<cell-1>"] = (len(cell), None, cell.splitlines(True), "<cell-1>")
    done = threading.Event()
    print("waiting", flush=True)
    exec(compile(cell, "<cell-1>", "exec"), {"done": done})
""")


def all_threads_sleep(pid: int) -> bool:
    """Every thread of `pid` blocked (state S in /proc): faulthandler's dump of all threads reads
    their frames without the GIL, safe only while none of them is running Python."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # a thread that ended meanwhile
    return bool(states) and all(state == "S" for state in states)


def test_a_stuck_process_says_where_it_waits():
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        until = time.monotonic() + 10
        while not all_threads_sleep(proc.pid) and time.monotonic() < until:
            time.sleep(0.01)  # the main thread is about to block in its wait (it printed just before)
        proc.send_signal(signal.SIGUSR1)
        lines = []  # up to the marked line; the child's own wait(20) bounds this at EOF
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(hang_doctor.MARK):
                break
        report = "".join(lines)
    finally:
        proc.kill()
        proc.communicate(timeout=10)
    frames = hang_doctor.read_report(report)
    assert frames is not None, (proc.returncode, report)
    said = hang_doctor.describe(frames)
    assert said.startswith("at line 3 of the cell (`done.wait(20)  # stands for psum(x).block_until_ready()`), "
                           "waiting in `wait`"), said
    assert "that line calls `psum`, a collective every process must reach" in said


def test_describe_without_a_cell_names_the_innermost_frame():
    frames = [{"file": "/x/jax/_src/array.py", "line": 12, "name": "block_until_ready", "text": "", "on_disk": True}]
    assert hang_doctor.describe(frames) == "in `block_until_ready` (array.py, line 12)"
    # A request that is no cell (ipyparallel's apply runs "<string>", which linecache does not know).
    frames = [
        {"file": "/x/jax/multihost_utils.py", "line": 135, "name": "_allgather", "text": "...", "on_disk": True},
        {"file": "/x/jax/multihost_utils.py", "line": 165, "name": "sync_global_devices", "text": "...", "on_disk": True},
        {"file": "/x/jaxpar_magic/cluster/engine.py", "line": 193, "name": "probe", "text": "...", "on_disk": True},
        {"file": "<string>", "line": 1, "name": "<module>", "text": "", "on_disk": False},
        {"file": "/x/ipyparallel/engine/kernel.py", "line": 157, "name": "do_apply", "text": "exec(code)", "on_disk": True},
    ]
    assert hang_doctor.describe(frames) == ("in `probe` (engine.py, line 193), waiting in `_allgather`; it is "
                                            "inside `sync_global_devices`, a collective every process must reach")
    assert hang_doctor.describe([]) is None
    assert hang_doctor.read_report("plain output\n") is None
    assert hang_doctor.read_report(hang_doctor.MARK + json.dumps(frames) + "\n") == frames
