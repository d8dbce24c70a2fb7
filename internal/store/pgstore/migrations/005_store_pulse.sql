-- 005_store_pulse: the store's own pulse, for the outage grace (DESIGN L8).
-- Additive only. The same version and name as sqlitestore's 005_store_pulse,
-- in PostgreSQL's types.
--
-- One row (id 1): pulsed_at is the latest time a server wrote the store (it
-- pulses every second, and before every reclaim pass). A pulse that finds
-- pulsed_at further back than its gap knows the store could not be written
-- in between (an outage, or no server running): it restarts the alive
-- window of every instance and the lease window of every lease that had
-- not run out at pulsed_at, and records the gap as outage_from/outage_to.
-- Several servers on one database take the row with FOR UPDATE, so a gap is
-- acted on once. No row until the first pulse.
CREATE TABLE store_pulse (
    id          bigint      PRIMARY KEY CHECK (id = 1),
    pulsed_at   timestamptz NOT NULL,
    outage_from timestamptz,
    outage_to   timestamptz
);
