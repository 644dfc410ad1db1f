-- Operators, API tokens and the secrets every web process shares (dashboard/accounts.py).

-- name: add_operator
-- Agent and operator names share one namespace: a name any token was ever made for is
-- taken (the caller holds the names lock, so the check and the insert do not race).
INSERT INTO operators (name, role, password_hash)
SELECT :name, :role, :password_hash
WHERE NOT EXISTS (SELECT FROM api_tokens WHERE agent = :name)
RETURNING name;

-- name: lock_names
-- Serialises the namespace checks of add_operator and add_token (until commit).
SELECT pg_advisory_xact_lock(hashtext('switchboard:names'));

-- name: set_password
-- A new password ends every session of the operator.
WITH changed AS (
    UPDATE operators SET password_hash = :password_hash WHERE name = :name RETURNING name
), ended AS (
    DELETE FROM operator_sessions WHERE operator IN (SELECT name FROM changed)
)
SELECT EXISTS (SELECT FROM changed);

-- name: rehash_password
-- The same password under current scrypt parameters (at a successful login); only if
-- the stored hash is still the one that was checked.
UPDATE operators SET password_hash = :password_hash WHERE name = :name AND password_hash = :old_hash;

-- name: remove_operator
-- Its sessions go with it (ON DELETE CASCADE).
DELETE FROM operators WHERE name = :name RETURNING name;

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
-- Refused (no row) when an operator has the agent's name: one namespace for both.
INSERT INTO api_tokens (id, agent, queues, token_hash, created_by)
SELECT :id, :agent, :queues, :token_hash, :created_by
WHERE NOT EXISTS (SELECT FROM operators WHERE name = :agent)
RETURNING id;

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
DELETE FROM operator_sessions WHERE id_hash = :id_hash;

-- name: set_flash
-- :flash is [kind, message], or NULL once shown.
UPDATE operator_sessions SET flash = :flash WHERE id_hash = :id_hash;
