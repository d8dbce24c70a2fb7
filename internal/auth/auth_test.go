package auth_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/auth"
)

const (
	opToken    = "operator-token-0123456789"
	opToken2   = "operator-token-rotated-01"
	agentToken = "agent-token-0123456789ab"
	readToken  = "read-token-0123456789abc"
)

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestParseTokens(t *testing.T) {
	t.Parallel()
	got, err := auth.ParseTokens([]byte("# rotated 2026-12-01\n\n  " + opToken2 + "  \n" + opToken + "\r\n"))
	require.NoError(t, err)
	require.Equal(t, []string{opToken2, opToken}, got)

	for name, content := range map[string]string{
		"empty":          "",
		"comments only":  "# nothing\n\n",
		"short":          "short\n",
		"space inside":   "two words-0123456789abcdef\n",
		"control inside": "token-\x1b-0123456789abcdef\n",
	} {
		_, err := auth.ParseTokens([]byte(content))
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "0123456789", "%s: an error never shows a token", name)
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	require.True(t, auth.RoleOperator.Covers(auth.RoleAgent))
	require.True(t, auth.RoleAgent.Covers(auth.RoleRead))
	require.True(t, auth.RoleRead.Covers(auth.RoleNone))
	require.False(t, auth.RoleRead.Covers(auth.RoleAgent))
	require.False(t, auth.RoleAgent.Covers(auth.RoleOperator))
	require.False(t, auth.RoleNone.Covers(auth.RoleRead))
	require.False(t, auth.Role("root").Covers(auth.RoleRead))
}

func TestKeyring(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files := auth.Files{
		Operator: write(t, dir, "op", opToken+"\n"+opToken2+"\n"),
		Agent:    write(t, dir, "agent", agentToken+"\n"),
		Read:     write(t, dir, "read", "# dashboard\n"+readToken+"\n"),
	}
	k, err := auth.Load(files, quiet)
	require.NoError(t, err)
	require.Equal(t, auth.RoleOperator, k.Role(opToken))
	require.Equal(t, auth.RoleOperator, k.Role(opToken2), "several tokens a file")
	require.Equal(t, auth.RoleAgent, k.Role(agentToken))
	require.Equal(t, auth.RoleRead, k.Role(readToken))
	require.Equal(t, auth.RoleNone, k.Role(""))
	require.Equal(t, auth.RoleNone, k.Role(opToken+" "))
	require.Equal(t, auth.RoleNone, k.Role(opToken[:20]))

	var open *auth.Keyring
	require.Equal(t, auth.RoleOperator, open.Role(""), "no token file: open, everyone is the operator")
	none, err := auth.Load(auth.Files{}, quiet)
	require.NoError(t, err)
	require.Nil(t, none)
}

func TestKeyringRefusesAmbiguousFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	op := write(t, dir, "op", opToken+"\n")
	_, err := auth.Load(auth.Files{Agent: write(t, dir, "agent", agentToken+"\n")}, quiet)
	require.ErrorContains(t, err, "need --token-file")
	_, err = auth.Load(auth.Files{Operator: op, Read: write(t, dir, "read", opToken+"\n")}, quiet)
	require.ErrorContains(t, err, "--read-token-file")
	require.ErrorContains(t, err, "also in --token-file")
	require.NotContains(t, err.Error(), opToken)
	_, err = auth.Load(auth.Files{Operator: filepath.Join(dir, "missing")}, quiet)
	require.ErrorContains(t, err, "--token-file")
}

// Rotation: an edited file is picked up on the next request after the
// check interval, and a broken edit keeps the tokens as they were.
func TestKeyringRereadsChangedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	op := write(t, dir, "op", opToken+"\n")
	k, err := auth.Load(auth.Files{Operator: op}, quiet)
	require.NoError(t, err)
	k.SetCheckEvery(0)
	require.Equal(t, auth.RoleOperator, k.Role(opToken))

	// Add the new token first, then withdraw the old one (a new file renamed over it).
	write(t, dir, "op", opToken2+"\n"+opToken+"\n")
	require.Equal(t, auth.RoleOperator, k.Role(opToken2))
	next := write(t, dir, "op.new", opToken2+"\n")
	require.NoError(t, os.Rename(next, op))
	require.Equal(t, auth.RoleNone, k.Role(opToken))
	require.Equal(t, auth.RoleOperator, k.Role(opToken2))

	write(t, dir, "op", "short\n")
	require.Equal(t, auth.RoleOperator, k.Role(opToken2), "a broken edit keeps the tokens")
	require.NoError(t, os.Remove(op))
	require.Equal(t, auth.RoleOperator, k.Role(opToken2), "a removed file keeps the tokens")

	// Explicit reload (what a SIGHUP handler would call).
	write(t, dir, "op", opToken+"\n")
	require.NoError(t, k.Reload())
	require.Equal(t, auth.RoleOperator, k.Role(opToken))
	require.Equal(t, auth.RoleNone, k.Role(opToken2))
}

func TestReadClientToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	got, err := auth.ReadClientToken(write(t, dir, "op", "# new first\n"+opToken2+"\n"+opToken+"\n"))
	require.NoError(t, err)
	require.Equal(t, opToken2, got)
	_, err = auth.ReadClientToken(write(t, dir, "empty", "\n"))
	require.Error(t, err)
}
