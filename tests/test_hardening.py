"""The security review's findings, each as a regression test (issue 9): logins that cannot
stall the server, sessions and tokens that end, cookies fit for HTTPS, CSRF bound to the
session, and the small items (scope 404, anchored exclusions, odd paths, no-store pages)."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import time

import httpx

from dashboard.accounts import SCRYPT, Accounts
from dashboard.config import BadSetting, Settings
from dashboard.errors import Conflict
from dashboard.web.app import load_config
from dashboard.web.limits import LOGINS_AT_ONCE, PER_ADDRESS
from tests.conftest import in_process
from tests.factories import agent_token, enqueue, login, snapshot, unique
from tests.web_helpers import post

API = "/api/v1"


async def _login_form(client, name: str, password: str):
    await client.get("/login")
    return await client.post(
        "/login",
        data={"name": name, "password": password, "_csrf_token": client.cookies.get("csrftoken")},
        follow_redirects=False,
    )


# -- logins that cannot stall the server ---------------------------------------------------


async def test_clients_guessing_passwords_leave_heartbeats_within_twice_their_unloaded_time(
    live_server, live_conn, live_store
):
    base, _ = live_server
    queue = unique("hb")
    await Accounts(live_conn).add_operator(unique("olga"), "operator")
    _, secret = await Accounts(live_conn).add_token(unique("bot"), [queue])
    headers = {"Authorization": f"Bearer {secret}"}
    await enqueue(live_store, queue)
    async with httpx.AsyncClient(base_url=base, timeout=30) as agent:
        held = (
            await agent.post(f"{API}/claims", headers=headers, json={"queues": [queue], "ttl": 60})
        ).json()

        async def heartbeats(n: int) -> list[float]:
            times = []
            for _ in range(n):
                started = time.perf_counter()
                beat = await agent.post(
                    f"{API}/todos/{held['id']}/heartbeat",
                    headers=headers,
                    json={"lease": held["lease"], "ttl": 60},
                )
                assert beat.status_code == 200, beat.text
                times.append(time.perf_counter() - started)
            return times

        unloaded = statistics.median(await heartbeats(100))
        stop, all_guessing = asyncio.Event(), asyncio.Event()
        guesses = 0

        async def guesser(i: int) -> None:
            # each from its own address (the test is a trusted proxy: 127.0.0.1), a new name each
            # time, as many as may wait for the hash at once: no limit stops them, so every
            # guess costs the server a hash
            nonlocal guesses
            async with httpx.AsyncClient(base_url=base, timeout=30) as browser:
                forwarded = {"X-Forwarded-For": f"198.51.100.{i + 1}"}
                await browser.get("/login", headers=forwarded)
                while not stop.is_set():
                    answer = await post(
                        browser,
                        "/login",
                        browser.cookies["csrftoken"],
                        {"name": f"guess{i}-{guesses}", "password": "wrong"},
                        headers=forwarded,
                    )
                    assert answer.status_code == 401, answer.text
                    guesses += 1
                    if guesses >= LOGINS_AT_ONCE:
                        all_guessing.set()

        guessers = [asyncio.create_task(guesser(i)) for i in range(LOGINS_AT_ONCE)]
        rounds = []
        try:
            await asyncio.wait_for(all_guessing.wait(), 30)
            # up to three rounds of 100: one burst from another process on this shared box
            # must not decide it; hashing on the event loop fails every round (~100 ms)
            while len(rounds) < 3 and (not rounds or rounds[-1] > 2 * unloaded + 0.001):
                rounds.append(statistics.median(await heartbeats(100)))
        finally:
            stop.set()
            await asyncio.gather(*guessers)
    loaded = rounds[-1]
    shown = ", ".join(f"{r * 1000:.2f}" for r in rounds)
    print(f"heartbeat median: unloaded {unloaded * 1000:.2f} ms, under {LOGINS_AT_ONCE} guessers {shown} ms")
    print(f"load average {os.getloadavg()}")
    # 1 ms for timer noise on a shared 2-core box; hashing on the event loop made it ~100 ms
    assert loaded <= 2 * unloaded + 0.001, (unloaded, loaded)


async def test_the_31st_failed_login_in_a_minute_from_one_address_is_429_with_retry_after(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    token = client.cookies["csrftoken"]
    allowed, _ = PER_ADDRESS
    names = [f"nobody{i}" for i in range(allowed)]  # other names: the per-name delay stays out of it
    for name in names:
        wrong = await post(client, "/login", token, {"name": name, "password": "x"})
        assert wrong.status_code == 401
    refused = await post(client, "/login", token, {"name": "olga", "password": password})
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "too many failed logins" in refused.text
    assert "session" not in client.cookies


async def test_failures_for_one_name_make_it_wait_longer_each_time_but_never_lock_it(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    token = client.cookies["csrftoken"]
    for _ in range(5):
        assert (await post(client, "/login", token, {"name": "olga", "password": "x"})).status_code == 401
    waiting = await post(client, "/login", token, {"name": "olga", "password": password})
    assert waiting.status_code == 429  # even the right password waits its turn
    wait = int(waiting.headers["retry-after"])
    assert 1 <= wait <= 2
    await asyncio.sleep(wait)
    assert (await post(client, "/login", token, {"name": "olga", "password": password})).status_code == 303


async def test_a_huge_login_form_is_refused_before_it_is_read(client):
    await client.get("/login")
    started = time.perf_counter()
    response = await client.post(
        "/login",
        content=b"name=" + b"a" * (7 * 1024 * 1024),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413
    assert time.perf_counter() - started < 0.5


async def test_passwords_use_current_scrypt_parameters_and_old_hashes_are_upgraded_at_login(client, pool):
    accounts = Accounts(pool)
    password = await accounts.add_operator("olga", "operator")
    stored = await pool.fetchval("SELECT password_hash FROM operators WHERE name = 'olga'")
    assert stored.startswith(f"scrypt${SCRYPT['n']}$8$1$") and SCRYPT["n"] == 2**17
    import base64
    import hashlib
    import secrets

    salt = secrets.token_bytes(16)
    old = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)
    legacy = f"scrypt$16384$8$1${base64.b64encode(salt).decode()}${base64.b64encode(old).decode()}"
    await pool.execute("UPDATE operators SET password_hash = $1 WHERE name = 'olga'", legacy)
    assert (await _login_form(client, "olga", password)).status_code == 303
    upgraded = await pool.fetchval("SELECT password_hash FROM operators WHERE name = 'olga'")
    assert upgraded.startswith("scrypt$131072$") and upgraded != legacy
    assert await accounts.login(await accounts.credentials("olga"), password) is not None


async def test_an_unknown_token_flood_from_one_address_gets_429_but_a_good_token_still_works(client, pool):
    good = await agent_token(pool, "bot", ["work"])
    for _ in range(PER_ADDRESS[0]):
        response = await client.get(f"{API}/todos", headers={"Authorization": "Bearer sbt_wrong"})
        assert response.status_code == 401
    refused = await client.get(f"{API}/todos", headers={"Authorization": "Bearer sbt_wrong"})
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert (await client.get(f"{API}/todos", headers=good)).status_code == 200


# -- sessions that end -----------------------------------------------------------------------


async def test_a_cookie_kept_from_before_logout_opens_nothing_afterwards(client, pool):
    csrf = await login(client, pool)
    kept = dict(client.cookies)
    assert (await client.get("/", follow_redirects=False)).status_code == 200
    assert (await post(client, "/logout", csrf)).status_code == 303
    client.cookies.clear()
    client.cookies.update(kept)  # another browser, with the cookie saved before
    response = await client.get("/", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/"


async def _two_logins(client, pool, first: tuple[str, str], second: tuple[str, str]) -> tuple[dict, dict]:
    """Two browsers' cookies (one client, its jar swapped): each logged in as one operator."""
    jars = []
    for name, role in (first, second):
        client.cookies.clear()
        jars.append((await login(client, pool, name, role=role), dict(client.cookies)))
    return jars[0], jars[1]


