package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// run executes the CLI in-process and returns its exit code and output.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestClientCommands(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	url := srv.URL

	code, out, errOut := run(t, "tasks", "add", "sleep", "--payload", `{"seconds":1}`, "--json", "--server", url)
	require.Equal(t, 0, code, errOut)
	var task vigiltype.Task
	require.NoError(t, json.Unmarshal([]byte(out), &task))
	require.Equal(t, "sleep", task.TaskType)
	require.JSONEq(t, `{"seconds":1}`, string(task.Payload))

	code, out, errOut = run(t, "tasks", "add", "plain", "--json", "--server", url+",")
	require.Equal(t, 0, code, errOut)
	var plain vigiltype.Task
	require.NoError(t, json.Unmarshal([]byte(out), &plain))
	require.JSONEq(t, `{}`, string(plain.Payload), "no --payload is {}, as the help says")

	code, out, errOut = run(t, "tasks", "ls", "--json", "--server", url)
	require.Equal(t, 0, code, errOut)
	var page struct {
		Tasks      []vigiltype.Task `json:"tasks"`
		NextCursor *string          `json:"next_cursor"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Len(t, page.Tasks, 2)
	require.Nil(t, page.NextCursor)

	code, out, _ = run(t, "tasks", "ls", "--server", url)
	require.Equal(t, 0, code)
	require.Contains(t, out, "ATTEMPTS")
	require.Contains(t, out, "scheduled")

	code, out, _ = run(t, "tasks", "show", "1", "--server", url)
	require.Equal(t, 0, code)
	require.Contains(t, out, `{"seconds":1}`)

	code, _, errOut = run(t, "tasks", "show", "77", "--server", url)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, errOut, "no task 77")

	code, out, errOut = run(t, "ps", "--json", "--server", url)
	require.Equal(t, 0, code, errOut)
	require.JSONEq(t, `{"processes":[],"next_cursor":null}`, out)

	code, _, errOut = run(t, "status", "critic", "--server", url)
	require.Equal(t, exitNotFound, code)
	require.Contains(t, errOut, `no process of kind "critic" has registered`)

	code, out, errOut = run(t, "sweepers", "--json", "--server", url)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"lease_reclaimer"`)
	require.Contains(t, out, `"kind": "sweeper"`)

	code, out, _ = run(t, "prune", "--older-than", "1h", "--server", url)
	require.Equal(t, 0, code)
	require.Contains(t, out, "deleted 0")
}

func TestStatusShowsNewestInstance(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	code, _, errOut := run(t, "ps", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	reg, err := srv.Liveness.Register(t.Context(), registerParams("critic"))
	require.NoError(t, err)

	code, out, errOut := run(t, "status", "critic", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, reg.InstanceID)
	require.Contains(t, out, "alive")

	code, out, _ = run(t, "ps", "--kind", "critic", "--status", "alive", "--server", srv.URL)
	require.Equal(t, 0, code)
	require.Contains(t, out, reg.InstanceID)
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	emptyFile := t.TempDir() + "/token"
	require.NoError(t, os.WriteFile(emptyFile, nil, 0o600))
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"ps status", []string{"ps", "--status", "zombie"}, `--status "zombie": must be alive or stopped`},
		{"ps limit", []string{"ps", "--limit", "0"}, "--limit 0: must be between 1 and 1000"},
		{"ps limit word", []string{"ps", "--limit", "abc"}, `invalid argument "abc" for "--limit" flag: not a whole number (see 'vigil ps --help')`},
		{"status no kind", []string{"status"}, "missing KIND (usage: vigil status KIND"},
		{"status two kinds", []string{"status", "a", "b"}, "vigil status takes one KIND, not 2 arguments"},
		{"tasks status", []string{"tasks", "ls", "--status", "done"}, "must be one of scheduled"},
		{"payload", []string{"tasks", "add", "sleep", "--payload", "{nope"}, "--payload: must be valid JSON"},
		{"max attempts", []string{"tasks", "add", "sleep", "--max-attempts", "0"}, "--max-attempts must be between 1 and 1000, got 0"},
		{"max attempts high", []string{"tasks", "add", "sleep", "--max-attempts", "1001"}, "--max-attempts must be between 1 and 1000, got 1001"},
		{"max reclaims", []string{"tasks", "add", "sleep", "--max-reclaims", "-1"}, "--max-reclaims must be between 0 and 1000"},
		{"lease timeout", []string{"tasks", "add", "sleep", "--lease-timeout", "500ms"}, "--lease-timeout must be 0 (the server's) or between 1s and 24h, got 500ms"},
		{"delay", []string{"tasks", "add", "sleep", "--delay", "-1s"}, "--delay must not be negative"},
		{"payload file", []string{"tasks", "add", "sleep", "--payload", "@/nonexistent/p.json"}, "--payload: open /nonexistent/p.json"},
		{"empty token file", []string{"ps", "--token-file", emptyFile}, "no token in the file"},
		{"task type", []string{"tasks", "add", "bad type"}, "task_type: may only contain"},
		{"task id", []string{"tasks", "show", "abc"}, `task ID "abc": must be a positive integer`},
		{"prune", []string{"prune", "--older-than", "-1h"}, "--older-than must be a positive duration"},
		{"server url", []string{"ps", "--server", "localhost:7711"}, "--server"},
		{"server urls empty", []string{"ps", "--server", ","}, "--server (env VIGIL_URL)"},
	}
	for _, c := range cases {
		args := c.args
		if !strings.HasPrefix(c.name, "server url") {
			args = append(args, "--server", srv.URL)
		}
		code, _, errOut := run(t, args...)
		require.Equal(t, exitFailure, code, c.name)
		require.Contains(t, errOut, c.want, c.name)
	}
	code, out, _ := run(t, "tasks", "ls", "--json", "--server", srv.URL)
	require.Equal(t, 0, code)
	require.JSONEq(t, `{"tasks":[],"next_cursor":null}`, out, "a refused command wrote a task")
}

