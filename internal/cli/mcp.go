package cli

import (
	"errors"
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/mcpserver"
)

func newMCPCmd() *cobra.Command {
	var db string
	cmd := &cobra.Command{
		Use:     "mcp",
		GroupID: "server",
		Short:   "Serve the MCP tools on stdin/stdout over a store",
		Long: `Serve vigil's MCP tools (list_agents, agent_status, list_processes,
process_status, fleet_snapshot, list_process_events) over stdio, reading the
store named by --db directly: point an MCP client's command at it. It runs
until stdin closes or Ctrl-C. It serves no HTTP API and runs no sweepers;
` + "`vigil serve`" + ` serves the same tools over streamable HTTP at /mcp.

Logs go to stderr; stdout carries only MCP messages.`,
		Example: `  vigil mcp --db vigil.db
  vigil mcp --db postgres://vigil@db.internal/vigil`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			// The daemon only wires the services to the store: it binds
			// no port and is never started, so no sweeper runs here.
			d, err := daemon.New(cmd.Context(), daemon.Config{DB: db, NoListen: true, Logger: logger})
			if err != nil {
				return err
			}
			defer d.Stop()
			s := mcpserver.New(mcpserver.Deps{
				Liveness: d.Liveness, Events: d.Events, Snapshot: d.Snapshot, Sweepers: d.Store(), Version: version(),
			})
			err = s.Run(cmd.Context(), &mcp.IOTransport{
				Reader: io.NopCloser(cmd.InOrStdin()),
				Writer: nopWriteCloser{cmd.OutOrStdout()},
			})
			if err != nil && (errors.Is(err, io.EOF) || cmd.Context().Err() != nil) {
				return nil // the client went away, or Ctrl-C: a normal end
			}
			return err
		},
	}
	cmd.Flags().StringVar(&db, "db", envOr("VIGIL_DB", daemon.DBDefault),
		"store: an SQLite file or a postgres:// URL (env VIGIL_DB)")
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
