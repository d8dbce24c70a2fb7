package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// eventColumns are the process_events columns scanEvent reads, in order.
// detail is read as text, as tasks.result is (see taskColumns).
const eventColumns = `event_id, agent, kind, at, exit_code, signal, run_duration_ms, stderr_tail,
	detail::text AS detail, delivered_at, delivery_kind`

// scanEvent converts one process_events row (eventColumns) to a
// ProcessEvent. It is the only place event rows become vigiltype values.
func scanEvent(row rowScanner) (*vigiltype.ProcessEvent, error) {
	var (
		e      vigiltype.ProcessEvent
		kind   string
		detail *string
	)
	if err := row.Scan(&e.EventID, &e.Agent, &kind, &e.At, &e.ExitCode, &e.Signal, &e.RunDurationMS,
		&e.StderrTail, &detail, &e.DeliveredAt, &e.DeliveryKind); err != nil {
		return nil, err
	}
	e.At = e.At.UTC()
	e.DeliveredAt = utcPtr(e.DeliveredAt)
	e.Kind = vigiltype.EventKind(kind)
	if detail != nil {
		e.Detail = json.RawMessage(*detail)
	}
	return &e, nil
}

// checkEvent refuses an event the table cannot hold; nothing is written.
// The rules and words are sqlitestore's.
func checkEvent(p store.EventRecordParams) error {
	if !p.Kind.Valid() {
		return vigiltype.Invalid("kind", "must be exit, stall_kill, launch_failure, flapping or startup_timeout")
	}
	if p.Detail != nil && !json.Valid(p.Detail) {
		return vigiltype.Invalid("detail", "must be valid JSON")
	}
	return nil
}

// EventRecord implements store.Store. The planned stop lookup and the
// insert are one statement, so the event is suppressed exactly when a
// marker covering At, written when the event's process was already
// running (LaunchedAt), was committed when the statement began. A nil Detail
// is stored as NULL; a Detail that is not valid JSON, or an unknown Kind,
// is refused before anything is written.
func (s *Store) EventRecord(ctx context.Context, p store.EventRecordParams) (*vigiltype.ProcessEvent, error) {
	if err := checkEvent(p); err != nil {
		return nil, err
	}
	var detail *string // NULL unless given
	if p.Detail != nil {
		d := string(p.Detail)
		detail = &d
	}
	event, err := scanEvent(s.pool.QueryRow(ctx, `
		WITH stop AS (
			SELECT 1 FROM planned_stops
			WHERE agent = @agent AND created_at <= @at AND @at <= expires_at
				AND (@launched_at::timestamptz IS NULL OR @launched_at::timestamptz <= created_at))
		INSERT INTO process_events (agent, kind, at, exit_code, signal, run_duration_ms, stderr_tail,
			detail, delivered_at, delivery_kind)
		VALUES (@agent, @kind, @at, @exit_code, @signal, @run_duration_ms, @stderr_tail, @detail::json,
			CASE WHEN EXISTS (SELECT 1 FROM stop) THEN @at::timestamptz END,
			CASE WHEN EXISTS (SELECT 1 FROM stop) THEN @suppressed::text END)
		RETURNING `+eventColumns,
		pgx.StrictNamedArgs{
			"agent":           p.Agent,
			"kind":            string(p.Kind),
			"at":              utcMS(p.At),
			"launched_at":     utcMSPtr(p.LaunchedAt),
			"exit_code":       p.ExitCode,
			"signal":          p.Signal,
			"run_duration_ms": p.RunDurationMS,
			"stderr_tail":     p.StderrTail,
			"detail":          detail,
			"suppressed":      vigiltype.DeliverySuppressed,
		}))
	if err != nil {
		return nil, fmt.Errorf("record %s event of agent %q: %w", p.Kind, p.Agent, interpretError(err))
	}
	return event, nil
}

// EventList implements store.Store. Limit <= 0 means no limit.
//
// With several servers writing, event ids may commit out of order, so a
// reader paging back by BeforeID can miss an event that committed after
// it read a higher id. A consumer that must see every event lists the
// Undelivered ones and acknowledges each (EventAck): an event committed
// late is still undelivered at the next poll.
func (s *Store) EventList(ctx context.Context, p store.EventListParams) ([]*vigiltype.ProcessEvent, error) {
	where := []string{"TRUE"}
	args := pgx.StrictNamedArgs{"limit": sqlLimit(p.Limit)}
	if p.Agent != "" {
		where = append(where, "agent = @agent")
		args["agent"] = p.Agent
	}
	if p.Undelivered {
		where = append(where, "delivered_at IS NULL")
	}
	if p.BeforeID != 0 {
		where = append(where, "event_id < @before_id")
		args["before_id"] = p.BeforeID
	}
	rows, err := s.pool.Query(ctx, `
		SELECT `+eventColumns+` FROM process_events
		WHERE `+strings.Join(where, " AND ")+`
		ORDER BY event_id DESC
		LIMIT @limit`, args)
	if err != nil {
		return nil, fmt.Errorf("list process events: %w", interpretError(err))
	}
	events, err := pgx.AppendRows([]*vigiltype.ProcessEvent(nil), rows,
		func(row pgx.CollectableRow) (*vigiltype.ProcessEvent, error) {
			return scanEvent(row)
		})
	if err != nil {
		return nil, fmt.Errorf("list process events: %w", interpretError(err))
	}
	return events, nil
}

// EventAck implements store.Store. One statement: an event already
// delivered keeps its delivered_at and delivery_kind, so acknowledging
// twice (or a suppressed event) changes nothing. Of two servers
// acknowledging one event at once, the second waits for the first's row
// lock and then keeps what the first wrote.
func (s *Store) EventAck(ctx context.Context, eventID int64, kind string, now time.Time) (*vigiltype.ProcessEvent, error) {
	event, err := scanEvent(s.pool.QueryRow(ctx, `
		UPDATE process_events SET
			delivered_at = CASE WHEN delivered_at IS NULL THEN @now ELSE delivered_at END,
			delivery_kind = CASE WHEN delivered_at IS NULL THEN @kind ELSE delivery_kind END
		WHERE event_id = @event_id
		RETURNING `+eventColumns,
		pgx.StrictNamedArgs{"now": utcMS(now), "kind": kind, "event_id": eventID}))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("process event %d: %w", eventID, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("ack process event %d: %w", eventID, err)
	}
	return event, nil
}
