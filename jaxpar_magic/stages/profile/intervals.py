"""Time intervals as sorted, disjoint lists of (start, end): union, difference, length. What the
profile's shares and overlaps are made of.

Plain Python.
"""
from __future__ import annotations


def union(intervals) -> list:
    """The intervals merged: sorted, disjoint (empty ones dropped)."""
    merged: list = []
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def subtract(intervals: list, taken: list) -> list:
    """What of `intervals` (sorted, disjoint) lies outside `taken` (sorted, disjoint)."""
    left, j = [], 0
    for start, end in intervals:
        while j < len(taken) and taken[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(taken) and taken[k][0] < end:
            if taken[k][0] > cursor:
                left.append((cursor, taken[k][0]))
            cursor = max(cursor, taken[k][1])
            k += 1
        if cursor < end:
            left.append((cursor, end))
    return left


def clip(intervals: list, low: float, high: float) -> list:
    """The intervals cut to [low, high]."""
    return [(max(s, low), min(e, high)) for s, e in intervals if min(e, high) > max(s, low)]


def measure(intervals: list) -> float:
    return sum(end - start for start, end in intervals)
