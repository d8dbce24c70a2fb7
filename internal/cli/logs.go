package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/supervisor"
)

// LogDirName is the directory of the agents' log files when neither
// --log-dir nor VIGIL_LOG_DIR names one: next to the SQLite --db file (for
// `vigil logs`: next to $VIGIL_DB, default vigil.db, so ./vigil-logs), or in
// the working directory when the store is PostgreSQL.
const LogDirName = "vigil-logs"

// defaultLogDir is the log directory for store db (see LogDirName), unless
// VIGIL_LOG_DIR is set.
func defaultLogDir(db string) string {
	if dir := os.Getenv("VIGIL_LOG_DIR"); dir != "" {
		return dir
	}
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		return LogDirName
	}
	return filepath.Join(filepath.Dir(db), LogDirName)
}

// logDirHelp describes the default of --log-dir.
const logDirHelp = " (default: env VIGIL_LOG_DIR, else " + LogDirName + " next to the SQLite --db file, or in the working directory with PostgreSQL)"

// logLinesDefault is how many lines `vigil logs` prints by default.
const logLinesDefault = 50

// followPollInterval is how often `vigil logs -f` checks the file for new
// lines and for a rotation.
const followPollInterval = 200 * time.Millisecond

func newLogsCmd() *cobra.Command {
	var (
		logDir string
		lines  int
		follow bool
	)
	cmd := &cobra.Command{
		Use:     "logs AGENT",
		GroupID: "query",
		Short:   "Print an agent's last output lines from the log files 'vigil up' writes",
		Long: `Print the last lines an agent wrote to stdout and stderr, as 'vigil up' keeps
them in <log dir>/<agent>.log (rotated to <agent>.log.1, .2, …), one line per
output line: "<UTC time> <stdout|stderr> <text>". Lines from rotated files
are included when the current file has fewer than asked.

With -f, keep printing lines as they are written, across rotations, until
Ctrl-C. This reads files on this host: run it where 'vigil up' runs, with the
same --log-dir (or the same --db / VIGIL_DB, from which the default follows).`,
		Example: `  vigil logs worker-1
  vigil logs worker-1 -n 200
  vigil logs worker-1 -f --log-dir /var/log/vigil`,
		Args: oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if lines < 0 {
				return fmt.Errorf("-n/--lines must not be negative, got %d", lines)
			}
			if logDir == "" {
				if cmd.Flags().Changed("log-dir") {
					return errors.New("--log-dir must not be empty")
				}
				logDir = defaultLogDir(envOr("VIGIL_DB", daemon.DBDefault))
			}
			path, err := supervisor.LogFile(logDir, args[0])
			if err != nil {
				return fmt.Errorf("AGENT: %w", err)
			}
			f, err := os.Open(path)
			if errors.Is(err, fs.ErrNotExist) {
				return &exitError{err: fmt.Errorf("no log file for agent %q: %s does not exist (is --log-dir the one 'vigil up' writes to?)", args[0], path), code: exitNotFound}
			}
			if err != nil {
				return err
			}
			defer func() { _ = f.Close() }() // again if followLog closed it: harmless
			out := cmd.OutOrStdout()
			offset, err := printLastLines(out, f, path, lines)
			if err != nil {
				return err
			}
			if !follow {
				return nil
			}
			return followLog(cmd.Context(), out, f, offset, path)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&logDir, "log-dir", "", "directory of the agents' log files, as 'vigil up' uses"+logDirHelp+"; VIGIL_DB stands for --db")
	fs.IntVarP(&lines, "lines", "n", logLinesDefault, "how many of the last lines to print (0: none, with -f only new ones)")
	fs.BoolVarP(&follow, "follow", "f", false, "keep printing new lines until Ctrl-C")
	return cmd
}

// printLastLines prints the last n lines of the open file f (path) and, if
// it holds fewer, of the rotated files path.1, path.2, … before it. It
// returns how far it read f, where following continues.
func printLastLines(w io.Writer, f *os.File, path string, n int) (int64, error) {
	data, err := io.ReadAll(f)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	// A last line still being written is left to follow.
	var offset int64
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		offset = int64(i + 1)
		data = data[:i+1]
	} else {
		data = nil
	}
	chunks := [][]byte{data}
	have := bytes.Count(data, []byte{'\n'})
	for i := 1; have < n; i++ {
		older, err := os.ReadFile(path + "." + strconv.Itoa(i))
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read rotated log: %w", err)
		}
		if len(older) > 0 && older[len(older)-1] != '\n' {
			older = append(older, '\n')
		}
		chunks = append([][]byte{older}, chunks...)
		have += bytes.Count(older, []byte{'\n'})
	}
	all := bytes.Join(chunks, nil)
	start := len(all) // all ends with a newline (or is empty)
	for k := 0; k < n && start > 0; k++ {
		start = bytes.LastIndexByte(all[:start-1], '\n') + 1
	}
	if _, err := w.Write(all[start:]); err != nil {
		return 0, err
	}
	return offset, nil
}

// followLog prints complete lines appended to f from offset on until ctx is
// cancelled. When path is rotated (it names another file, or a shorter
// one), it finishes f and continues with the new file from its start.
func followLog(ctx context.Context, w io.Writer, f *os.File, offset int64, path string) error {
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("follow %s: %w", path, err)
	}
	defer func() { _ = f.Close() }() // the file followed last
	var partial []byte
	buf := make([]byte, 64<<10)
	drain := func(f *os.File) error {
		for {
			n, err := f.Read(buf)
			if n > 0 {
				partial = append(partial, buf[:n]...)
				if i := bytes.LastIndexByte(partial, '\n'); i >= 0 {
					if _, werr := w.Write(partial[:i+1]); werr != nil {
						return werr
					}
					partial = append(partial[:0], partial[i+1:]...)
				}
			}
			if errors.Is(err, io.EOF) || n == 0 {
				return nil
			}
			if err != nil {
				return fmt.Errorf("follow %s: %w", path, err)
			}
		}
	}
	tick := time.NewTicker(followPollInterval)
	defer tick.Stop()
	for {
		if err := drain(f); err != nil {
			return err
		}
		if rotated(f, path) {
			if err := drain(f); err != nil { // what was written before the rotation
				return err
			}
			next, err := os.Open(path)
			if err == nil {
				_ = f.Close()
				f = next
				continue
			}
			// Not created again yet: try at the next tick.
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// rotated reports whether path no longer names the open file f, or names it
// but shorter than what was read (truncated).
func rotated(f *os.File, path string) bool {
	cur, err := os.Stat(path)
	if err != nil {
		return true
	}
	open, err := f.Stat()
	if err != nil {
		return false
	}
	if !os.SameFile(cur, open) {
		return true
	}
	pos, err := f.Seek(0, io.SeekCurrent)
	return err == nil && cur.Size() < pos
}
