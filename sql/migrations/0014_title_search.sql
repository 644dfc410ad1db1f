-- 0014: title search through an index (issue 25, item 7; README "Security decisions").
-- A search without '=' (sql/queries/reads.sql, list_todos and matching_ids) matches an id, an
-- idempotency key, or the title by ILIKE '%words%', which no btree answers: it walked the
-- whole queue (1.1 s at 200,000 todos), and twelve at once from one viewer held other
-- agents' heartbeats up by seconds. A trigram index (pg_trgm's gin_trgm_ops) answers ILIKE
-- with a pattern of three characters or more, and `=` too (pg_trgm 1.6, PostgreSQL 14 and
-- newer), so the idempotency key is in it beside the title: the search's three matches
-- become one bitmap OR of the primary key and this index. Reads makes a search of one or
-- two characters a prefix of the title ('ab%'), which the index also answers.
--
-- What it costs the hot path: every claim and completion rewrites the row outside HOT
-- (state is in other indexes' predicates), so it inserts the title's trigrams here too;
-- GIN's pending list (fastupdate, the default) batches those inserts.
-- bench/title_search_cost.py measures claim + complete (and enqueue) with and without it,
-- side by side; its figures are in bench/README.md ("title_search_cost.py").
--
-- pg_trgm is a contrib extension, trusted since PostgreSQL 13 (a user with CREATE on the
-- database may install it). Where it cannot be installed (the contrib package missing, or
-- no such right), this migration says so in a WARNING and leaves title search unindexed:
-- such a search then reads the queue, stopped by the read's statement timeout
-- (Reads.READ_TIMEOUT) and bounded per caller (dashboard/web/searches.py). Install it later
-- (CREATE EXTENSION pg_trgm, as a superuser) and build the index below by hand.
--
-- A plain CREATE INDEX, since migrations run in a transaction: on a big table, build it
-- beforehand with CREATE INDEX CONCURRENTLY IF NOT EXISTS and this name and definition.
DO $$
DECLARE
    home name;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
    EXCEPTION WHEN undefined_file OR insufficient_privilege OR feature_not_supported THEN
        RAISE WARNING 'pg_trgm is not available (%): title search stays unindexed; see 0014_title_search.sql',
            SQLERRM;
        RETURN;
    END;
    SELECT n.nspname INTO home
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'pg_trgm';
    EXECUTE format(
        'CREATE INDEX IF NOT EXISTS todos_text_search ON todos '
        'USING gin (title %1$I.gin_trgm_ops, idempotency_key %1$I.gin_trgm_ops)',
        home
    );
END
$$;
