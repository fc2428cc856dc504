"""Keeping the tests that share a set-up on one pytest-xdist worker (`scripts/test` runs `-n 2
--dist loadgroup`), and the folder the workers of one run share.

xdist's own loadgroup reads an `@group` suffix that its worker writes into each test's node id; with
pytest 9.2's structured node ids that write no longer takes, and the grouping silently stops
(pytest-xdist issue #1386, open for xdist 3.8.0). So tests/conftest.py does it here instead: after
collection each worker writes every grouped test's group to the run's folder, and the controller's
scheduler, xdist's LoadScopeScheduling with that group as the scope, reads them (the controller
collects nothing itself). tests/test_xdist_groups.py runs a small suite both ways and fails if the
grouping stops working.
"""
from __future__ import annotations

import json
from pathlib import Path

LAB_GROUP = "jupyterlab"  # every test of the run's one JupyterLab server (the `lab` fixture)


def group_of(item) -> str | None:
    """The group of a test that shares a set-up made once per process, or None: `jupyterlab` for the
    `lab` fixture's tests, and a file's own name for the tests that use one of its module-scoped
    fixtures (a cluster, a kernel, a libtpu compile, a built wheel)."""
    fixtures = getattr(item, "_fixtureinfo", None)  # absent on items that are not test functions
    if fixtures is None:
        return None
    if "lab" in item.fixturenames:
        return LAB_GROUP
    scopes = {d.scope for defs in fixtures.name2fixturedefs.values() for d in defs}
    return item.nodeid.split("::")[0] if scopes & {"module", "class", "package"} else None


def write_groups(folder: Path, worker: str, items) -> None:
    """On a worker, after collection: {node id: group} for the grouped tests, for the controller."""
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    partial = folder / f"groups-{worker}.partial"
    partial.write_text(json.dumps(groups), encoding="utf-8")
    partial.rename(folder / f"groups-{worker}.json")  # whole, or not there


def scheduler(config, log, folder: Path):
    """xdist's LoadScopeScheduling, whose scope of a test is its group (or the test alone): groups go
    out whole, the biggest first, then single tests to whichever worker runs short."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has sent its collection
                self.groups = {}
                for path in sorted(folder.glob("groups-*.json")):
                    self.groups.update(json.loads(path.read_text(encoding="utf-8")))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
