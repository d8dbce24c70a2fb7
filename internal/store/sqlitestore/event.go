package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// eventColumns are the process_events columns scanEvent reads, in order.
const eventColumns = `event_id, agent, kind, at, exit_code, signal, run_duration_ms, stderr_tail, detail,
	delivered_at, delivery_kind`

// scanEvent converts one process_events row (eventColumns) to a
// ProcessEvent. It is the only place event rows become vigiltype values.
func scanEvent(row rowScanner) (*vigiltype.ProcessEvent, error) {
	var (
		e                   vigiltype.ProcessEvent
		kind, eventAt       string
		exitCode            sql.Null[int]
		detail, deliveredAt sql.Null[string]
		deliveryKind        sql.Null[string]
	)
	if err := row.Scan(&e.EventID, &e.Agent, &kind, &eventAt, &exitCode, &e.Signal, &e.RunDurationMS,
		&e.StderrTail, &detail, &deliveredAt, &deliveryKind); err != nil {
		return nil, err
	}
	var tp timeParser
	e.At = tp.time(eventAt)
	e.DeliveredAt = tp.nullTime(deliveredAt)
	if tp.err != nil {
		return nil, fmt.Errorf("process event %d: %w", e.EventID, tp.err)
	}
	e.Kind = vigiltype.EventKind(kind)
	e.ExitCode = nullPtr(exitCode)
	if detail.Valid {
		e.Detail = json.RawMessage(detail.V)
	}
	e.DeliveryKind = nullPtr(deliveryKind)
	return &e, nil
}

// checkEvent refuses an event the table cannot hold; nothing is written.
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
// running (LaunchedAt), existed as it was written. A nil Detail is stored as
// NULL; a Detail that is not valid JSON, or an unknown Kind, is refused
// before anything is written.
func (s *Store) EventRecord(ctx context.Context, p store.EventRecordParams) (*vigiltype.ProcessEvent, error) {
	if err := checkEvent(p); err != nil {
		return nil, err
	}
	var detail any // NULL unless given
	if p.Detail != nil {
		detail = string(p.Detail)
	}
	var launched any // NULL unless given
	if p.LaunchedAt != nil {
		launched = timeString(*p.LaunchedAt)
	}
	event, err := scanEvent(s.writer.QueryRowContext(ctx, `
		WITH stop AS (
			SELECT 1 FROM planned_stops
			WHERE agent = @agent AND created_at <= @at AND @at <= expires_at
				AND (@launched_at IS NULL OR @launched_at <= created_at))
		INSERT INTO process_events (agent, kind, at, exit_code, signal, run_duration_ms, stderr_tail,
			detail, delivered_at, delivery_kind)
		VALUES (@agent, @kind, @at, @exit_code, @signal, @run_duration_ms, @stderr_tail, @detail,
			CASE WHEN EXISTS (SELECT 1 FROM stop) THEN @at END,
			CASE WHEN EXISTS (SELECT 1 FROM stop) THEN @suppressed END)
		RETURNING `+eventColumns,
		sql.Named("agent", p.Agent),
		sql.Named("kind", string(p.Kind)),
		sql.Named("at", timeString(p.At)),
		sql.Named("launched_at", launched),
		sql.Named("exit_code", p.ExitCode),
		sql.Named("signal", p.Signal),
		sql.Named("run_duration_ms", p.RunDurationMS),
		sql.Named("stderr_tail", p.StderrTail),
		sql.Named("detail", detail),
		sql.Named("suppressed", vigiltype.DeliverySuppressed),
	))
	if err != nil {
		return nil, fmt.Errorf("record %s event of agent %q: %w", p.Kind, p.Agent, err)
	}
	return event, nil
}

// EventList implements store.Store. Limit <= 0 means no limit.
func (s *Store) EventList(ctx context.Context, p store.EventListParams) ([]*vigiltype.ProcessEvent, error) {
	where := []string{"TRUE"}
	args := []any{sql.Named("limit", sqlLimit(p.Limit))}
	if p.Agent != "" {
		where = append(where, "agent = @agent")
		args = append(args, sql.Named("agent", p.Agent))
	}
	if p.Undelivered {
		where = append(where, "delivered_at IS NULL")
	}
	if p.BeforeID != 0 {
		where = append(where, "event_id < @before_id")
		args = append(args, sql.Named("before_id", p.BeforeID))
	}
	rows, err := s.reader.QueryContext(ctx, `
		SELECT `+eventColumns+` FROM process_events
		WHERE `+strings.Join(where, " AND ")+`
		ORDER BY event_id DESC
		LIMIT @limit`, args...)
	if err != nil {
		return nil, fmt.Errorf("list process events: %w", err)
	}
	defer rows.Close()
	var events []*vigiltype.ProcessEvent
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, fmt.Errorf("list process events: %w", err)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list process events: %w", err)
	}
	return events, nil
}

// EventAck implements store.Store. One statement: an event already
// delivered keeps its delivered_at and delivery_kind, so acknowledging
// twice (or a suppressed event) changes nothing.
func (s *Store) EventAck(ctx context.Context, eventID int64, kind string, now time.Time) (*vigiltype.ProcessEvent, error) {
	event, err := scanEvent(s.writer.QueryRowContext(ctx, `
		UPDATE process_events SET
			delivered_at = CASE WHEN delivered_at IS NULL THEN @now ELSE delivered_at END,
			delivery_kind = CASE WHEN delivered_at IS NULL THEN @kind ELSE delivery_kind END
		WHERE event_id = @event_id
		RETURNING `+eventColumns,
		sql.Named("now", timeString(now)),
		sql.Named("kind", kind),
		sql.Named("event_id", eventID),
	))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("process event %d: %w", eventID, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("ack process event %d: %w", eventID, err)
	}
	return event, nil
}
