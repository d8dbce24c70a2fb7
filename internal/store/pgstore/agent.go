package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// agentColumns are the agents columns scanAgent reads, in order. config is
// read as text: pgx would otherwise read a JSON null as a nil pointer,
// which would make a null config look like none.
const agentColumns = `name, function, tick_cron, config::text AS config, status, created_at, updated_at,
	stopped_at, version, config_written_by`

// agentInsertColumns are the agents columns AgentRegister writes.
const agentInsertColumns = `name, function, tick_cron, config, status, created_at, updated_at, stopped_at, version,
	config_written_by`

// scanAgent converts one agents row (agentColumns) to an Agent. It is the
// only place agent rows become vigiltype values. A NULL config is a nil
// Config; a stored JSON null is the text null.
func scanAgent(row rowScanner) (*vigiltype.Agent, error) {
	var (
		a      vigiltype.Agent
		config *string
		status string
		by     *string
	)
	if err := row.Scan(&a.Name, &a.Function, &a.TickCron, &config, &status, &a.CreatedAt, &a.UpdatedAt,
		&a.StoppedAt, &a.Version, &by); err != nil {
		return nil, err
	}
	a.CreatedAt = a.CreatedAt.UTC()
	a.UpdatedAt = a.UpdatedAt.UTC()
	a.StoppedAt = utcPtr(a.StoppedAt)
	if config != nil {
		a.Config = json.RawMessage(*config)
	}
	a.Status = vigiltype.AgentStatus(status)
	if by != nil {
		a.ConfigWrittenBy = *by
	}
	return &a, nil
}

// writtenByArg is the SQL value of config_written_by: NULL for "".
func writtenByArg(role string) *string {
	if role == "" {
		return nil
	}
	return &role
}

// configArg is the SQL value of an agent config: NULL for nil, else its
// text, which must be valid JSON. The words are sqlitestore's.
func configArg(config json.RawMessage) (*string, error) {
	if config == nil {
		return nil, nil
	}
	if !json.Valid(config) {
		return nil, vigiltype.Invalid("config", "must be valid JSON")
	}
	c := string(config)
	return &c, nil
}

// AgentRegister implements store.Store. One upsert (INSERT … ON CONFLICT),
// so two servers registering one new name at once never collide: the later
// replaces the earlier. Names and tick_cron are the service layer's to
// validate; config must be valid JSON (nil is stored as NULL) and nothing
// is written when it is not.
func (s *Store) AgentRegister(ctx context.Context, p store.AgentRegisterParams) (*vigiltype.Agent, error) {
	config, err := configArg(p.Config)
	if err != nil {
		return nil, err
	}
	agent, err := scanAgent(s.pool.QueryRow(ctx, `
		INSERT INTO agents (`+agentInsertColumns+`)
		VALUES (@name, @function, @tick_cron, @config::json, 'active', @now, @now, NULL, 1, @written_by)
		ON CONFLICT (name) DO UPDATE SET
			function = excluded.function,
			tick_cron = excluded.tick_cron,
			config = excluded.config,
			config_written_by = excluded.config_written_by,
			status = 'active',
			created_at = excluded.created_at,
			updated_at = excluded.updated_at,
			stopped_at = NULL,
			version = agents.version + 1
		RETURNING `+agentColumns,
		pgx.StrictNamedArgs{
			"name":       p.Name,
			"function":   p.Function,
			"tick_cron":  p.TickCron,
			"config":     config,
			"written_by": writtenByArg(p.ConfigWrittenBy),
			"now":        utcMS(p.Now),
		}))
	if err != nil {
		return nil, fmt.Errorf("register agent %q: %w", p.Name, interpretError(err))
	}
	return agent, nil
}

// AgentGet implements store.Store.
func (s *Store) AgentGet(ctx context.Context, name string) (*vigiltype.Agent, error) {
	agent, err := scanAgent(s.pool.QueryRow(ctx, `SELECT `+agentColumns+` FROM agents WHERE name = $1`, name))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("agent %q: %w", name, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get agent %q: %w", name, err)
	}
	return agent, nil
}

