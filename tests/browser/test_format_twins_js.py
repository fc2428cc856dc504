"""One number formatter for the widget, the static HTML and the text: Python's twins of
JavaScript's toPrecision and js/format.js's formatSeconds give the same strings."""

from __future__ import annotations

import random
from typing import Any

from jaxpar_magic.views.base import format_bytes, format_seconds, to_precision


def test_to_precision_and_format_seconds_match_the_browser(view_page: Any) -> None:
    rng = random.Random(26)
    # Magnitudes from sub-nanosecond (the compute time that read "0.00 ns" in the text) to seconds.
    values = [0.0, 2.92e-12, 3.2e-8, 5.87e-4, 0.0012, 0.009996, 2.5, 999.5e-9, 1e-6, 123456.0]
    values += [rng.uniform(1, 10) * 10 ** rng.randint(-13, 5) * rng.choice([1, -1]) for _ in range(400)]
    js = view_page.page.evaluate(
        """async (values) => {
            const { formatSeconds } = await import('/js/format.js');
            return values.map((v) => [v.toPrecision(3), formatSeconds(v)]);
        }""",
        values,
    )
    mismatched = [(v, j, (to_precision(v), format_seconds(v))) for v, j in zip(values, js, strict=True)
                  if [to_precision(v), format_seconds(v)] != j]
    assert not mismatched, mismatched[:10]
    assert format_seconds(2.92e-12) == "0.00292 ns"  # was "0.00 ns" in the HTML and the text


def test_format_bytes_matches_the_browser_on_ties(view_page: Any) -> None:
    """Issue 42: one view said 5.2 MiB (Python's round-half-even) beside 5.3 MiB (JavaScript's toFixed) for the
    same 5.25 MiB. Exact ties, and random sizes from bytes to TiB, format alike."""
    rng = random.Random(42)
    values = [0, 1, 1023, 1024, int(5.25 * 2**20), int(0.25 * 2**20) + 2**20, 2**30 + 2**30 // 4, 3 * 2**40 // 4 * 3,
              int(1023.95 * 1024), -int(5.25 * 2**20)]
    values += [rng.randrange(1, 2**44) for _ in range(300)] + [rng.randrange(1, 80) * 2**14 for _ in range(100)]
    js = view_page.page.evaluate(
        """async (values) => {
            const { formatBytes } = await import('/js/format.js');
            return values.map((v) => formatBytes(v));
        }""",
        values,
    )
    mismatched = [(v, j, format_bytes(v)) for v, j in zip(values, js, strict=True) if format_bytes(v) != j]
    assert not mismatched, mismatched[:10]
    assert format_bytes(int(5.25 * 2**20)) == "5.3 MiB"
