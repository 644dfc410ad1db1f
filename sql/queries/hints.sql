-- Hints on channel 'switchboard' (dashboard/notify.py). The process that committed a
-- change sends them afterwards, on its LISTEN connection, so no producer's or agent's
-- commit takes the NOTIFY lock.

-- name: send
-- One hint per queue in :queues: '{"queue": …}'.
SELECT pg_notify('switchboard', json_build_object('queue', q)::text) FROM unnest(:queues::text[]) AS q;
