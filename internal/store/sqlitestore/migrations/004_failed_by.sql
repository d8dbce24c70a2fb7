-- 004_failed_by: who failed a task at its current epoch, so that a fail
-- repeated by the holder whose first answer was lost is recognised as a
-- repeat (DESIGN T8). Additive only.
--
-- tasks.failed_by is the instance that failed the task at its current
-- lease_epoch: a fail sets it to the lease owner (which it clears), a claim
-- clears it with the epoch it moves on. NULL when the task's last lease did
-- not end with a fail, and for tasks failed before this migration.
ALTER TABLE tasks ADD COLUMN failed_by TEXT;
