package sqlitestore

import (
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// A database locked by another process past the busy timeout is
// unavailable (a real SQLITE_BUSY from the driver); a statement's own error
// is not.
func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "vigil.db")
	openTestStore(t, path)

	locker := rawDB(t, path)
	conn, err := locker.Conn(t.Context())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(t.Context(), "BEGIN EXCLUSIVE")
	require.NoError(t, err)
	defer conn.ExecContext(t.Context(), "ROLLBACK") //nolint:errcheck

	impatient, err := sql.Open(driverName, path+"?_pragma=busy_timeout(50)")
	require.NoError(t, err)
	defer impatient.Close()
	_, err = impatient.ExecContext(t.Context(), `INSERT INTO sweepers (name) VALUES ('x')`)
	require.Error(t, err)
	require.True(t, IsUnavailable(err), "%v", err)
	require.True(t, IsUnavailable(errors.Join(errors.New("wrapped"), err)))

	_, err = conn.ExecContext(t.Context(), `INSERT INTO no_such_table VALUES (1)`)
	require.Error(t, err)
	require.False(t, IsUnavailable(err), "%v", err)
	require.False(t, IsUnavailable(vigiltype.ErrNotFound))
	require.False(t, IsUnavailable(nil))
}
