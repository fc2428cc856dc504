"""Text that fits its terminal: every text output within the width it is read at.

A terminal breaks a long line wherever the width runs out (``(l`` / ``atency-bound)``). So views
and printed code are fitted here: :func:`text_width` is the terminal's width in IPython and 80 in a
kernel (a notebook's ``text/plain``, ``jupyter console``); :func:`fit_text` wraps a long line at
word boundaries, its continuation indented under the line's own text; :func:`fit_code` breaks a
long line of Python after a comma inside brackets, so the code still runs as it is printed.
Renderers that draw tables read :func:`current_width` to reflow them before wrapping is needed.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import shutil
import textwrap
import time
import tokenize
from collections.abc import Iterator

DEFAULT_WIDTH = 80
#: Continuation lines are indented this much further than the line they continue.
HANG = 4

#: How long a terminal's width, once read, is taken as still true: the read is a system call (50 µs
#: a shown cell on the TPU host, bench section 15's breakdown), and a window resized less than this
#: ago is a rare race for one output.
TERMINAL_WIDTH_TTL_S = 0.5

_width: contextvars.ContextVar[int | None] = contextvars.ContextVar("jpm_text_width", default=None)
_terminal = [0.0, DEFAULT_WIDTH]  # (when it was read, its columns)


def in_kernel() -> bool:
    """Whether IPython runs in a kernel (a front end draws widgets; text is read at 80 columns), not in
    a terminal or plain Python. The views, the progress line and text_width ask it."""
    try:
        from IPython.core.getipython import get_ipython  # IPython.get_ipython is a lazy module attribute: ~1.5 µs a read
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def text_width() -> int:
    """Columns a text output is read at: 80 in a kernel, else the terminal's (at least 40)."""
    if in_kernel():
        return DEFAULT_WIDTH
    now = time.monotonic()
    read_at, columns = _terminal
    if now - read_at > TERMINAL_WIDTH_TTL_S:
        columns = max(40, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)
        _terminal[:] = [now, columns]
    return columns


def current_width() -> int:
    """The width the text being rendered now is fitted to (see :func:`fitted_to`)."""
    return _width.get() or text_width()


@contextlib.contextmanager
def fitted_to(width: int) -> Iterator[None]:
    token = _width.set(width)
    try:
        yield
    finally:
        _width.reset(token)


def fit_line(line: str, width: int) -> list[str]:
    """One line as lines of at most ``width`` columns, broken at spaces (a word longer than the
    width is cut), continuations indented ``HANG`` past the line's own indent."""
    if len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    indent = " " * (len(line) - len(body))
    if len(indent) > width // 2:
        indent = indent[: width // 4]
    return textwrap.wrap(body, width=width, initial_indent=indent, subsequent_indent=indent + " " * HANG,
                         break_long_words=True, break_on_hyphens=False, drop_whitespace=True) or [line[:width]]


def fit_text(text: str, width: int | None = None) -> str:
    """``text`` with every line fitted to ``width`` columns (default: :func:`text_width`)."""
    width = width or text_width()
    return "\n".join(piece for line in text.split("\n") for piece in fit_line(line.rstrip(), width))


def _break_points(line: str) -> list[tuple[int, int, int]]:
    """(column after a comma, indent for the next line, bracket depth) for each comma inside
    brackets of one line of code; the indent is the column just after the innermost open bracket."""
    points: list[tuple[int, int, int]] = []
    opened: list[int] = []
    tokens = []
    try:  # a line inside a longer bracket ends the token stream early: keep what came before
        for tok in tokenize.generate_tokens(io.StringIO(line.lstrip(" ") + "\n").readline):
            tokens.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    shift = len(line) - len(line.lstrip(" "))
    for tok in tokens:
        if tok.type != tokenize.OP:
            continue
        if tok.string in "([{":
            opened.append(tok.end[1] + shift)
        elif tok.string in ")]}" and opened:
            opened.pop()
        elif tok.string == "," and opened:
            points.append((tok.end[1] + shift, opened[-1], len(opened)))
    return points


def _split_comment(line: str) -> tuple[str, str]:
    """(the code, its trailing ``# comment``) of one line, by Python's own tokenizer."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.lstrip(" ") + "\n").readline):
            if tok.type == tokenize.COMMENT:
                at = tok.start[1] + len(line) - len(line.lstrip(" "))
                return (line[:at], line[at:]) if line[:at].strip() else (line, "")
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return line, ""


def fit_code_line(line: str, width: int) -> list[str]:
    """A line of Python as lines of at most ``width`` columns where it can be broken after a comma
    inside brackets (implicit continuation: the code means the same); a comment line is wrapped as
    comment lines; a line with nowhere to break stays as it is."""
    if len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    if body.startswith("#"):
        text = body.lstrip("#").strip()
        return textwrap.wrap(text, width=width, initial_indent=indent + "# ", subsequent_indent=indent + "# ",
                             break_long_words=False, break_on_hyphens=False) or [line]
    code, comment = _split_comment(line)
    if comment:  # a trailing comment goes on its own lines above the code it explains
        above = fit_code_line(indent + comment, width)
        return above + fit_code_line(code.rstrip(), width)
    points = _break_points(line)
    out: list[str] = []
    start, lead = 0, ""
    while len(lead) + len(line) - start > width:
        fits = [p for p in points if p[0] > start and len(lead) + p[0] - start <= width]
        if fits:  # the outermost bracket that has a break in reach, as far along as it goes
            depth = min(p[2] for p in fits)
            col, hang, _ = [p for p in fits if p[2] == depth][-1]
        else:
            later = [p for p in points if p[0] > start]
            if not later:
                break
            col, hang, _ = later[0]  # the first break point, even past the width: shorter than nothing
        out.append(lead + line[start:col].rstrip())
        start = col
        while start < len(line) and line[start] == " ":
            start += 1
        lead = " " * (hang if hang < width - 20 else len(indent) + 2 * HANG)
    out.append(lead + line[start:])
    return out


def fit_code(source: str, width: int | None = None) -> str:
    """Python source with long lines broken so that each fits ``width`` where it can: after a comma
    inside brackets, or a comment wrapped into comment lines."""
    width = width or text_width()
    return "\n".join(piece for line in source.split("\n") for piece in fit_code_line(line, width))
