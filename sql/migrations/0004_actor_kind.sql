-- 0004: history says what kind of actor moved a todo, apart from its name (DESIGN.md,
-- "Actors"). Until now `actor` was one free string — "operator:NAME" from the dashboard,
-- "agent:NAME" on an agent's create, the bare owner on claims and acks, 'reaper',
-- 'producer', 'cli' — so an agent whose name was "operator:admin" wrote rows that read
-- exactly like an operator's. From here on `actor` is the bare name and `actor_kind` the
-- kind, which each statement in sql/queries/transitions.sql writes itself.
--
-- The column comes with a default so adding it rewrites nothing; the backfill then
-- touches only the rows whose kind is not 'agent' or whose name loses a prefix (the
-- claims, heartbeats and acks, most of the table, already read right), and the default
-- goes: every insert must say its kind.
ALTER TABLE todo_history
    ADD COLUMN actor_kind text NOT NULL DEFAULT 'agent'
        CONSTRAINT actor_kind_known CHECK (actor_kind IN ('agent', 'operator', 'producer', 'system'));

-- Old rows are classified by the transition they record as well as the string, so a
-- prefix only counts where that kind of actor could have written the row:
--   a create (from_state NULL, or a collapsed duplicate: from = to with that note):
--     "operator:X" → operator X (dashboard), "agent:X" → agent X (API), any other name →
--     a producer (Store callers: 'producer', 'cli', …), name unchanged;
--   a retry (failed → pending; only operators retry): operator, "operator:" dropped;
--   a force-release (claimed → pending with force_release's note) by "operator:X":
--     operator X;
--   the reaper's own rows ('reaper' on a lapsed lease or a due retry): system reaper;
--   everything else (claims, heartbeats, releases, completions, failures — an agent's
--   bare owner name, whatever it looks like): agent, name unchanged.
-- Left ambiguous: a failure by an agent named "operator:X" whose error text copies the
-- force-release note is indistinguishable from a force-release and becomes operator X.
UPDATE todo_history h
SET actor_kind = c.kind,
    actor = CASE WHEN c.kind = 'operator' OR (c.kind = 'agent' AND c.is_create)
                 THEN regexp_replace(h.actor, '^' || c.kind || ':', '')
                 ELSE h.actor END
FROM (
    SELECT id, is_create,
           CASE
               WHEN is_create AND actor LIKE 'operator:%' THEN 'operator'
               WHEN is_create AND actor LIKE 'agent:%' THEN 'agent'
               WHEN is_create THEN 'producer'
               WHEN from_state = 'failed' AND to_state = 'pending' THEN 'operator'
               WHEN actor LIKE 'operator:%' AND from_state = 'claimed' AND to_state = 'pending'
                    AND note LIKE 'lease force-released (was held by %)' THEN 'operator'
               WHEN actor = 'reaper'
                    AND ((from_state = 'claimed' AND note LIKE 'lease expired (owner %)')
                         OR (from_state = 'pending' AND to_state = 'pending' AND note = 'retry due'))
                    THEN 'system'
               ELSE 'agent'
           END AS kind
    FROM (
        SELECT id, actor, from_state, to_state, note,
               from_state IS NULL
               OR (from_state = to_state AND note = 'duplicate delivery collapsed') AS is_create
        FROM todo_history
    ) AS rows
) AS c
WHERE h.id = c.id
  AND (c.kind <> 'agent' OR (c.is_create AND h.actor LIKE 'agent:%'));

ALTER TABLE todo_history ALTER COLUMN actor_kind DROP DEFAULT;