func TestServeRefusesExposureWithoutToken(t *testing.T) {
	t.Parallel()
	db := t.TempDir() + "/v.db"
	code, _, errOut := run(t, "serve", "--addr", "0.0.0.0:0", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "not a loopback address: refusing to serve without --token-file")

	code, _, errOut = run(t, "serve", "--lease-timeout", "0s", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--lease-timeout must be positive")

	code, _, errOut = run(t, "serve", "--sweep-interval", "1ns", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--sweep-interval must be at least 10ms")

	code, _, errOut = run(t, "up", "--backoff-reset", "5s", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--backoff-reset (5s) must not be below --backoff-fast-failure (30s)")

	code, _, errOut = run(t, "up", "--stop-grace", "-1s", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--stop-grace must be positive")

	for _, cmd := range []string{"serve", "up"} {
		code, _, errOut = run(t, cmd, "--allowed-host", "http://vigil.internal", "--addr", "127.0.0.1:0", "--db", db)
		require.Equal(t, exitFailure, code, cmd)
		require.Contains(t, errOut, `--allowed-host: allowed host "http://vigil.internal": not a host name (want NAME or NAME:PORT`, cmd)
	}

	code, _, errOut = run(t, "serve", "--log-level", "loud", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, `--log-level "loud"`)

	code, _, errOut = run(t, "up", "--fleet", t.TempDir()+"/missing.yaml", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "no such file")

	code, _, errOut = run(t, "migrate", "--db", "host=127.0.0.1 password=KVSECRET dbname=x")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "looks like a PostgreSQL keyword/value string")
	require.NotContains(t, errOut, "KVSECRET")

	code, _, errOut = run(t, "up", "--backoff-min", "10s", "--backoff-max", "1s", "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--backoff-max (1s) must not be below --backoff-min (10s)")

	bad := t.TempDir() + "/fleet.yaml"
	require.NoError(t, os.WriteFile(bad, []byte("agents:\n  - name: w\n    command: []\n"), 0o644))
	code, _, errOut = run(t, "up", "--fleet", bad, "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "agents[0].command: must not be empty")
}

func registerParams(kind string) liveness.RegisterParams {
	return liveness.RegisterParams{ProcessKind: kind, Hostname: "h", PID: 1, LivenessIntervalS: 30}
}

func TestPayloadFromFileAndStdin(t *testing.T) {
	t.Parallel()
	srv := testserver.Start(t)
	file := t.TempDir() + "/job.json"
	require.NoError(t, os.WriteFile(file, []byte(`{"from":"file"}`+"\n"), 0o600))

	code, out, errOut := run(t, "tasks", "add", "job", "--payload", "@"+file, "--json", "--server", srv.URL)
	require.Equal(t, 0, code, errOut)
	var task vigiltype.Task
	require.NoError(t, json.Unmarshal([]byte(out), &task))
	require.JSONEq(t, `{"from":"file"}`, string(task.Payload))

	var stdout, stderr bytes.Buffer
	code = Main([]string{"tasks", "add", "job", "--payload", "-", "--json", "--server", srv.URL},
		strings.NewReader(`{"from":"stdin"}`), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &task))
	require.JSONEq(t, `{"from":"stdin"}`, string(task.Payload))
}

func TestTablesEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	require.Equal(t, "plain text ✓", printable("plain text ✓"))
	require.Equal(t, `evil\x1b[31mRED\n\tx`, printable("evil\x1b[31mRED\n\tx"))
	require.Equal(t, `a\x00b\xff`, printable("a\x00b\xff"))
	require.Equal(t, "keeps \uFFFD as it is", printable("keeps \uFFFD as it is"))

	var out bytes.Buffer
	require.NoError(t, table(&out, []string{"A", "B"}, [][]string{{"x\ny", "z"}}))
	require.Equal(t, 2, strings.Count(out.String(), "\n"), "one header line and one row: %q", out.String())
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "--version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "vigil version "), out)
}

func TestEventColumns(t *testing.T) {
	t.Parallel()
	code := 3
	exit := vigiltype.ProcessEvent{Kind: vigiltype.EventExit, ExitCode: &code, RunDurationMS: 1500}
	require.Equal(t, "code 3", eventOutcome(exit))
	require.Equal(t, "2s", runTime(exit))
	deferred := vigiltype.ProcessEvent{Kind: vigiltype.EventStallKill, Detail: json.RawMessage(`{"deferred":true}`)}
	require.Equal(t, "deferred", eventOutcome(deferred))
	require.Equal(t, "-", runTime(deferred), "only exits have a run time")
	require.Equal(t, "killed", eventOutcome(vigiltype.ProcessEvent{Kind: vigiltype.EventExit, Signal: "killed"}))
}

// A client without the server's token is told which flag carries it.
func TestUnauthorizedSaysWhichFlag(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600))
	srv := testserver.Start(t, testserver.WithTokenFile(tokenFile))

	code, _, errOut := run(t, "ps", "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--token-file FILE (env VIGIL_TOKEN_FILE)")

	code, _, errOut = run(t, "ps", "--server", srv.URL, "--token-file", tokenFile)
	require.Equal(t, exitOK, code, errOut)
}

