-- 001_initial: process instances, the task outbox and sweeper status.
--
-- Every time is TEXT in one fixed-width UTC layout with millisecond precision
-- ("2006-01-02T15:04:05.000Z"), so comparing the strings compares the instants.

-- One row per process instance (DESIGN L1). Status is never stored: it is
-- computed at read time from last_heartbeat_at and liveness_interval_s.
-- alive_until (last_heartbeat_at + 3 × liveness_interval_s) is kept only so
-- SQL can filter and join on liveness with an index-friendly comparison.
CREATE TABLE processes (
    instance_id         TEXT    NOT NULL PRIMARY KEY,
    token_hash          TEXT    NOT NULL,
    process_kind        TEXT    NOT NULL,
    hostname            TEXT    NOT NULL,
    pid                 INTEGER NOT NULL,
    liveness_interval_s REAL    NOT NULL,
    started_at          TEXT    NOT NULL,
    last_heartbeat_at   TEXT    NOT NULL,
    alive_until         TEXT    NOT NULL,
    exited_at           TEXT,
    current_task_id     INTEGER,
    current_task_type   TEXT
) STRICT;

-- Newest-first listing, optionally filtered by kind or host (DESIGN L4).
CREATE INDEX processes_started_idx ON processes (started_at DESC, instance_id DESC);
CREATE INDEX processes_kind_started_idx ON processes (process_kind, started_at DESC, instance_id DESC);
CREATE INDEX processes_host_started_idx ON processes (hostname, started_at DESC, instance_id DESC);
-- Clearing current_task_* for reclaimed tasks.
CREATE INDEX processes_current_task_idx ON processes (current_task_id) WHERE current_task_id IS NOT NULL;

-- The task outbox with each task's current lease (DESIGN T1-T3).
CREATE TABLE tasks (
    task_id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_type         TEXT    NOT NULL,
    payload           TEXT    NOT NULL CHECK (json_valid(payload)),
    status            TEXT    NOT NULL CHECK (status IN ('scheduled', 'running', 'completed', 'dead_letter')),
    attempts          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    reclaims          INTEGER NOT NULL DEFAULT 0,
    max_reclaims      INTEGER NOT NULL,
    lease_timeout_ms  INTEGER NOT NULL DEFAULT 0, -- 0: the server's lease timeout applies
    lease_owner       TEXT,
    lease_epoch       INTEGER NOT NULL DEFAULT 0,
    lease_expires_at  TEXT,
    last_heartbeat_at TEXT,
    started_at        TEXT,
    run_after         TEXT    NOT NULL,
    created_at        TEXT    NOT NULL,
    updated_at        TEXT    NOT NULL,
    completed_at      TEXT,
    result            TEXT    CHECK (result IS NULL OR json_valid(result)),
    completed_by      TEXT,
    last_error        TEXT
) STRICT;

-- Claiming: the oldest scheduled task of a type whose run_after has passed.
CREATE INDEX tasks_claim_idx ON tasks (status, task_type, run_after, task_id);
-- Reclaiming: running tasks whose lease expired.
CREATE INDEX tasks_reclaim_idx ON tasks (status, lease_expires_at);
-- Reclaiming and pruning: tasks held by an instance.
CREATE INDEX tasks_lease_owner_idx ON tasks (lease_owner);

-- Status of the server's background loops (list_agents / agent_status).
CREATE TABLE sweepers (
    name                 TEXT    NOT NULL PRIMARY KEY,
    interval_s           REAL    NOT NULL,
    last_run_at          TEXT,
    last_result_count    INTEGER NOT NULL DEFAULT 0,
    last_run_duration_ms REAL    NOT NULL DEFAULT 0,
    last_error           TEXT
) STRICT;
