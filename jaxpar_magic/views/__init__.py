"""The views: anywidget classes over a ``state`` dict, each with static HTML and text forms.

Each module exposes ``to_html(state)`` and ``to_text(state)`` (pure functions) and one class,
constructed as ``XView(state={...})``. Importing this package imports anywidget; the magics
import it only when they display something.
"""

from .collectives import CollectivesView
from .devices import DevicesView
from .mesh import MeshView
from .plan import PlanView
from .results import ResultView
from .sharding import ShardingView
from .tree import TreeView

__all__ = ["CollectivesView", "DevicesView", "MeshView", "PlanView", "ResultView", "ShardingView", "TreeView"]
