package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/daemon"
)

func newMigrateCmd() *cobra.Command {
	var (
		db     string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "migrate",
		GroupID: "server",
		Short:   "Apply pending schema migrations to a store, then exit",
		Long: `Apply pending schema migrations to the store and exit. Servers migrate at
start too; run this ahead of a rollout so that servers of the new version
start on a ready schema. Migrations are additive: servers of the previous
version keep working on the migrated schema. Several migrate runs or servers
starting at once are safe (PostgreSQL: an advisory lock; SQLite: one writer).`,
		Example: `  vigil migrate --db postgres://vigil@db.internal/vigil
  vigil migrate --db /var/lib/vigil/vigil.db --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			applied, err := daemon.Migrate(cmd.Context(), db)
			if err != nil {
				return err
			}
			if asJSON {
				if applied == nil {
					applied = []string{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"applied": applied})
			}
			if len(applied) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "schema is current: nothing to apply")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %d migration(s): %s\n", len(applied), strings.Join(applied, ", "))
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", envOr("VIGIL_DB", daemon.DBDefault),
		"store: an SQLite file or a postgres:// URL (env VIGIL_DB)")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"applied":[…]} for scripts`)
	return cmd
}
