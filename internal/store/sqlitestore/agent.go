package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// agentColumns are the agents columns scanAgent reads, in order.
const agentColumns = `name, function, tick_cron, config, status, created_at, updated_at, stopped_at, version,
	config_written_by`

// scanAgent converts one agents row (agentColumns) to an Agent. It is the
// only place agent rows become vigiltype values. A NULL config is a nil
// Config; a stored JSON null is the text null.
func scanAgent(row rowScanner) (*vigiltype.Agent, error) {
	var (
		a                        vigiltype.Agent
		status, created, updated string
		config, stopped, by      sql.Null[string]
	)
	if err := row.Scan(&a.Name, &a.Function, &a.TickCron, &config, &status, &created, &updated,
		&stopped, &a.Version, &by); err != nil {
		return nil, err
	}
	var tp timeParser
	a.CreatedAt = tp.time(created)
	a.UpdatedAt = tp.time(updated)
	a.StoppedAt = tp.nullTime(stopped)
	if tp.err != nil {
		return nil, fmt.Errorf("agent %q: %w", a.Name, tp.err)
	}
	if config.Valid {
		a.Config = json.RawMessage(config.V)
	}
	a.Status = vigiltype.AgentStatus(status)
	a.ConfigWrittenBy = by.V
	return &a, nil
}

// writtenByArg is the SQL value of config_written_by: NULL for "".
func writtenByArg(role string) any {
	if role == "" {
		return nil
	}
	return role
}

// configArg is the SQL value of an agent config: NULL for nil, else its
// text, which must be valid JSON.
func configArg(config json.RawMessage) (any, error) {
	if config == nil {
		return nil, nil
	}
	if !json.Valid(config) {
		return nil, vigiltype.Invalid("config", "must be valid JSON")
	}
	return string(config), nil
}

// AgentRegister implements store.Store. One upsert, so two registrations
// of one new name never collide: the later replaces the earlier. Names and
// tick_cron are the service layer's to validate; config must be valid JSON
// (nil is stored as NULL) and nothing is written when it is not.
func (s *Store) AgentRegister(ctx context.Context, p store.AgentRegisterParams) (*vigiltype.Agent, error) {
	config, err := configArg(p.Config)
	if err != nil {
		return nil, err
	}
	agent, err := scanAgent(s.writer.QueryRowContext(ctx, `
		INSERT INTO agents (`+agentColumns+`)
		VALUES (@name, @function, @tick_cron, @config, 'active', @now, @now, NULL, 1, @written_by)
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
		sql.Named("name", p.Name),
		sql.Named("function", p.Function),
		sql.Named("tick_cron", p.TickCron),
		sql.Named("config", config),
		sql.Named("written_by", writtenByArg(p.ConfigWrittenBy)),
		sql.Named("now", timeString(p.Now)),
	))
	if err != nil {
		return nil, fmt.Errorf("register agent %q: %w", p.Name, err)
	}
	return agent, nil
}

// AgentGet implements store.Store.
func (s *Store) AgentGet(ctx context.Context, name string) (*vigiltype.Agent, error) {
	agent, err := scanAgent(s.reader.QueryRowContext(ctx,
		`SELECT `+agentColumns+` FROM agents WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("agent %q: %w", name, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get agent %q: %w", name, err)
	}
	return agent, nil
}

// AgentList implements store.Store.
func (s *Store) AgentList(ctx context.Context) ([]*vigiltype.Agent, error) {
	rows, err := s.reader.QueryContext(ctx, `SELECT `+agentColumns+` FROM agents ORDER BY created_at, name`)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	defer rows.Close()
	var agents []*vigiltype.Agent
	for rows.Next() {
		a, err := scanAgent(rows)
		if err != nil {
			return nil, fmt.Errorf("list agents: %w", err)
		}
		agents = append(agents, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return agents, nil
}

// AgentUpdate implements store.Store. The compare-and-swap is the UPDATE's
// own WHERE clause (name and version), so two updaters that read one
// version cannot both write. A Config that is not valid JSON is refused
// before anything is written.
func (s *Store) AgentUpdate(ctx context.Context, p store.AgentUpdateParams) (*vigiltype.Agent, error) {
	config, err := configArg(p.Config)
	if err != nil {
		return nil, err
	}
	var agent *vigiltype.Agent
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		// A non-nil config is never NULL, so coalesce keeps the stored one
		// exactly when none was given; the same for function and tick_cron.
		agent, err = scanAgent(tx.QueryRowContext(ctx, `
			UPDATE agents SET
				function = coalesce(@function, function),
				tick_cron = coalesce(@tick_cron, tick_cron),
				config = coalesce(@config, config),
				config_written_by = CASE WHEN @config IS NULL THEN config_written_by ELSE @written_by END,
				updated_at = @now,
				version = version + 1
			WHERE name = @name AND version = @version
			RETURNING `+agentColumns,
			sql.Named("function", p.Function),
			sql.Named("tick_cron", p.TickCron),
			sql.Named("config", config),
			sql.Named("written_by", writtenByArg(p.ConfigWrittenBy)),
			sql.Named("now", timeString(p.Now)),
			sql.Named("name", p.Name),
			sql.Named("version", p.Version),
		))
		if errors.Is(err, sql.ErrNoRows) {
			return agentRefusal(ctx, tx, p.Name)
		}
		return err
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
func agentRefusal(ctx context.Context, tx *sql.Tx, name string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM agents WHERE name = ?`, name).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return vigiltype.ErrNotFound
	case err != nil:
		return err
	}
	return vigiltype.ErrConflict
}

// AgentSetStatus implements store.Store. updated_at moves to now as well;
// marking a stopped agent stopped again moves stopped_at to now.
func (s *Store) AgentSetStatus(ctx context.Context, name string, status vigiltype.AgentStatus, now time.Time) (*vigiltype.Agent, error) {
	var stoppedAt any // NULL when active
	switch status {
	case vigiltype.AgentActive:
	case vigiltype.AgentStopped:
		stoppedAt = timeString(now)
	default:
		return nil, vigiltype.Invalid("status", "must be active or stopped")
	}
	agent, err := scanAgent(s.writer.QueryRowContext(ctx, `
		UPDATE agents SET
			status = @status,
			stopped_at = @stopped_at,
			updated_at = @now,
			version = version + 1
		WHERE name = @name
		RETURNING `+agentColumns,
		sql.Named("status", string(status)),
		sql.Named("stopped_at", stoppedAt),
		sql.Named("now", timeString(now)),
		sql.Named("name", name),
	))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("agent %q: %w", name, vigiltype.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("mark agent %q %s: %w", name, status, err)
	}
	return agent, nil
}
