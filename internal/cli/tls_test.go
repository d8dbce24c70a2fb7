package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/heartbeat"
	"github.com/vigil-fleet/vigil/internal/testcert"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// The client commands talk to an https server given its CA (--ca-file);
// without it they say the certificate is not trusted and how to fix it.
func TestClientCommandsOverHTTPS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())
	srv := testserver.Start(t, testserver.WithTLS(pair.CertFile, pair.KeyFile))
	require.True(t, strings.HasPrefix(srv.URL, "https://"))

	code, out, errOut := run(t, "tasks", "add", "sleep", "--json", "--server", srv.URL, "--ca-file", ca.File)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"task_type": "sleep"`)
	code, out, errOut = run(t, "ps", "--server", srv.URL, "--ca-file", ca.File)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "INSTANCE")

	code, _, errOut = run(t, "ps", "--server", srv.URL)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "certificate signed by unknown authority")
	require.Contains(t, errOut, "vigil: the server's certificate is not trusted: --ca-file FILE (env VIGIL_CA_FILE)")

	other := testcert.NewCA(t, "other")
	code, _, errOut = run(t, "tasks", "add", "sleep", "--server", srv.URL, "--ca-file", other.File)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "the server's certificate is not trusted")

	missing := filepath.Join(t.TempDir(), "missing.pem")
	code, _, errOut = run(t, "ps", "--server", srv.URL, "--ca-file", missing)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--ca-file (env VIGIL_CA_FILE): read the CA certificates: open "+missing)

	code, out, errOut = run(t, "tasks", "ls", "--json", "--server", srv.URL, "--ca-file", ca.File)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, 1, strings.Count(out, `"task_type"`), "the refused add wrote nothing")
}

func TestServeTLSFlagErrors(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "v.db")
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("s3cret-token-0123456789"), 0o600))
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())

	code, _, errOut := run(t, "serve", "--addr", "0.0.0.0:0", "--token-file", token, "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "refusing to serve plain HTTP")
	require.Contains(t, errOut, "give --tls-cert and --tls-key, or --insecure-listen")

	code, _, errOut = run(t, "serve", "--tls-cert", pair.CertFile, "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--tls-cert needs --tls-key")

	code, _, errOut = run(t, "serve", "--tls-cert", pair.CertFile, "--tls-key", pair.CertFile, "--db", db)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "--tls-cert "+pair.CertFile+", --tls-key "+pair.CertFile+": not a certificate and its key")
}

// vigil up with --tls-cert serves HTTPS and its agents get the https URL
// and, with --ca-file, VIGIL_CA_FILE; vigil supervise passes its
// --ca-file on the same way and talks to its server over HTTPS.
func TestUpAndSuperviseGiveAgentsTheCA(t *testing.T) {
	ctx := context.Background()
	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())
	tc, err := vigilclient.LoadCAFile(ca.File)
	require.NoError(t, err)
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(fleet, []byte(`agents:
  - name: env-echo
    command: ["sh", "-c", "echo \"url=$VIGIL_URL ca=$VIGIL_CA_FILE\" >&2; exit 5"]
`), 0o644))
	exitTail := func(url string) string {
		c, err := vigilclient.New([]string{url}, vigilclient.WithTLSConfig(tc))
		require.NoError(t, err)
		var page *vigilclient.EventPage
		require.Eventually(t, func() bool {
			page, err = c.ListEvents(ctx, vigilclient.ListEventsParams{Agent: "env-echo"})
			require.NoError(t, err)
			return len(page.Events) == 1
		}, 15*time.Second, 20*time.Millisecond, "the exit event")
		require.Equal(t, vigiltype.EventExit, page.Events[0].Kind)
		return page.Events[0].StderrTail
	}

	stderr := runCommand(t, "up", "--fleet", fleet, "--db", filepath.Join(dir, "v.db"), "--addr", "127.0.0.1:0",
		"--tls-cert", pair.CertFile, "--tls-key", pair.KeyFile, "--ca-file", ca.File,
		"--backoff-min", "1h", "--backoff-max", "1h")
	url := serverURL(t, stderr)
	require.True(t, strings.HasPrefix(url, "https://127.0.0.1:"), url)
	require.Equal(t, "url="+url+" ca="+ca.File+"\n", exitTail(url))

	srv := testserver.Start(t, testserver.WithTLS(pair.CertFile, pair.KeyFile))
	runCommand(t, "supervise", "--server", srv.URL, "--ca-file", ca.File, "--fleet", fleet,
		"--log-dir", filepath.Join(dir, "logs"), "--backoff-min", "1h", "--backoff-max", "1h")
	require.Equal(t, "url="+srv.URL+" ca="+ca.File+"\n", exitTail(srv.URL))
}

// The detached heartbeat loop of `tasks claim` / `vigil run` gets the
// claiming command's --ca-file (absolute), so it can reach an https server.
func TestLoopArgvPassesTheCAFile(t *testing.T) {
	t.Parallel()
	cf := &clientFlags{server: "https://127.0.0.1:7711", caFile: "ca.pem"}
	argv, err := loopArgv(cf, &loopFlags{}, heartbeat.State{Workdir: "w"}, heartbeat.TaskState{TaskID: 7, LeaseEpoch: 1}, heartbeat.ProcRef{PID: 1})
	require.NoError(t, err)
	abs, err := filepath.Abs("ca.pem")
	require.NoError(t, err)
	require.Contains(t, argv, "--ca-file="+abs)
	require.Contains(t, argv, "--server=https://127.0.0.1:7711")
}
