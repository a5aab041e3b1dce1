"""pytest-xdist support for a suite run (``-n N``): every scenario item goes to one worker, which runs them one
after another; other tests keep spreading over the workers.

Why a scheduler of our own and not ``xdist_group`` + ``--dist loadgroup``: loadgroup finds the group in a
``@group`` suffix xdist adds to node ids by assigning ``item._nodeid``, which pytest 9 no longer reads (node ids
are ``item._id``), so the suffix silently never appears and the scenarios spread over the workers. This
scheduler groups by what it knows: the suite's node ids. It is a ``LoadScopeScheduling`` (xdist's own
loadscope/loadgroup base): the suite's scenarios are one scope; any other test keeps the scope the user's
``--dist`` gives it (its file for loadfile, its class or module for loadscope, itself for load/worksteal/loadgroup).
Imported only when pytest-xdist is active (``SuiteSession.pytest_xdist_make_scheduler``).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

SUITE_SCOPE = "flashckpt-suite"


class SuiteScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None, scenario_ids: frozenset[str] = frozenset(), dist: str = "load") -> None:
        super().__init__(config, log)
        self.scenario_ids = scenario_ids
        self.dist = dist

    def _split_scope(self, nodeid: str) -> str:
        if nodeid in self.scenario_ids:
            return SUITE_SCOPE
        if self.dist == "loadfile":
            return nodeid.split("::", 1)[0]
        if self.dist == "loadscope":
            return nodeid.rsplit("::", 1)[0]
        if self.dist == "loadgroup" and "@" in nodeid:
            return nodeid.split("@")[-1]
        return nodeid  # load / worksteal: each test on its own
