-- A person's inbox (dashboard/inbox.py): what an operator holds and what is assigned to
-- them. Reads only; the inbox's actions are the transitions in transitions.sql.

-- name: inbox
-- The todos :name holds (claimed by them: todos_leases) and the pending todos assigned to
-- them (todos_inbox, by priority, then longest ready, as claims take them), up to :limit
-- of each; with who created each todo (its first history row) and, held, its lease's
-- time left and length (from its last claim or heartbeat).
WITH mine AS (
    (SELECT * FROM todos
     WHERE lease_expires_at IS NOT NULL AND owner = :name  -- claimed
     ORDER BY lease_expires_at
     LIMIT :limit)
    UNION ALL
    (SELECT * FROM todos
     WHERE state = 'pending' AND assignee = :name
     ORDER BY -priority, ready_at
     LIMIT :limit)
)
SELECT m.*, c.actor_kind AS created_by_kind, c.actor AS created_by, now() AS read_at,
       extract(epoch FROM m.lease_expires_at - now())::float8 AS seconds_left,
       extract(epoch FROM m.lease_expires_at - coalesce(m.heartbeat_at, m.claimed_at))::float8 AS ttl
FROM mine m
LEFT JOIN LATERAL (SELECT h.actor_kind, h.actor FROM todo_history h
                   WHERE h.todo_id = m.id ORDER BY h.id LIMIT 1) AS c ON true;

-- name: waiting_count
-- How many todos wait for :name (pending, assigned to them, ready now), counted up to
-- :limit: the menu's badge, on every page, stops there (todos_inbox, the index alone).
SELECT count(*)::int FROM (
    SELECT FROM todos
    WHERE state = 'pending' AND assignee = :name AND ready_at <= now()
    LIMIT :limit
) AS waiting;
