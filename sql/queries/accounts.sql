-- Operators, API tokens and the secrets every web process shares (dashboard/accounts.py).

-- name: add_operator
INSERT INTO operators (name, role, password_hash) VALUES (:name, :role, :password_hash);

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

-- name: agent_for_token
-- The agent behind a bearer token: looked up by the secret's SHA-256, never the secret.
SELECT id, agent, queues FROM api_tokens WHERE token_hash = :token_hash AND revoked_at IS NULL;

-- name: list_tokens
-- Active tokens first, newest first.
SELECT id, agent, queues, created_at, created_by, revoked_at, revoked_by
FROM api_tokens ORDER BY revoked_at IS NOT NULL, created_at DESC;

-- name: revoke_token
-- Revoke token :id; returns whether it existed and whether this call revoked it.
WITH revoked AS (
    UPDATE api_tokens SET revoked_at = now(), revoked_by = :actor
    WHERE id = :id AND revoked_at IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT FROM api_tokens WHERE id = :id) AS found,
       EXISTS (SELECT FROM revoked) AS revoked;

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
