"""Operators (browser logins), agent API tokens, and the shared web secrets.

Passwords are hashed with scrypt from the standard library, in a worker thread and one
at a time, so a flood of logins costs the event loop (claims, heartbeats) nothing; the web
process lets only a few logins wait for that slot (dashboard/web/limits.py).
API tokens and session ids are random 256-bit secrets, so a SHA-256 of them is enough to
look them up and nothing else is kept. Agent and operator names share one namespace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
from datetime import datetime

import asyncpg
import msgspec

from dashboard.db import connection
from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.models import ACTOR_KINDS, Problems, Scope, check_queue
from dashboard.queries import ACCOUNTS as SQL

ROLES = ("viewer", "operator")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")  # operators and agents alike
# The names switchboard's own steps are recorded under (actor kinds, the reaper, the
# CLI's default actor): no operator or agent may pass for them, in any case.
RESERVED = (*ACTOR_KINDS, "cli", "reaper")
TOKEN_PREFIX = "sbt_"
SCRYPT = {"n": 2**17, "r": 8, "p": 1}  # OWASP's current guidance: 128 MiB and ~0.3 s a hash
_MAXMEM = 2 * 128 * SCRYPT["r"] * SCRYPT["n"]
_HASHING = asyncio.Semaphore(1)  # one hash at a time: a core (and 128 MiB) stays for the rest


class Operator(msgspec.Struct, frozen=True):
    name: str
    role: str

    @property
    def can_change(self) -> bool:
        return self.role == "operator"


class Credentials(msgspec.Struct, frozen=True):
    """What a login checks a password against: an operator's, or nobody's (role None)."""

    name: str
    role: str | None
    password_hash: str

    @property
    def generation(self) -> str:
        """The hash's salt, new with every password set: limits keyed by it start afresh
        after `operator passwd`, in every process."""
        return self.password_hash.split("$")[-2]


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


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=max(_MAXMEM, 256 * r * n))


def _hash(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, **SCRYPT)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT['n']}${SCRYPT['r']}${SCRYPT['p']}${b64(salt).decode()}${b64(digest).decode()}"


def _check(password: str, stored: str) -> bool:
    try:
        _, n, r, p, salt, digest = stored.split("$")
        expected = base64.b64decode(digest)
        actual = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


async def hash_password(password: str) -> str:
    async with _HASHING:
        return await asyncio.to_thread(_hash, password)


async def check_password(password: str, stored: str) -> bool:
    async with _HASHING:
        return await asyncio.to_thread(_check, password, stored)


def outdated(stored: str) -> bool:
    """Whether a stored hash was made with other parameters than today's (re-hash it)."""
    return stored.split("$")[1:4] != [str(SCRYPT[k]) for k in ("n", "r", "p")]


# Checked when the name is unknown, so a login costs the same either way.
_NOBODY = f"scrypt${SCRYPT['n']}${SCRYPT['r']}${SCRYPT['p']}$AAAAAAAAAAAAAAAAAAAAAA==${'A' * 43}="


def token_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _check_name(name: str, field: str) -> None:
    if not name:
        raise InvalidInput(field, "is required")
    if not NAME.match(name):
        raise InvalidInput(
            field,
            f"{name!r} is not a name: names use letters, digits, '_', '.', '@' and '-', up to 63 "
            "characters, starting with a letter or digit",
        )
    if name.lower() in RESERVED:
        raise InvalidInput(
            field, f"{name!r} is reserved: switchboard records its own steps under {', '.join(RESERVED)}"
        )


async def _claim_name(conn: asyncpg.Connection, name: str, kind: str) -> None:
    """Take the names lock and refuse `name` for a new `kind` ("operator" or "agent") when
    it, or a name that differs from it only by case, is held (one namespace for both): only
    another token for the very same agent may share it."""
    await SQL.lock_names.execute(conn)
    holder = await SQL.name_holder.fetchrow(conn, name=name)
    if holder is None or (kind == "agent" and tuple(holder) == ("agent", name)):
        return
    held_by, held = holder
    if held != name:
        raise Conflict(f"{name} differs only by case from {held_by} {held}: names are compared ignoring case")
    if held_by == kind:
        raise Conflict(f"{kind} {name} already exists")
    raise Conflict(f"{name} is an {held_by}'s name (agents and operators share one namespace)")


