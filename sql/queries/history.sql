-- The history's daily partitions (migration 0015; dashboard/history_partitions.py).

-- name: lock_timeout
-- How long, at most, each DDL step of this transaction waits for its lock.
SELECT set_config('lock_timeout', :timeout, true);

-- name: maintain
-- Partitions made :ahead days past today (UTC), and those whose day ended more than
-- :keep seconds ago dropped: what was done, one row each.
SELECT partition, action FROM todo_history_maintain(:ahead, now() - make_interval(secs => :keep));