// AgentList implements store.Store.
func (s *Store) AgentList(ctx context.Context) ([]*vigiltype.Agent, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+agentColumns+` FROM agents ORDER BY created_at, name`)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", interpretError(err))
	}
	agents, err := pgx.AppendRows([]*vigiltype.Agent(nil), rows, func(row pgx.CollectableRow) (*vigiltype.Agent, error) {
		return scanAgent(row)
	})
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", interpretError(err))
	}
	return agents, nil
}

// AgentUpdate implements store.Store. The compare-and-swap is the UPDATE's
// own WHERE clause (name and version): of two servers updating from one
// version, the second waits for the first's row lock, re-checks the
// version against the row the first wrote and matches nothing. A Config
// that is not valid JSON is refused before anything is written.
func (s *Store) AgentUpdate(ctx context.Context, p store.AgentUpdateParams) (*vigiltype.Agent, error) {
	config, err := configArg(p.Config)
	if err != nil {
		return nil, err
	}
	var agent *vigiltype.Agent
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		// A non-nil config is never NULL, so coalesce keeps the stored one
		// exactly when none was given; the same for function and tick_cron.
		agent, err = scanAgent(tx.QueryRow(ctx, `
			UPDATE agents SET
				function = coalesce(@function::text, function),
				tick_cron = coalesce(@tick_cron::text, tick_cron),
				config = coalesce(@config::json, config),
				config_written_by = CASE WHEN @config::json IS NULL THEN config_written_by ELSE @written_by::text END,
				updated_at = @now,
				version = version + 1
			WHERE name = @name AND version = @version
			RETURNING `+agentColumns,
			pgx.StrictNamedArgs{
				"function":   p.Function,
				"tick_cron":  p.TickCron,
				"config":     config,
				"written_by": writtenByArg(p.ConfigWrittenBy),
				"now":        utcMS(p.Now),
				"name":       p.Name,
				"version":    p.Version,
			}))
		if errors.Is(err, pgx.ErrNoRows) {
			return agentRefusal(ctx, tx, p.Name)
		}
		return interpretError(err)
	})
	if errors.Is(err, vigiltype.ErrNotFound) || errors.Is(err, vigiltype.ErrConflict) {
		return nil, fmt.Errorf("agent %q: %w", p.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("update agent %q: %w", p.Name, err)
	}
	return agent, nil
}

// agentRefusal explains why a compare-and-swap on an agent matched no
// row: ErrNotFound when there is no such agent, else ErrConflict.
func agentRefusal(ctx context.Context, tx pgx.Tx, name string) error {
	var one int
	if err := interpretError(tx.QueryRow(ctx, `SELECT 1 FROM agents WHERE name = $1`, name).Scan(&one)); err != nil {
		return err // ErrNotFound included
	}
	return vigiltype.ErrConflict
}

// AgentSetStatus implements store.Store. updated_at moves to now as well;
// marking a stopped agent stopped again moves stopped_at to now.
func (s *Store) AgentSetStatus(ctx context.Context, name string, status vigiltype.AgentStatus, now time.Time) (*vigiltype.Agent, error) {
	var stoppedAt *time.Time // NULL when active
	switch status {
	case vigiltype.AgentActive:
	case vigiltype.AgentStopped:
		stoppedAt = utcMSPtr(&now)
	default:
		return nil, vigiltype.Invalid("status", "must be active or stopped")
	}
	agent, err := scanAgent(s.pool.QueryRow(ctx, `
		UPDATE agents SET
			status = @status,
			stopped_at = @stopped_at,
			updated_at = @now,
			version = version + 1
		WHERE name = @name
		RETURNING `+agentColumns,
		pgx.StrictNamedArgs{
			"status":     string(status),
			"stopped_at": stoppedAt,
			"now":        utcMS(now),
			"name":       name,
		}))
	err = interpretError(err)
	if errors.Is(err, vigiltype.ErrNotFound) {
		return nil, fmt.Errorf("agent %q: %w", name, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("mark agent %q %s: %w", name, status, err)
	}
	return agent, nil
}
