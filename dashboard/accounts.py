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
from dataclasses import dataclass

import asyncpg

from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.models import check_queue

ROLES = ("viewer", "operator")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")
AGENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,62}$")
TOKEN_PREFIX = "sbt_"
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


@dataclass(frozen=True)
class Operator:
    name: str
    role: str

    @property
    def can_change(self) -> bool:
        return self.role == "operator"


@dataclass(frozen=True)
class Agent:
    token_id: str
    name: str
    queues: tuple[str, ...]


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **_SCRYPT)
    b64 = base64.b64encode
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${b64(salt).decode()}${b64(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        _, n, r, p, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p)
        )
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
            await self.db.execute(
                "INSERT INTO operators (name, role, password_hash) VALUES ($1, $2, $3)",
                name, role, hash_password(password),
            )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"operator {name} already exists") from None
        return password

    async def has_operators(self) -> bool:
        return await self.db.fetchval("SELECT EXISTS (SELECT FROM operators)")

    async def login(self, name: str, password: str) -> Operator | None:
        row = await self.db.fetchrow(
            "SELECT name, role, password_hash FROM operators WHERE name = $1", name
        )
        if row is None:
            hash_password(password)  # spend the same time whether or not the name exists
            return None
        if not check_password(password, row["password_hash"]):
            return None
        await self.db.execute("UPDATE operators SET last_login_at = now() WHERE name = $1", name)
        return Operator(row["name"], row["role"])

    async def operator(self, name: str) -> Operator | None:
        row = await self.db.fetchrow("SELECT name, role FROM operators WHERE name = $1", name)
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
        await self.db.execute(
            "INSERT INTO api_tokens (id, agent, queues, token_hash, created_by) VALUES ($1, $2, $3, $4, $5)",
            token_id, agent, queues, token_hash(secret), actor,
        )
        return token_id, secret

    async def agent_for(self, secret: str) -> Agent | None:
        row = await self.db.fetchrow(
            "SELECT id, agent, queues FROM api_tokens WHERE token_hash = $1 AND revoked_at IS NULL",
            token_hash(secret),
        )
        return Agent(row["id"], row["agent"], tuple(row["queues"])) if row else None

    async def list_tokens(self) -> list[dict]:
        rows = await self.db.fetch(
            "SELECT id, agent, queues, created_at, created_by, revoked_at, revoked_by "
            "FROM api_tokens ORDER BY revoked_at IS NOT NULL, created_at DESC"
        )
        return [dict(r) for r in rows]

    async def revoke_token(self, token_id: str, *, actor: str) -> None:
        status = await self.db.execute(
            "UPDATE api_tokens SET revoked_at = now(), revoked_by = $2 WHERE id = $1 AND revoked_at IS NULL",
            token_id, actor,
        )
        if status.endswith(" 0"):
            exists = await self.db.fetchval("SELECT EXISTS (SELECT FROM api_tokens WHERE id = $1)", token_id)
            if not exists:
                raise NotFound(f"no token {token_id}")
            raise Conflict(f"token {token_id} is already revoked")

    # -- shared secrets ----------------------------------------------------------------

    async def secret(self, name: str, size: int = 32) -> bytes:
        """A random secret shared by every process (made by whichever asks first)."""
        await self.db.execute(
            "INSERT INTO app_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            name, secrets.token_bytes(size),
        )
        return await self.db.fetchval("SELECT value FROM app_secrets WHERE name = $1", name)
