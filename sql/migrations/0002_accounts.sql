-- 0002: who may use switchboard — operators in the browser, agents with API tokens —
-- and the secrets every web process shares (session and CSRF keys), so processes stay
-- stateless: any of them can serve any request.

CREATE TABLE operators (
    name          text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$'),
    role          text NOT NULL CHECK (role IN ('viewer', 'operator')),
    password_hash text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_login_at timestamptz
);

-- Only the token's SHA-256 is kept; the secret is shown once when it is made.
CREATE TABLE api_tokens (
    id         text PRIMARY KEY,
    agent      text NOT NULL CHECK (agent ~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,62}$'),
    queues     text[] NOT NULL CHECK (cardinality(queues) > 0),
    token_hash bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text NOT NULL,
    revoked_at timestamptz,
    revoked_by text
);

CREATE TABLE app_secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