class Accounts:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    # -- operators -------------------------------------------------------------------

    async def add_operator(self, name: str, role: str, password: str | None = None) -> str:
        """Create an operator; returns the password (generated unless given)."""
        _check_name(name, "name")
        if role not in ROLES:
            raise InvalidInput("role", f"must be one of {', '.join(ROLES)}")
        password = password or secrets.token_urlsafe(15)
        password_hash = await hash_password(password)
        async with connection(self.db) as conn, conn.transaction():
            await _claim_name(conn, name, "operator")
            await SQL.add_operator.execute(conn, name=name, role=role, password_hash=password_hash)
        return password

    async def set_password(self, name: str, password: str | None = None) -> str:
        """A new password (generated unless given); ends every session of the operator
        (and their pages' streams, in every process: a hint per session)."""
        password = password or secrets.token_urlsafe(15)
        if not await SQL.set_password.fetchval(
            self.db, name=name, password_hash=await hash_password(password)
        ):
            raise NotFound(f"no operator {name}")
        return password

    async def remove_operator(self, name: str) -> None:
        """Delete an operator; their sessions (and their pages' streams, hinted) end with them;
        their history rows stay."""
        if await SQL.remove_operator.fetchval(self.db, name=name) is None:
            raise NotFound(f"no operator {name}")

    async def has_operators(self) -> bool:
        return await SQL.has_operators.fetchval(self.db)

    async def credentials(self, name: str) -> Credentials:
        """What a login as `name` checks its password against (nobody's if there is no such
        operator, so that a login costs the same either way)."""
        # A NUL names nobody (and PostgreSQL text cannot hold one).
        row = None if "\x00" in name else await SQL.operator_login.fetchrow(self.db, name=name)
        return (
            Credentials(name, row["role"], row["password_hash"]) if row else Credentials(name, None, _NOBODY)
        )

    async def login(self, credentials: Credentials, password: str) -> Operator | None:
        """The operator, if `password` is theirs; older hashes are upgraded here."""
        stored = credentials.password_hash
        if not await check_password(password, stored) or credentials.role is None:
            return None
        name = credentials.name
        if outdated(stored):
            await SQL.rehash_password.execute(
                self.db, name=name, old_hash=stored, password_hash=await hash_password(password)
            )
        await SQL.note_login.execute(self.db, name=name)
        return Operator(name, credentials.role)

    async def operator(self, name: str) -> Operator | None:
        row = await SQL.operator.fetchrow(self.db, name=name)
        return Operator(row["name"], row["role"]) if row else None

    # -- API tokens ------------------------------------------------------------------

    async def add_token(self, agent: str, queues: list[str], *, actor: str = "cli") -> tuple[str, str]:
        """Create a token for `agent` on `queues`; returns (token id, secret)."""
        problems = Problems()  # the form shows every problem at once
        problems.check(_check_name, agent, "agent")
        if not queues:
            problems.add("queues", "must name at least one queue")
        for q in queues:
            problems.check(check_queue, q, "queues")
        problems.raise_first()
        token_id = "tk_" + secrets.token_hex(6)
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        async with connection(self.db) as conn, conn.transaction():
            await _claim_name(conn, agent, "agent")
            await SQL.add_token.execute(
                conn, id=token_id, agent=agent, queues=queues, token_hash=token_hash(secret), created_by=actor
            )
        return token_id, secret

    async def agent_for_hash(self, key: bytes) -> Agent | None:
        """The agent whose active token has SHA-256 `key` (dashboard/web/token_cache.py)."""
        row = await SQL.agent_for_token.fetchrow(self.db, token_hash=key)
        if row is None:
            return None
        return Agent(row["agent"], Scope(row["id"], tuple(row["queues"])))

    async def token_active(self, token_id: str) -> bool:
        return await SQL.token_active.fetchval(self.db, id=token_id)

    async def list_tokens(self) -> list[Token]:
        return [Token(**dict(r)) for r in await SQL.list_tokens.fetch(self.db)]

    async def revoke_token(self, token_id: str, *, actor: str) -> None:
        row = await SQL.revoke_token.fetchrow(self.db, id=token_id, actor=actor)
        if not row["found"]:
            raise NotFound(f"no token {token_id}")
        if not row["revoked"]:
            raise Conflict(f"token {token_id} is already revoked")

    # -- dashboard sessions (dashboard/web/sessions.py keeps the cookie) ----------------

    async def start_session(self, operator: str, max_age: int) -> str:
        """A new session for `operator`; returns its id, for the cookie only."""
        sid = secrets.token_urlsafe(32)
        await SQL.start_session.execute(self.db, id_hash=token_hash(sid), operator=operator, max_age=max_age)
        return sid

    async def session(self, sid: str) -> tuple[Operator, tuple[str, str] | None] | None:
        """The operator behind a live session, and the flash message waiting for it."""
        row = await SQL.session_operator.fetchrow(self.db, id_hash=token_hash(sid))
        if row is None:
            return None
        return Operator(row["name"], row["role"]), tuple(row["flash"]) if row["flash"] else None

    async def set_flash(self, sid: str, flash: tuple[str, str] | None) -> None:
        await SQL.set_flash.execute(self.db, id_hash=token_hash(sid), flash=list(flash) if flash else None)

    async def end_session(self, sid: str) -> None:
        """Logout; the session's open pages stop their stream, in every process (a hint)."""
        await SQL.end_session.execute(self.db, id_hash=token_hash(sid))

    async def session_left(self, sid: str) -> float | None:
        """Seconds until session `sid` expires; None once it ended or expired."""
        return await SQL.session_left.fetchval(self.db, id_hash=token_hash(sid))

    # -- shared secrets ----------------------------------------------------------------

    async def secret(self, name: str, size: int = 32) -> bytes:
        """A random secret shared by every process (made by whichever asks first)."""
        return await SQL.secret.fetchval(self.db, name=name, value=secrets.token_bytes(size))
