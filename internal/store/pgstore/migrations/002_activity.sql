-- 002_activity: activity-gated lease expiry (DESIGN T4). Additive only.
--
-- The same version and name as sqlitestore's 002_activity, in PostgreSQL's
-- types (see 001_initial). Adding a column with a constant default changes
-- only the catalog, so this does not rewrite tasks.
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
ALTER TABLE tasks
    ADD COLUMN last_activity_at         timestamptz,
    ADD COLUMN heartbeat_schema_version bigint NOT NULL DEFAULT 0;

-- Lease heartbeats counted per host and schema version, for the "all hosts
-- emit v2" check before the v1 fallback is removed (DESIGN T4). A lease
-- heartbeat upserts the row of its holder's hostname in the transaction that
-- renews the lease: last_sent_at = the heartbeat's time (never moved
-- backwards), heartbeats + 1. The table holds one row per host and version,
-- so the listing by last_sent_at scans it without an index; an index would
-- only add a write to every heartbeat. hostname is listed in byte order
-- (COLLATE "C"), as SQLite orders it.
CREATE TABLE heartbeat_versions (
    hostname       text COLLATE "C" NOT NULL,
    schema_version bigint           NOT NULL,
    last_sent_at   timestamptz      NOT NULL,
    heartbeats     bigint           NOT NULL,
    PRIMARY KEY (hostname, schema_version)
);
