"""One number formatter for the widget, the static HTML and the text: Python's twins of
JavaScript's toPrecision and js/format.js's formatSeconds give the same strings."""

from __future__ import annotations

import random
from typing import Any

from jaxpar_magic.views.base import format_seconds, to_precision


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
