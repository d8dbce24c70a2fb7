package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
)

func newTouchActivityCmd() *cobra.Command {
	var (
		workdir string
		create  bool
	)
	cmd := &cobra.Command{
		Use:   "touch-activity [--workdir DIR]",
		Short: "Record activity for the heartbeat loop of DIR (no server call)",
		Long: `Set the mtime of DIR/.vigil/last-activity to now: evidence that the work in
DIR progresses, which the heartbeat loop sends as activity_at (DESIGN H3). It
makes no server call, so it is cheap enough for an agent's post-tool hook.

DIR defaults to $VIGIL_WORKDIR (set by vigil run), else the current directory.
A DIR without .vigil/ (no session there) is left alone and the command exits
0, so a hook installed for every project is harmless; --create makes it.`,
		Example: `  vigil touch-activity
  vigil touch-activity --workdir "$CLAUDE_PROJECT_DIR"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if workdir == "" {
				return errors.New("--workdir must not be empty")
			}
			st, err := openWorkdir(workdir)
			if err != nil {
				return err
			}
			if !create {
				if _, err := os.Stat(st.Dir()); errors.Is(err, os.ErrNotExist) {
					return nil
				}
			}
			if err := st.TouchActivity(time.Now()); err != nil {
				return fmt.Errorf("--workdir: %w", err)
			}
			return nil
		},
	}
	def := os.Getenv("VIGIL_WORKDIR")
	if def == "" {
		def = "."
	}
	fs := cmd.Flags()
	fs.StringVar(&workdir, "workdir", def, "the session's work directory (env VIGIL_WORKDIR)")
	fs.BoolVar(&create, "create", false, "create DIR/"+filepath.Join(heartbeat.StateDirName, heartbeat.ActivityFile)+" when DIR has no .vigil/")
	return cmd
}
