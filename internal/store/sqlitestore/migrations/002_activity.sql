-- 002_activity: activity-gated lease expiry (DESIGN T4). Additive only.
--
-- tasks.last_activity_at is the holder's last evidence of progress, kept
-- apart from last_heartbeat_at: a claim sets it to the claim time, and a
-- schema_version 2 lease heartbeat moves it forward to its activity_at (never
-- backwards). Release, fail and reclaim leave it as it is, as history of the
-- last run, until the next claim resets it. NULL for tasks never claimed
-- since this migration.
--
-- tasks.heartbeat_schema_version is the schema version (1 or 2) of the last
-- lease heartbeat the task received; 0 before the first. Like
-- last_activity_at it outlives the lease it was sent under.
ALTER TABLE tasks ADD COLUMN last_activity_at TEXT;
ALTER TABLE tasks ADD COLUMN heartbeat_schema_version INTEGER NOT NULL DEFAULT 0;

-- Lease heartbeats counted per host and schema version, for the "all hosts
-- emit v2" check before the v1 fallback is removed (DESIGN T4). A lease
-- heartbeat upserts the row of its holder's hostname in the transaction that
-- renews the lease: last_sent_at = the heartbeat's time (never moved
-- backwards), heartbeats + 1. The table holds one row per host and version,
-- so the listing by last_sent_at scans it without an index; an index would
-- only add a write to every heartbeat.
CREATE TABLE heartbeat_versions (
    hostname       TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    last_sent_at   TEXT    NOT NULL,
    heartbeats     INTEGER NOT NULL,
    PRIMARY KEY (hostname, schema_version)
) STRICT;
