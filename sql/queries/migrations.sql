-- The migrator's own bookkeeping (dashboard/migrate.py). :key is the advisory lock every
-- switchboard process takes around start-up migrations.

-- name: lock
SELECT pg_advisory_lock(:key);

-- name: unlock
SELECT pg_advisory_unlock(:key);

-- name: create_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: recorded
SELECT version, name, checksum FROM schema_migrations;

-- name: record
INSERT INTO schema_migrations (version, name, checksum) VALUES (:version, :name, :checksum);