// A read token reads; a command that changes the fleet gets the 403 and is
// told it needs an operator token. A token file with several tokens sends
// its first.
func TestForbiddenSaysWhichToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	op := file("operator", "# newest first\noperator-token-new-0123\noperator-token-old-0123\n")
	read := file("read", "read-token-0123456789ab\n")
	srv := testserver.Start(t, testserver.WithRoleTokenFiles(op, "", read))

	code, _, errOut := run(t, "ps", "--server", srv.URL, "--token-file", read)
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = run(t, "prune", "--server", srv.URL, "--token-file", read, "--older-than", "1h")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "needs the operator role; this token has the read role")
	require.Contains(t, errOut, "use a token of the role the message names")
	code, _, errOut = run(t, "prune", "--server", srv.URL, "--token-file", op, "--older-than", "1h")
	require.Equal(t, exitOK, code, errOut)
}

// The agents a supervisor launches get the agent token file when there is
// one, else the operator's, as an absolute path.
func TestAgentTokenEnv(t *testing.T) {
	t.Parallel()
	env, err := agentTokenEnv("", "")
	require.NoError(t, err)
	require.Empty(t, env)
	env, err = agentTokenEnv("op", "")
	require.NoError(t, err)
	abs, err := filepath.Abs("op")
	require.NoError(t, err)
	require.Equal(t, abs, env["VIGIL_TOKEN_FILE"])
	env, err = agentTokenEnv("op", "/etc/vigil/agent")
	require.NoError(t, err)
	require.Equal(t, "/etc/vigil/agent", env["VIGIL_TOKEN_FILE"])
}
