"""Status lines: shown after the delay, rewritten in place, and never left behind empty (a front
end cannot remove one output, so a line with no result to give way to says how long it took)."""
from __future__ import annotations

import time

from IPython.utils.capture import capture_output

from jaxpar_magic.views import progress


def texts(captured) -> list[str]:
    return [o.data.get("text/plain", "") for o in captured.outputs]


def test_a_line_with_no_result_ends_saying_done(ip):
    with capture_output() as shown:
        with progress.Progress("compiling", delay=0.05, interval=0.05, enabled=True):
            time.sleep(0.3)
    said = texts(shown)
    assert said[0].startswith("compiling… ") and said[-1].startswith("done in ") and said[-1].endswith(" s")
    assert "" not in said


def test_a_kept_line_gives_way_to_the_result_or_says_done(ip):
    with capture_output() as shown:
        with progress.kept_lines() as slots:
            for _ in range(2):
                with progress.Progress("running", delay=0.05, interval=0.05, enabled=True):
                    time.sleep(0.2)
            assert slots.fill(progress.StatusLine("the result"))
            slots.close()  # as face/magics.py does: the second line had nothing to give way to
    said = texts(shown)
    assert "the result" in said and said[-1].startswith("done in ") and "" not in said


def test_a_short_wait_shows_nothing(ip):
    with capture_output() as shown:
        with progress.Progress("compiling", delay=5, enabled=True):
            pass
    assert shown.outputs == []


def test_a_view_gives_its_static_twin_the_line_and_follows_with_the_widget(ip, monkeypatch):
    """A status line's place goes to the view's first output (its static twin); the widget comes
    right after it (in a kernel a view is two outputs: views/base.py's display_parts)."""
    from jaxpar_magic.views import base
    from jaxpar_magic.views.devices import DevicesView

    monkeypatch.setattr(base, "_in_kernel", lambda: True)
    view = DevicesView(state={"devices": [], "counts": {"cpu": 1}, "total": 1, "backend": "cpu"})
    with capture_output() as shown:
        with progress.kept_lines() as slots:
            with progress.Progress("compiling", delay=0.05, interval=0.05, enabled=True):
                time.sleep(0.2)
            assert slots.fill(view)
            slots.close()
    kinds = [sorted(o.data) for o in shown.outputs]
    assert kinds[-2:] == [["text/html", "text/plain"], [base.WIDGET_MIME]], kinds
    assert shown.outputs[-2].data["text/html"].startswith(f'<div class="jpm-static jpm-twin-{view._jpm_twin}">')
    view.close()


def test_switching_lines_off_holds_for_one_thread_only(ip, monkeypatch):
    """The layout explorer plans on a worker thread with its lines off; the kernel's own cells keep theirs."""
    import threading

    monkeypatch.setattr(ip, "kernel", object(), raising=False)  # as in a kernel: lines are on by default
    inside, release, seen = threading.Event(), threading.Event(), {}

    def worker():
        with progress.disabled():
            seen["worker"] = progress.Progress("planning")._enabled
            inside.set()
            assert release.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(30)
    seen["main"] = progress.Progress("compiling")._enabled  # while the worker's block is open
    release.set()
    thread.join()
    assert seen == {"worker": False, "main": True}


def test_a_line_says_done_while_another_thread_keeps_its_own_lines(ip):
    """The stack of kept lines was shared by every thread: while another thread (the layout explorer's
    worker, a cell's leftover thread) was inside kept_lines(), this thread's finished line went to that
    thread's slots and never said "done" (seen once in a full CI run: the last line read "compiling… 0 s")."""
    import threading

    inside, release = threading.Event(), threading.Event()

    def other():
        with progress.kept_lines():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    try:
        assert inside.wait(10)
        with capture_output() as shown:
            with progress.Progress("compiling", delay=0.05, interval=0.05, enabled=True):
                time.sleep(0.3)
    finally:
        release.set()
        thread.join(10)
    said = texts(shown)
    assert said and said[-1].startswith("done in "), said
