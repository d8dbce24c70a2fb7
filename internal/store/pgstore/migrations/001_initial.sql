-- 001_initial: process instances, the task outbox and sweeper status.
--
-- The same version and name as sqlitestore's 001_initial, in PostgreSQL's
-- types: every time is timestamptz (the store writes only whole
-- milliseconds), integers are bigint (SQLite's INTEGER is 64-bit), REAL is
-- double precision, and JSON documents are json, which validates them and
-- keeps their text exactly as given, as SQLite does. Text that listings
-- order by (instance_id, sweeper name) is COLLATE "C": byte order, as
-- SQLite's BINARY, whatever the database's default collation.

-- One row per process instance (DESIGN L1). Status is never stored: it is
-- computed at read time from last_heartbeat_at and liveness_interval_s.
-- alive_until (last_heartbeat_at + 3 × liveness_interval_s) is kept only so
-- SQL can filter and join on liveness with an index-friendly comparison.
CREATE TABLE processes (
    instance_id         text COLLATE "C" NOT NULL PRIMARY KEY,
    token_hash          text             NOT NULL,
    process_kind        text             NOT NULL,
    hostname            text             NOT NULL,
    pid                 bigint           NOT NULL,
    liveness_interval_s double precision NOT NULL,
    started_at          timestamptz      NOT NULL,
    last_heartbeat_at   timestamptz      NOT NULL,
    alive_until         timestamptz      NOT NULL,
    exited_at           timestamptz,
    current_task_id     bigint,
    current_task_type   text
);

-- Newest-first listing, optionally filtered by kind or host (DESIGN L4).
CREATE INDEX processes_started_idx ON processes (started_at DESC, instance_id DESC);
CREATE INDEX processes_kind_started_idx ON processes (process_kind, started_at DESC, instance_id DESC);
CREATE INDEX processes_host_started_idx ON processes (hostname, started_at DESC, instance_id DESC);
-- Clearing current_task_* for reclaimed tasks.
CREATE INDEX processes_current_task_idx ON processes (current_task_id) WHERE current_task_id IS NOT NULL;

-- The task outbox with each task's current lease (DESIGN T1-T3). Task ids
-- are never reused, like SQLite's AUTOINCREMENT.
CREATE TABLE tasks (
    task_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_type         text        NOT NULL,
    payload           json        NOT NULL,
    status            text        NOT NULL CHECK (status IN ('scheduled', 'running', 'completed', 'dead_letter')),
    attempts          bigint      NOT NULL DEFAULT 0,
    max_attempts      bigint      NOT NULL,
    reclaims          bigint      NOT NULL DEFAULT 0,
    max_reclaims      bigint      NOT NULL,
    lease_timeout_ms  bigint      NOT NULL DEFAULT 0, -- 0: the server's lease timeout applies
    lease_owner       text,
    lease_epoch       bigint      NOT NULL DEFAULT 0,
    lease_expires_at  timestamptz,
    last_heartbeat_at timestamptz,
    started_at        timestamptz,
    run_after         timestamptz NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    completed_at      timestamptz,
    result            json,
    completed_by      text,
    last_error        text
);

-- Claiming: the oldest scheduled task of a type whose run_after has passed.
CREATE INDEX tasks_claim_idx ON tasks (status, task_type, run_after, task_id);
-- Reclaiming: running tasks whose lease expired.
CREATE INDEX tasks_reclaim_idx ON tasks (status, lease_expires_at);
-- Reclaiming and pruning: tasks held by an instance.
CREATE INDEX tasks_lease_owner_idx ON tasks (lease_owner);

-- Status of the server's background loops (list_agents / agent_status).
CREATE TABLE sweepers (
    name                 text COLLATE "C" NOT NULL PRIMARY KEY,
    interval_s           double precision NOT NULL,
    last_run_at          timestamptz,
    last_result_count    bigint           NOT NULL DEFAULT 0,
    last_run_duration_ms double precision NOT NULL DEFAULT 0,
    last_error           text
);
