package pgstore

// claimPickSQL selects, and locks, the task a claim of @types takes: the
// oldest scheduled task (run_after, then task_id) whose run_after has
// passed, of any of the types, skipping tasks another claimer holds locked.
//
// Each type is one scan of tasks_claim_idx (status, task_type, run_after,
// task_id) that locks its first unlocked row and stops, and the oldest of
// those few rows wins; the others stay locked only until the claim's
// transaction ends. A single scan with task_type = ANY(@types) cannot
// return rows in (run_after, task_id) order across several types, so
// PostgreSQL read every scheduled task of those types and sorted them, on
// every claim: its cost grew with the backlog (issue #6).
const claimPickSQL = `
	SELECT c.task_id FROM unnest(@types::text[]) AS ty(task_type)
	CROSS JOIN LATERAL (
		SELECT task_id, run_after FROM tasks
		WHERE status = 'scheduled' AND task_type = ty.task_type AND run_after <= @now
		ORDER BY run_after, task_id
		LIMIT 1
		FOR UPDATE SKIP LOCKED) AS c
	ORDER BY c.run_after, c.task_id
	LIMIT 1`
