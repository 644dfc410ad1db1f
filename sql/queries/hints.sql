-- Hints on channel 'switchboard' (dashboard/notify.py). The process that committed a
-- change sends them afterwards, on its LISTEN connection, so no producer's or agent's
-- commit takes the NOTIFY lock.

-- name: send
-- One hint per queue in :queues, '{"queue": …}', and one per todo in :todos, '{"todo": …}'
-- (it finished while a waiter watched it: dashboard/agents.py).
SELECT pg_notify('switchboard', hint::text)
FROM (SELECT json_build_object('queue', q) FROM unnest(:queues::text[]) AS q
      UNION ALL
      SELECT json_build_object('todo', t) FROM unnest(:todos::text[]) AS t) AS hints (hint);
