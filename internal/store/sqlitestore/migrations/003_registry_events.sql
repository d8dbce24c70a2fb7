-- 003_registry_events: the agent registry, process events and planned stop
-- markers (DESIGN R1, E1, E2). Additive only.

-- One record per named agent (DESIGN R1): durable intent, never inferred
-- from a live process. Registering a name again replaces its record
-- (created_at, status and config reset); version grows with every write so
-- that an update can compare-and-swap on the version it read. config is
-- the caller's opaque JSON, stored exactly as given; NULL when none was.
-- stopped_at is set while status is stopped.
CREATE TABLE agents (
    name       TEXT    NOT NULL PRIMARY KEY,
    function   TEXT    NOT NULL,
    tick_cron  TEXT    NOT NULL,
    config     TEXT    CHECK (config IS NULL OR json_valid(config)),
    status     TEXT    NOT NULL CHECK (status IN ('active', 'stopped')),
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL,
    stopped_at TEXT,
    version    INTEGER NOT NULL
) STRICT;

-- Listing oldest first (created_at, then name).
CREATE INDEX agents_created_idx ON agents (created_at, name);

-- Durable records of unexpected exits, stall kills and launch failures
-- (DESIGN E1), newest first by event_id; ids are never reused. An event is
-- delivered once delivered_at and delivery_kind are set, both together: by
-- a consumer's acknowledgement, or at write time ('suppressed') when a
-- planned stop covered it (DESIGN E2). agent is not a foreign key: events
-- outlive the registry record they were written for.
CREATE TABLE process_events (
    event_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    agent           TEXT    NOT NULL,
    kind            TEXT    NOT NULL
        CHECK (kind IN ('exit', 'stall_kill', 'launch_failure', 'flapping', 'startup_timeout')),
    at              TEXT    NOT NULL,
    exit_code       INTEGER,
    signal          TEXT    NOT NULL,
    run_duration_ms INTEGER NOT NULL,
    stderr_tail     TEXT    NOT NULL,
    detail          TEXT    CHECK (detail IS NULL OR json_valid(detail)),
    delivered_at    TEXT,
    delivery_kind   TEXT,
    CHECK ((delivered_at IS NULL) = (delivery_kind IS NULL))
) STRICT;

-- Newest-first listing of one agent's events.
CREATE INDEX process_events_agent_idx ON process_events (agent, event_id DESC);
-- Newest-first listing of the events no consumer has dealt with yet.
CREATE INDEX process_events_undelivered_idx ON process_events (event_id DESC) WHERE delivered_at IS NULL;

-- At most one planned stop marker per agent (DESIGN E2): an operator is
-- stopping the agent on purpose, so its exits between created_at and
-- expires_at are written already delivered. Writing a marker replaces the
-- agent's earlier one.
CREATE TABLE planned_stops (
    agent      TEXT NOT NULL PRIMARY KEY,
    reason     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
) STRICT;
