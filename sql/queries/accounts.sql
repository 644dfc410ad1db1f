-- Operators, API tokens and the secrets every web process shares (dashboard/accounts.py).

-- name: add_operator
INSERT INTO operators (name, role, password_hash) VALUES (:name, :role, :password_hash);

-- name: lock_names
-- Serialises the namespace checks of add_operator and add_token (until commit).
SELECT pg_advisory_xact_lock(hashtext('switchboard:names'));

-- name: name_holder
-- Agent and operator names share one namespace, compared ignoring case ("Olga" would pass
-- for "olga" on a page): who holds :name or a name that differs from it only by case (an
-- operator, or any token ever made), as held, the very name first. The caller holds the
-- names lock.
SELECT kind, name FROM (
    SELECT 'operator' AS kind, name FROM operators WHERE lower(name) = lower(:name)
    UNION ALL
    SELECT 'agent', agent FROM api_tokens WHERE lower(agent) = lower(:name)
) AS holders
ORDER BY name = :name DESC
LIMIT 1;

-- name: set_password
-- A new password ends every session of the operator, each hinted (as at end_session).
WITH changed AS (
    UPDATE operators SET password_hash = :password_hash WHERE name = :name RETURNING name
), ended AS (
    DELETE FROM operator_sessions WHERE operator IN (SELECT name FROM changed) RETURNING id_hash
)
SELECT EXISTS (SELECT FROM changed),
       (SELECT count(pg_notify('switchboard', json_build_object('session_ended', encode(id_hash, 'hex'))::text)) FROM ended);

-- name: rehash_password
-- The same password under current scrypt parameters (at a successful login); only if
-- the stored hash is still the one that was checked.
UPDATE operators SET password_hash = :password_hash WHERE name = :name AND password_hash = :old_hash;

-- name: remove_operator
-- Its sessions go with it, each hinted (as at end_session); the cascade finds them gone.
WITH ended AS (
    DELETE FROM operator_sessions WHERE operator = :name RETURNING id_hash
), removed AS (
    DELETE FROM operators WHERE name = :name RETURNING name
)
SELECT name, (SELECT count(pg_notify('switchboard', json_build_object('session_ended', encode(id_hash, 'hex'))::text)) FROM ended)
FROM removed;

-- name: has_operators
SELECT EXISTS (SELECT FROM operators);

-- name: operator_login
-- What a login needs to check a password.
SELECT name, role, password_hash FROM operators WHERE name = :name;

-- name: note_login
UPDATE operators SET last_login_at = now() WHERE name = :name;

-- name: operator
SELECT name, role FROM operators WHERE name = :name;

-- name: add_token
INSERT INTO api_tokens (id, agent, queues, token_hash, created_by)
VALUES (:id, :agent, :queues, :token_hash, :created_by);

-- name: token_active
SELECT EXISTS (SELECT FROM api_tokens WHERE id = :id AND revoked_at IS NULL);

-- name: agent_for_token
-- The agent behind a bearer token: looked up by the secret's SHA-256, never the secret.
SELECT id, agent, queues FROM api_tokens WHERE token_hash = :token_hash AND revoked_at IS NULL;

-- name: list_tokens
-- Active tokens first, newest first.
SELECT id, agent, queues, created_at, created_by, revoked_at, revoked_by
FROM api_tokens ORDER BY revoked_at IS NOT NULL, created_at DESC;

-- name: revoke_token
-- Revoke token :id; returns whether it existed and whether this call revoked it. The
-- hint tells every web process to end the token's waiting claims and open channels
-- (dashboard/notify.py); revocations are rare, so the commit-time NOTIFY lock is no cost.
WITH revoked AS (
    UPDATE api_tokens SET revoked_at = now(), revoked_by = :actor
    WHERE id = :id AND revoked_at IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT FROM api_tokens WHERE id = :id) AS found,
       EXISTS (SELECT FROM revoked) AS revoked,
       (SELECT pg_notify('switchboard', json_build_object('revoked', id)::text) FROM revoked);

-- name: secret
-- A random secret shared by every process: the first to ask stores :value, everyone
-- (that one included) gets what is stored.
WITH inserted AS (
    INSERT INTO app_secrets (name, value) VALUES (:name, :value)
    ON CONFLICT (name) DO NOTHING
    RETURNING value
)
SELECT value FROM inserted
UNION ALL
SELECT value FROM app_secrets WHERE name = :name
LIMIT 1;

-- name: start_session
-- A new session for :operator; expired ones are swept on the way (logins are rare).
WITH swept AS (DELETE FROM operator_sessions WHERE expires_at < now())
INSERT INTO operator_sessions (id_hash, operator, expires_at)
VALUES (:id_hash, :operator, now() + make_interval(secs => :max_age));

-- name: session_operator
-- The operator behind a session cookie, and the flash message waiting for it, if any.
SELECT o.name, o.role, s.flash
FROM operator_sessions s JOIN operators o ON o.name = s.operator
WHERE s.id_hash = :id_hash AND s.expires_at > now();

-- name: end_session
-- The hint ({"session_ended": …}) tells every web process to end the streams of the
-- session's open pages (dashboard/notify.py); logouts are rare, so the commit-time NOTIFY
-- lock is no cost.
WITH ended AS (DELETE FROM operator_sessions WHERE id_hash = :id_hash RETURNING id_hash)
SELECT pg_notify('switchboard', json_build_object('session_ended', encode(id_hash, 'hex'))::text) FROM ended;

-- name: session_left
-- Seconds until session :id_hash expires; no row once it ended or expired.
SELECT extract(epoch FROM expires_at - now())::float8
FROM operator_sessions WHERE id_hash = :id_hash AND expires_at > now();

-- name: set_flash
-- :flash is [kind, message], or NULL once shown.
UPDATE operator_sessions SET flash = :flash WHERE id_hash = :id_hash;
