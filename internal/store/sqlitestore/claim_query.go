package sqlitestore

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// claimTypesIndexedMax is the most task types a claim picks from with one
// index search per type; a claim naming more falls back to one query over
// all of them (SQLite caps a compound SELECT at 500 terms).
const claimTypesIndexedMax = 32

// claimPickSQL is the subquery that picks the task a claim of types takes:
// the oldest scheduled task (run_after, then task_id) whose run_after has
// passed, of any of types. It is a parenthesized SELECT of one task_id for
// the claim's UPDATE … WHERE task_id = (…), and args binds its parameters
// besides @now.
//
// Each type is one search of tasks_claim_idx (status, task_type,
// run_after, task_id) that stops at its first row, and the oldest of those
// few rows wins. A single query with task_type IN (…) would instead read
// every scheduled task of those types and sort them, on every claim: its
// cost grew with the backlog (issue #6).
func claimPickSQL(types []string) (string, []any, error) {
	return claimPickLimitSQL(types, "1")
}

// claimPickLimitSQL is claimPickSQL picking up to limit tasks (an SQL
// expression: "1", or a parameter such as "@max" for a batch claim), in
// claim order, for an UPDATE … WHERE task_id IN (…).
func claimPickLimitSQL(types []string, limit string) (string, []any, error) {
	types = slices.Compact(slices.Sorted(slices.Values(types)))
	if len(types) > claimTypesIndexedMax {
		list, err := json.Marshal(types)
		if err != nil {
			return "", nil, err
		}
		return `(
			SELECT task_id FROM tasks
			WHERE status = 'scheduled' AND run_after <= @now
				AND task_type IN (SELECT value FROM json_each(@types))
			ORDER BY run_after, task_id
			LIMIT ` + limit + `)`, []any{sql.Named("types", string(list))}, nil
	}
	branches := make([]string, len(types))
	args := make([]any, len(types))
	for i, typ := range types {
		name := fmt.Sprintf("type_%d", i)
		branches[i] = `SELECT task_id, run_after FROM tasks
			WHERE status = 'scheduled' AND task_type = @` + name + ` AND run_after <= @now
			ORDER BY run_after, task_id
			LIMIT ` + limit
		args[i] = sql.Named(name, typ)
	}
	if len(branches) == 1 {
		return `(SELECT task_id FROM (` + branches[0] + `))`, args, nil
	}
	for i, b := range branches {
		branches[i] = `SELECT * FROM (` + b + `)`
	}
	return `(
		SELECT task_id FROM (` + strings.Join(branches, "\n\t\tUNION ALL\n\t\t") + `)
		ORDER BY run_after, task_id
		LIMIT ` + limit + `)`, args, nil
}
