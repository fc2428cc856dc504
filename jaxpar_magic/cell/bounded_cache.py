"""A bounded least-recently-used cache, the project's one: compiled cells (cell/programs.py), outputs'
layouts (views/values.py), views' static forms (views/base.py). A module of its own, importing
nothing, so that the views, loaded at `%load_ext` before JAX, use it without the cell machinery."""
from __future__ import annotations

from collections import OrderedDict

CACHE_SIZE = 64  # compiled cells kept (cell/programs.py)


class BoundedCache(OrderedDict):
    """Least-recently-used cache (of compiled cells, say): re-runs hit it, it never grows past `size`.

    A `family` groups the variants of one cell (same source and options, other constants): a new
    variant replaces the old one, so the values the old program baked in (a helper's global array,
    say) are released as soon as the user changes them, not 64 cells later.
    """

    def __init__(self, size: int = CACHE_SIZE):
        super().__init__()
        self.size = size
        self._families: dict = {}  # family -> the key of its live variant

    def lookup(self, key, build, family=None):
        entry = self.get(key)
        if entry is None:
            entry = build()
            self.put(key, entry, family)
        else:
            self.move_to_end(key)
        return entry

    def put(self, key, entry, family=None) -> None:
        if family is not None:
            previous = self._families.get(family)
            if previous is not None and previous != key:
                self.pop(previous, None)
            self._families[family] = key
        self[key] = entry
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        if len(self._families) > 4 * self.size:  # forget families whose entry is gone
            self._families = {f: k for f, k in self._families.items() if k in self}

    def clear(self) -> None:
        super().clear()
        self._families.clear()
