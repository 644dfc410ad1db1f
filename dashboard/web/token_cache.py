"""Bearer token → agent, remembered, so an API request costs no database round trip for
its token (it was a fifth of the server's time per request).

Revocation still reaches every process at once: revoke_token's NOTIFY drops the token's
entry here (Hub.on_tokens). What could keep a revoked token working is a NOTIFY that never
arrives, so an entry is trusted only while the hub's LISTEN connection is up, is dropped
with all the others whenever that connection is lost or re-opened, and is never older
than MAX_AGE, whatever happens. Only tokens that were found are kept: a new token needs no
invalidation, and unknown tokens (guesses) always ask the database, where Limits counts
them.
"""

from __future__ import annotations

import asyncio

from dashboard.accounts import Accounts, Agent, token_hash
from dashboard.notify import Hub

MAX_AGE = 0.5  # seconds: a revocation whose NOTIFY was lost still takes effect within this
MAX_ENTRIES = 10_000


class TokenCache:
    def __init__(self, accounts: Accounts, hub: Hub):
        self.accounts = accounts
        self.hub = hub
        self._entries: dict[bytes, tuple[Agent, float]] = {}  # token hash → (agent, when read)
        self._generation = 0  # bumped by every invalidation, so a lookup racing one is not kept
        hub.on_tokens(self._invalidate)

    async def agent_for(self, secret: str) -> Agent | None:
        key = token_hash(secret)
        now = asyncio.get_running_loop().time()
        hit = self._entries.get(key)
        if hit is not None and now - hit[1] < MAX_AGE and self.hub.connected.is_set():
            return hit[0]
        generation = self._generation
        agent = await self.accounts.agent_for_hash(key)
        if agent is None:
            self._entries.pop(key, None)
        elif generation == self._generation and self.hub.connected.is_set():
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[key] = (agent, now)
        return agent

    def _invalidate(self, token_id: str | None) -> None:
        self._generation += 1
        if token_id is None:
            self._entries.clear()
            return
        for key, (agent, _) in list(self._entries.items()):
            if agent.scope.token_id == token_id:
                del self._entries[key]
