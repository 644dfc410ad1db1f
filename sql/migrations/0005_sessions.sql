-- 0005: dashboard sessions kept on the server, so logging out, a password change or
-- removing an operator ends them in every process at once (a signed cookie cannot be
-- taken back). The cookie holds a random id; only its SHA-256 is stored. The flash
-- message a form post leaves for the next page lives here too.
CREATE TABLE operator_sessions (
    id_hash    bytea PRIMARY KEY,
    operator   text NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    flash      text[]
);
CREATE INDEX operator_sessions_operator ON operator_sessions (operator);

-- Agent names no longer take ':' (they read like "kind:name" actors). Existing tokens
-- keep working: the new rule is checked for new rows only.
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_agent_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_agent_check
    CHECK (agent ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$') NOT VALID;
