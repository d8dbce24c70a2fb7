-- 003_registry_events: the agent registry, process events and planned stop
-- markers (DESIGN R1, E1, E2). Additive only.
--
-- The same version and name as sqlitestore's 003_registry_events, in
-- PostgreSQL's types (see 001_initial). Agent names are COLLATE "C": byte
-- order, as SQLite's BINARY, in every table that keys or filters on them.

-- One record per named agent (DESIGN R1): durable intent, never inferred
-- from a live process. Registering a name again replaces its record
-- (created_at, status and config reset); version grows with every write so
-- that an update can compare-and-swap on the version it read. config is
-- the caller's opaque JSON, stored exactly as given; NULL when none was.
-- stopped_at is set while status is stopped.
CREATE TABLE agents (
    name       text COLLATE "C" NOT NULL PRIMARY KEY,
    function   text             NOT NULL,
    tick_cron  text             NOT NULL,
    config     json,
    status     text             NOT NULL CHECK (status IN ('active', 'stopped')),
    created_at timestamptz      NOT NULL,
    updated_at timestamptz      NOT NULL,
    stopped_at timestamptz,
    version    bigint           NOT NULL
);

-- Listing oldest first (created_at, then name).
CREATE INDEX agents_created_idx ON agents (created_at, name);

-- Durable records of unexpected exits, stall kills and launch failures
-- (DESIGN E1), newest first by event_id; ids are never reused, like
-- SQLite's AUTOINCREMENT. An event is delivered once delivered_at and
-- delivery_kind are set, both together: by a consumer's acknowledgement, or
-- at write time ('suppressed') when a planned stop covered it (DESIGN E2).
-- agent is not a foreign key: events outlive the registry record they were
-- written for.
--
-- With several servers writing, ids may commit out of order: a reader
-- paging back by event_id can miss an event that committed after it read a
-- higher id. A consumer that must see every event polls the undelivered
-- ones and acknowledges them, which no commit order defeats.
CREATE TABLE process_events (
    event_id        bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent           text COLLATE "C" NOT NULL,
    kind            text             NOT NULL
        CHECK (kind IN ('exit', 'stall_kill', 'launch_failure', 'flapping', 'startup_timeout')),
    at              timestamptz      NOT NULL,
    exit_code       bigint,
    signal          text             NOT NULL,
    run_duration_ms bigint           NOT NULL,
    stderr_tail     text             NOT NULL,
    detail          json,
    delivered_at    timestamptz,
    delivery_kind   text,
    CHECK ((delivered_at IS NULL) = (delivery_kind IS NULL))
);

-- Newest-first listing of one agent's events.
CREATE INDEX process_events_agent_idx ON process_events (agent, event_id DESC);
-- Newest-first listing of the events no consumer has dealt with yet.
CREATE INDEX process_events_undelivered_idx ON process_events (event_id DESC) WHERE delivered_at IS NULL;

-- At most one planned stop marker per agent (DESIGN E2): an operator is
-- stopping the agent on purpose, so its exits between created_at and
-- expires_at are written already delivered. Writing a marker replaces the
-- agent's earlier one.
CREATE TABLE planned_stops (
    agent      text COLLATE "C" NOT NULL PRIMARY KEY,
    reason     text             NOT NULL,
    created_at timestamptz      NOT NULL,
    expires_at timestamptz      NOT NULL
);
