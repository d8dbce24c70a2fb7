-- 006_config_written_by: the role of the token that wrote an agent's
-- config (issue #13: launch commands are operator data). Additive only.
-- The same version and name as sqlitestore's 006_config_written_by.
--
-- agents.config_written_by is 'operator', 'agent' or 'read': set by a
-- register, and by an update that changes the config. NULL when unknown:
-- records written before this migration, or registered without a role. A
-- supervisor launches a record's launch command only when it is
-- 'operator' (and it runs with --allow-registered-launch).
ALTER TABLE agents ADD COLUMN config_written_by text;
