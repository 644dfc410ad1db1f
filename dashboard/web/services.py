"""What the app's lifespan opens for its handlers, in one place.

Handlers receive each service by injection (app.py's `Provide`s); guards and hooks,
which Litestar does not inject, reach them with `services(connection)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from litestar.connection import ASGIConnection

from dashboard.accounts import Accounts
from dashboard.agents import Agents
from dashboard.control import Control
from dashboard.horizon import HorizonWatch
from dashboard.notify import Hub
from dashboard.reads import Reads
from dashboard.store import Store
from dashboard.web.limits import Limits
from dashboard.web.searches import SEARCHES
from dashboard.web.stats_cache import StatsCache
from dashboard.web.token_cache import TokenCache


@dataclass
class Services:
    store: Store
    control: Control
    reads: Reads
    accounts: Accounts
    hub: Hub
    stats: StatsCache
    horizon: HorizonWatch
    tokens: TokenCache
    limits: Limits = field(default_factory=Limits)
    has_operators: bool = False  # remembered once true: operators are never all removed at run time

    @cached_property
    def agents(self) -> Agents:
        """The agents' use-cases (dashboard/agents.py), for the API and the MCP tools."""
        return Agents(self.store, self.reads, self.accounts, self.hub, SEARCHES)


def services(connection: ASGIConnection) -> Services:
    return connection.app.state.services
