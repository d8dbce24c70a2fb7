package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testcert"
	"github.com/vigil-fleet/vigil/vigiltype"
)

var servingTLSRe = regexp.MustCompile(`url=(https://127\.0\.0\.1:\d+)`)

// Over HTTPS, end to end: a real `vigil serve --tls-cert --tls-key`, the
// example Go worker (vigilclient.AgentFromEnv) completing tasks with
// VIGIL_CA_FILE, the Python client enqueueing with VIGIL_CA_FILE, and the
// CLI with --ca-file; without the CA the CLI and the worker get a
// certificate error. Then the certificate rotates: the files are replaced,
// SIGHUP, and a new connection sees the new serial while the worker keeps
// working.
func TestEndToEndOverHTTPS(t *testing.T) {
	t.Parallel()
	ca := testcert.NewCA(t, "vigil")
	certDir := t.TempDir()
	first := ca.IssueIn(t, certDir)
	server := start(t, nil, bins.vigil, "serve", "--db", filepath.Join(t.TempDir(), "vigil.db"), "--addr", "127.0.0.1:0",
		"--sweep-interval", "200ms", "--tls-cert", first.CertFile, "--tls-key", first.KeyFile)
	var base string
	eventually(t, 30*time.Second, "the server to log its https URL", func() bool {
		m := servingTLSRe.FindStringSubmatch(server.out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	serial := func() *big.Int {
		conn, err := tls.Dial("tcp", u.Host, &tls.Config{RootCAs: roots})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber
	}
	require.Equal(t, first.Cert.SerialNumber, serial())

	// The CLI without the CA: a certificate error and what to do.
	cmd := exec.Command(bins.vigil, "ps", "--server", base)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.Error(t, cmd.Run())
	require.Contains(t, stderr.String(), "x509: certificate signed by unknown authority")
	require.Contains(t, stderr.String(), "the server's certificate is not trusted: --ca-file FILE (env VIGIL_CA_FILE)")

	// The worker without the CA cannot register, and says why.
	blind := start(t, workerEnv(base, "1s", "500ms"), bins.worker)
	eventually(t, 30*time.Second, "the worker without the CA to report the certificate", func() bool {
		return bytes.Contains([]byte(blind.out.String()), []byte("certificate signed by unknown authority"))
	})

	cli := func(out any, args ...string) { vigil(t, base, out, append(args, "--ca-file", ca.File)...) }
	worker := start(t, append(workerEnv(base, "1s", "500ms"), "VIGIL_CA_FILE="+ca.File), bins.worker)
	eventually(t, 30*time.Second, "the worker to show alive over https", func() bool {
		var page struct {
			Processes []vigiltype.Process `json:"processes"`
		}
		cli(&page, "ps", "--kind", "worker")
		for _, p := range page.Processes {
			if p.PID == worker.cmd.Process.Pid && p.Status == vigiltype.ProcessAlive {
				return true
			}
		}
		return false
	})
	completed := func(id int64) {
		t.Helper()
		var task vigiltype.Task
		eventually(t, 30*time.Second, "the worker to complete task "+strconv.FormatInt(id, 10), func() bool {
			cli(&task, "tasks", "show", strconv.FormatInt(id, 10))
			return task.Status == vigiltype.TaskCompleted
		})
		var result struct {
			PID int `json:"pid"`
		}
		require.NoError(t, json.Unmarshal(task.Result, &result))
		require.Equal(t, worker.cmd.Process.Pid, result.PID)
	}

	var queued vigiltype.Task
	cli(&queued, "tasks", "add", "sleep", "--payload", `{"seconds":0.1}`)
	completed(queued.TaskID)

	// The Python client, from its environment.
	if python, err := exec.LookPath("python3"); err == nil {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		require.NoError(t, err)
		py := exec.Command(python, "-c", `import json, sys
sys.path.insert(0, sys.argv[1])
from vigil_client import Client
print(json.dumps(Client.from_env().enqueue("sleep", {"seconds": 0.1})))`, filepath.Join(root, "clients", "python"))
		py.Env = append(os.Environ(), "VIGIL_URL="+base, "VIGIL_CA_FILE="+ca.File, "PYTHONDONTWRITEBYTECODE=1")
		var pyErr bytes.Buffer
		py.Stderr = &pyErr
		out, err := py.Output()
		require.NoError(t, err, "python client: %s", pyErr.String())
		var fromPython vigiltype.Task
		require.NoError(t, json.Unmarshal(out, &fromPython), "python printed %s", out)
		completed(fromPython.TaskID)
	} else {
		t.Log("no python3: the Python client part of this test did not run (clients/python's own TLS tests cover it)")
	}

	// Rotation: new files, SIGHUP, a new connection sees the new serial.
	second := ca.IssueIn(t, certDir)
	require.NoError(t, server.cmd.Process.Signal(syscall.SIGHUP))
	eventually(t, 30*time.Second, "the new certificate to be served", func() bool {
		return serial().Cmp(second.Cert.SerialNumber) == 0
	})
	require.True(t, server.running(), "SIGHUP ended the server")
	eventually(t, 30*time.Second, "the server to log the reload SIGHUP asked for", func() bool {
		return linesWith(server.out.String(), "TLS certificate reloaded", `why="reload asked (SIGHUP)"`, second.Cert.SerialNumber.Text(16))
	})
	cli(&queued, "tasks", "add", "sleep", "--payload", `{"seconds":0.1}`)
	completed(queued.TaskID)
}

// A non-loopback listen without TLS is refused, naming the flags; with
// --insecure-listen (a TLS-terminating proxy in front) it serves.
func TestNonLoopbackPlainHTTPNeedsInsecureListen(t *testing.T) {
	t.Parallel()
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("s3cret-token-0123456789"), 0o600))
	args := []string{"serve", "--db", filepath.Join(t.TempDir(), "vigil.db"), "--addr", "0.0.0.0:0", "--token-file", token}

	out, err := exec.Command(bins.vigil, args...).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `--addr "0.0.0.0:0" is not a loopback address: refusing to serve plain HTTP`)
	require.Contains(t, string(out), "give --tls-cert and --tls-key, or --insecure-listen")

	p := start(t, nil, bins.vigil, append(args, "--insecure-listen")...)
	eventually(t, 30*time.Second, "the server to serve with --insecure-listen", func() bool {
		require.True(t, p.running(), "vigil serve --insecure-listen exited: %s", p.out.String())
		return servingRe.MatchString(p.out.String())
	})
}
