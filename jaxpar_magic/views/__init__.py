"""The views: anywidget classes over a ``state`` dict, each with static HTML and text forms, and the
small states they are built from (`summaries.py`, `tree_summary.py`), plus the status lines a wait
shows in the cell (`progress.py`).

Each view module exposes ``to_html(state)`` and ``to_text(state)`` (pure functions) and one class,
constructed as ``XView(state={...})``. The classes import anywidget, so this package hands them out
lazily: the stages import `views.summaries` or `views.progress` without it, and the magics import a
view only when they display something.
"""
from __future__ import annotations

_VIEWS = {
    "CollectivesView": "collectives",
    "DevicesView": "devices",
    "ExplorerView": "explorer",
    "MemoryView": "memory",
    "MeshView": "mesh",
    "PlanView": "plan",
    "ProfileView": "profile",
    "ResultView": "results",
    "ShardingView": "sharding",
    "TreeView": "tree",
}

__all__ = list(_VIEWS)


def __getattr__(name: str):
    if name in _VIEWS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_VIEWS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_VIEWS))
