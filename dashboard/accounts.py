"""Operators (browser logins), agent API tokens, and the shared web secrets.

Passwords are hashed with scrypt from the standard library; API tokens are random
256-bit secrets, so a SHA-256 of them is enough to look them up and nothing else is kept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from datetime import datetime

import asyncpg
import msgspec

from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.models import Scope, check_queue
from dashboard.queries import ACCOUNTS as SQL

ROLES = ("viewer", "operator")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")
AGENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,62}$")
TOKEN_PREFIX = "sbt_"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class Operator(msgspec.Struct, frozen=True):
    name: str
    role: str

    @property
    def can_change(self) -> bool:
        return self.role == "operator"


class Agent(msgspec.Struct, frozen=True):
    """Who holds a bearer token: the owner name of its claims and the queues it covers."""

    name: str
    scope: Scope


class Token(msgspec.Struct, kw_only=True):
    """An API token as the tokens page and `token list` show it (never its secret)."""

    id: str
    agent: str
    queues: list[str]
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    revoked_by: str | None


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${b64(salt).decode()}${b64(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        _, n, r, p, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def token_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class Accounts:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    # -- operators -------------------------------------------------------------------

    async def add_operator(self, name: str, role: str, password: str | None = None) -> str:
        """Create an operator; returns the password (generated unless given)."""
        if not NAME.match(name or ""):
            raise InvalidInput("name", "letters, digits, _ . @ - (1-63 chars)")
        if role not in ROLES:
            raise InvalidInput("role", f"must be one of {', '.join(ROLES)}")
        password = password or secrets.token_urlsafe(15)
        try:
            await SQL.add_operator.execute(
                self.db, name=name, role=role, password_hash=hash_password(password)
            )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"operator {name} already exists") from None
        return password

    async def has_operators(self) -> bool:
        return await SQL.has_operators.fetchval(self.db)

    async def login(self, name: str, password: str) -> Operator | None:
        row = await SQL.operator_login.fetchrow(self.db, name=name)
        if row is None:
            hash_password(password)  # spend the same time whether or not the name exists
            return None
        if not check_password(password, row["password_hash"]):
            return None
        await SQL.note_login.execute(self.db, name=name)
        return Operator(row["name"], row["role"])

    async def operator(self, name: str) -> Operator | None:
        row = await SQL.operator.fetchrow(self.db, name=name)
        return Operator(row["name"], row["role"]) if row else None

    # -- API tokens ------------------------------------------------------------------

    async def add_token(self, agent: str, queues: list[str], *, actor: str = "cli") -> tuple[str, str]:
        """Create a token for `agent` on `queues`; returns (token id, secret)."""
        if not AGENT.match(agent or ""):
            raise InvalidInput("agent", "letters, digits, _ . : @ - (1-63 chars)")
        if not queues:
            raise InvalidInput("queues", "give at least one queue")
        for q in queues:
            check_queue(q, "queues")
        token_id = "tk_" + secrets.token_hex(6)
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        await SQL.add_token.execute(
            self.db, id=token_id, agent=agent, queues=queues, token_hash=token_hash(secret), created_by=actor
        )
        return token_id, secret

    async def agent_for(self, secret: str) -> Agent | None:
        row = await SQL.agent_for_token.fetchrow(self.db, token_hash=token_hash(secret))
        if row is None:
            return None
        return Agent(row["agent"], Scope(row["id"], tuple(row["queues"])))

    async def list_tokens(self) -> list[Token]:
        return [Token(**dict(r)) for r in await SQL.list_tokens.fetch(self.db)]

    async def revoke_token(self, token_id: str, *, actor: str) -> None:
        row = await SQL.revoke_token.fetchrow(self.db, id=token_id, actor=actor)
        if not row["found"]:
            raise NotFound(f"no token {token_id}")
        if not row["revoked"]:
            raise Conflict(f"token {token_id} is already revoked")

    # -- shared secrets ----------------------------------------------------------------

    async def secret(self, name: str, size: int = 32) -> bytes:
        """A random secret shared by every process (made by whichever asks first)."""
        return await SQL.secret.fetchval(self.db, name=name, value=secrets.token_bytes(size))