async def _opens(client, jar: dict) -> bool:
    client.cookies.clear()
    client.cookies.update(jar)
    return (await client.get("/", follow_redirects=False)).status_code == 200


async def test_a_new_password_and_removal_end_every_session_of_the_operator(client, pool):
    accounts = Accounts(pool)
    (_, olga), (_, vera) = await _two_logins(client, pool, ("olga", "operator"), ("vera", "viewer"))
    assert await _opens(client, olga) and await _opens(client, vera)
    await accounts.set_password("olga")
    assert not await _opens(client, olga)
    assert await _opens(client, vera)  # only olga's ended
    await accounts.remove_operator("vera")
    assert not await _opens(client, vera)
    assert (
        await pool.fetchval("SELECT count(*) FROM operator_sessions WHERE operator IN ('olga', 'vera')") == 0
    )


async def test_the_session_cookie_holds_only_a_random_id(client, pool):
    await login(client, pool, "olga@ops")  # "@" is not base64url: no random id holds the name by chance
    sid = client.cookies["session"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{40,}", sid) and "olga@ops" not in sid
    stored = await pool.fetchval("SELECT id_hash FROM operator_sessions")
    assert stored != sid.encode() and len(stored) == 32  # its SHA-256, not the id


# -- CSRF bound to the session ---------------------------------------------------------------


async def test_a_csrf_token_from_another_session_is_refused_with_the_admins_cookie(
    client_without_reaper, pool, store
):
    client = client_without_reaper  # no rollup job writing into the tables compared
    (admin_token, admin), (attacker_token, attacker) = await _two_logins(
        client, pool, ("admin", "operator"), ("mallory", "operator")
    )
    assert attacker_token != admin_token
    todo = await enqueue(store, "work")
    await store.fail(todo.id, "x", (await store.claim(todo.id, "x", 30)).lease_token, "boom")
    before = await snapshot(pool)
    # the attacker planted its own csrftoken cookie beside the admin's session cookie
    client.cookies.clear()
    client.cookies.update({**admin, "csrftoken": attacker["csrftoken"]})
    refused = await post(client, f"/todos/{todo.id}/retry", attacker_token)
    assert refused.status_code == 403
    assert await snapshot(pool) == before
    assert (await post(client, f"/todos/{todo.id}/retry", admin_token)).status_code != 403  # past CSRF


async def test_login_renews_the_csrf_token(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    before = client.cookies["csrftoken"]
    assert (await _login_form(client, "olga", password)).status_code == 303
    after = client.cookies["csrftoken"]
    assert after != before
    assert (await post(client, "/logout", before)).status_code == 403  # the old one is done
    assert (await post(client, "/logout", after)).status_code == 303


async def test_a_cross_site_post_is_refused_even_with_a_valid_token(client, pool):
    csrf = await login(client, pool)
    response = await post(client, "/logout", csrf, headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    assert (await client.get("/", follow_redirects=False)).status_code == 200


async def test_an_encoded_api_prefix_in_a_dashboard_path_does_not_skip_the_csrf_check(client, pool):
    await login(client, pool)
    response = await client.post("/todos/%2Fapi%2F/retry", follow_redirects=False)  # no token
    assert response.status_code in (403, 404)
    response = await client.post("/dead/retry?x=/api/", data={"ids": "td_x"}, follow_redirects=False)
    assert response.status_code == 403 and "CSRF" in response.text


# -- secrets from the environment ----------------------------------------------------------


async def test_the_secret_key_comes_from_the_environment_and_the_old_one_still_verifies(dsn, pool):
    from dashboard import db as dbmod
    from dashboard.web.app import create_app

    database = dbmod.Database(dsn=dsn, pool=pool)
    old, new = "o" * 40, "n" * 40
    config_old = await load_config(database, Settings(secret_key=old))
    config_rotated = await load_config(database, Settings(secret_key=new, secret_key_old=old))
    config_new_only = await load_config(database, Settings(secret_key=new))
    assert config_rotated.csrf_keys == (config_new_only.csrf_keys[0], config_old.csrf_keys[0])
    async with in_process(create_app(dsn, config_old, reaper=False)) as client:
        csrf = await login(client, pool)
        cookies = dict(client.cookies)
    for config, accepted in ((config_rotated, 303), (config_new_only, 403)):
        async with in_process(create_app(dsn, config, reaper=False)) as client:
            client.cookies.update(cookies)
            assert (await post(client, "/logout", csrf)).status_code == accepted
    for env in ({"SWITCHBOARD_SECRET_KEY": "short"}, {"SWITCHBOARD_PUBLIC_URL": "queue.example.com"}):
        try:
            Settings.from_environ(env)
        except BadSetting as exc:
            assert next(iter(env)) in str(exc)
        else:
            raise AssertionError(f"{env} was accepted")


# -- HTTPS --------------------------------------------------------------------------------------


async def test_over_https_cookies_are_secure_host_prefixed_and_hsts_is_sent(app, pool):
    from litestar.testing import AsyncTestClient

    password = await Accounts(pool).add_operator("olga", "operator")
    async with AsyncTestClient(app, base_url="https://switchboard.example") as client:
        page = await client.get("/login")
        assert page.headers["strict-transport-security"] == "max-age=31536000"
        csrf = page.headers["set-cookie"]
        assert csrf.startswith("__Host-csrftoken=") and "Secure" in csrf and "Path=/" in csrf
        answer = await client.post(
            "/login",
            data={"name": "olga", "password": password, "_csrf_token": client.cookies["__Host-csrftoken"]},
            follow_redirects=False,
        )
        assert answer.status_code == 303
        cookies = answer.headers.get_list("set-cookie")
        assert any(c.startswith("__Host-session=") and "Secure" in c and "HttpOnly" in c for c in cookies)
        assert (await client.get("/", follow_redirects=False)).status_code == 200
    async with AsyncTestClient(app, base_url="http://switchboard.example") as plain:
        answer = await plain.get("/login")
        assert "strict-transport-security" not in answer.headers
        assert (
            answer.headers["set-cookie"].startswith("csrftoken=")
            and "Secure" not in answer.headers["set-cookie"]
        )


# -- tokens: revocation, scope, namespace -------------------------------------------------------


async def test_revoking_a_token_ends_its_waiting_claim_with_401_and_claims_nothing(
    live_server, live_conn, live_store
):
    base, _ = live_server
    queue = unique("revoke")
    accounts = Accounts(live_conn)
    token_id, secret = await accounts.add_token(unique("bot"), [queue])
    async with httpx.AsyncClient(base_url=base, timeout=30) as agent:
        waiting = asyncio.create_task(
            agent.post(
                f"{API}/claims",
                headers={"Authorization": f"Bearer {secret}"},
                json={"queues": [queue], "ttl": 30, "wait": 20},
            )
        )
        await asyncio.sleep(0.5)  # the claim is waiting (nothing to see from outside until it answers)
        assert not waiting.done()
        started = time.perf_counter()
        await accounts.revoke_token(token_id, actor="test")
        await enqueue(live_store, queue)  # the hint that would have woken it, too
        response = await asyncio.wait_for(waiting, 5)
    assert response.status_code == 401, response.text
    assert time.perf_counter() - started < 1.0
    assert (
        await live_conn.fetchval("SELECT count(*) FROM todos WHERE queue = $1 AND state = 'claimed'", queue)
        == 0
    )


async def test_revoking_a_token_closes_its_open_channel_within_a_second(live_server, live_conn):
    base, _ = live_server
    queue = unique("revoke")
    accounts = Accounts(live_conn)
    token_id, secret = await accounts.add_token(unique("bot"), [queue])
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as agent,
        agent.stream(
            "GET", f"{API}/channels", params={"queues": queue}, headers={"Authorization": f"Bearer {secret}"}
        ) as stream,
    ):
        lines = stream.aiter_lines()
        assert (await anext(lines)).startswith("event: resync")
        started = time.perf_counter()
        await accounts.revoke_token(token_id, actor="test")

        async def drain() -> None:
            async for _ in lines:
                pass

        await asyncio.wait_for(drain(), 2)
        assert time.perf_counter() - started < 1.0


async def test_a_todo_outside_the_tokens_queues_is_404_and_its_queue_unnamed(client, pool, store):
    headers = await agent_token(pool, "bot", ["work"])
    hidden = await enqueue(store, "payroll")
    response = await client.get(f"{API}/todos/{hidden.id}", headers=headers)
    assert response.status_code == 404
    assert "payroll" not in response.text and response.json()["detail"] == f"no todo {hidden.id}"


async def test_agent_and_operator_names_are_one_namespace_and_agents_take_no_colon(pool):
    accounts = Accounts(pool)
    await accounts.add_operator("olga", "operator")
    await accounts.add_token("mailer", ["work"])
    for attempt in (accounts.add_token("olga", ["work"]), accounts.add_operator("mailer", "viewer")):
        try:
            await attempt
        except Conflict as exc:
            assert "namespace" in str(exc)
        else:
            raise AssertionError("a name was taken twice")
    try:
        await accounts.add_token("operator:admin", ["work"])
    except Exception as exc:  # InvalidInput
        assert "agent" in str(exc)
    else:
        raise AssertionError("an agent name with ':' was accepted")


# -- small items ------------------------------------------------------------------------------


async def test_odd_static_paths_and_crlf_in_paths_are_not_server_errors(client):
    for path in ("/static/app.js%00.css", "/static/%00", "/static/..%2f..%2fetc%2fpasswd"):
        assert (await client.get(path)).status_code in (400, 404), path
    response = await client.get("/queues/a%0d%0aSet-Cookie:%20x=1", follow_redirects=False)
    assert response.status_code in (303, 503)
    if response.status_code == 303:
        location = response.headers["location"]
        assert "\r" not in location and "\n" not in location and "%0D%0A" in location


async def test_pages_that_carry_secrets_are_not_cached_and_viewers_cannot_see_tokens(client, pool):
    (_, vera), _ = await _two_logins(client, pool, ("vera", "viewer"), ("olga", "operator"))
    for path in ("/tokens", "/login"):
        assert (await client.get(path)).headers["cache-control"] == "no-store", path
    made = await post(client, "/tokens", client.cookies["csrftoken"], {"agent": "bot", "queues": "work"})
    assert made.status_code == 200 and "sbt_" in made.text
    assert made.headers["cache-control"] == "no-store"
    assert await _opens(client, vera)
    assert (await client.get("/tokens")).status_code == 403
    assert 'href="/tokens"' not in (await client.get("/")).text
