package daemon_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/daemon"
	"github.com/vigil-fleet/vigil/internal/lease"
	"github.com/vigil-fleet/vigil/internal/liveness"
	"github.com/vigil-fleet/vigil/internal/store/pgstore/pgtest"
	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// skewed is a host clock that runs off by skew.
type skewed struct{ skew time.Duration }

func (s skewed) Now() time.Time { return time.Now().Add(s.skew).UTC() }

// Two servers on one PostgreSQL whose own clocks differ by ten minutes give
// the same alive/stopped answer for the same row: both follow the
// database's clock (DESIGN L3).
func TestServersOnOneDatabaseShareOneClock(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ahead := testserver.Start(t, testserver.WithDB(url), testserver.WithClock(skewed{5 * time.Minute}))
	behind := testserver.Start(t, testserver.WithDB(url), testserver.WithClock(skewed{-5 * time.Minute}))
	ctx := context.Background()

	reg, err := behind.Liveness.Register(ctx, liveness.RegisterParams{
		ProcessKind: "critic", Hostname: "h", PID: 1, LivenessIntervalS: 5,
	})
	require.NoError(t, err)
	for _, srv := range []*testserver.Server{ahead, behind} {
		p, err := srv.Liveness.Get(ctx, reg.InstanceID)
		require.NoError(t, err)
		require.Equal(t, vigiltype.ProcessAlive, p.Status, "server %s", srv.URL)
		require.WithinDuration(t, time.Now(), p.LastHeartbeatAt, time.Minute,
			"last_heartbeat_at is the database's time, not the skewed host's")
	}
}

// A task reclaimed while two servers sweep one database is reclaimed once.
func TestTwoServersReclaimEachExpiredLeaseOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := testserver.Start(t, testserver.WithDB(url), testserver.WithSweepInterval(10*time.Millisecond))
	b := testserver.Start(t, testserver.WithDB(url), testserver.WithSweepInterval(10*time.Millisecond))
	ctx := context.Background()

	const n = 50
	reg, err := a.Liveness.Register(ctx, liveness.RegisterParams{ProcessKind: "w", Hostname: "h", PID: 1, LivenessIntervalS: 1})
	require.NoError(t, err)
	for range n {
		_, err := a.Lease.Enqueue(ctx, lease5())
		require.NoError(t, err)
		// Claimed through the server that enqueued: the two servers' clocks
		// follow the database's only to within a round trip, and a task is
		// claimable once its run_after has passed on the claimer's clock.
		task, err := a.Lease.Claim(ctx, reg.InstanceID, reg.InstanceToken, []string{"work"})
		require.NoError(t, err)
		require.NotNil(t, task)
	}
	// The holder stops heartbeating: its instance shows stopped after 3s
	// and both servers' sweepers race for its 50 leases.
	require.Eventually(t, func() bool {
		page, _, err := a.Lease.List(ctx, leaseList("scheduled"))
		require.NoError(t, err)
		return len(page) == n
	}, 30*time.Second, 20*time.Millisecond)
	page, _, err := b.Lease.List(ctx, leaseList(""))
	require.NoError(t, err)
	for _, task := range page {
		require.Equal(t, 1, task.Reclaims, "task %d", task.TaskID)
	}
}

func TestOpenErrorsNeverShowThePassword(t *testing.T) {
	t.Parallel()
	for _, db := range []string{
		"postgres://vigil:hunter2@127.0.0.1:1/vigil?connect_timeout=2",
		"postgresql://vigil:hunter2@127.0.0.1:1/vigil?sslmode=disable&connect_timeout=2",
		"postgres://vigil:hunter2@[::1/broken",
	} {
		_, err := daemon.New(context.Background(), daemon.Config{DB: db, Addr: "127.0.0.1:0"})
		require.Error(t, err, db)
		require.NotContains(t, err.Error(), "hunter2")
		require.True(t, strings.HasPrefix(err.Error(), "--db: "), err.Error())
	}
}

// /healthz reports a store that no longer answers.
func TestHealthzChecksTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := daemon.New(ctx, daemon.Config{DB: t.TempDir() + "/v.db", Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	d.Start(ctx)
	get := func() int {
		resp, err := http.Get(d.URL() + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())
	require.NoError(t, d.Store().Close())
	require.Equal(t, http.StatusServiceUnavailable, get())
	_ = d.Stop() // the store is already closed
}

// A client that never finishes its request does not make stopping fail.
func TestStopCutsOffLingeringRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := daemon.New(ctx, daemon.Config{DB: t.TempDir() + "/v.db", Addr: "127.0.0.1:0", ShutdownGrace: 50 * time.Millisecond})
	require.NoError(t, err)
	d.Start(ctx)
	conn, err := net.Dial("tcp", d.Addr())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"task"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the request has reached its handler
		resp, err := http.Get(d.URL() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, d.Stop())
}

func TestNonLoopbackNeedsAToken(t *testing.T) {
	t.Parallel()
	_, err := daemon.New(context.Background(), daemon.Config{DB: t.TempDir() + "/v.db", Addr: "0.0.0.0:0"})
	require.ErrorContains(t, err, "refusing to serve without --token-file")
	_, err = daemon.New(context.Background(), daemon.Config{DB: t.TempDir() + "/v.db", Addr: "127.0.0.1:0", TokenFile: "/nonexistent"})
	require.ErrorContains(t, err, "--token-file")
	srv := testserver.Start(t)
	resp, err := http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func lease5() lease.EnqueueParams { return lease.EnqueueParams{TaskType: "work"} }

func leaseList(status string) lease.ListParams { return lease.ListParams{Status: status, Limit: 1000} }

// With NoListen the services are wired to the store and no port is bound
// (vigil mcp); starting and stopping need no server.
func TestNoListenBindsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, err := daemon.New(ctx, daemon.Config{DB: t.TempDir() + "/v.db", NoListen: true})
	require.NoError(t, err)
	require.Empty(t, d.Addr())
	require.Empty(t, d.URL())
	_, err = d.Snapshot.Take(ctx)
	require.NoError(t, err, "the services work")
	d.Start(ctx)
	require.NoError(t, d.Stop())
}

// Listening on every interface, the server answers for its own names and
// addresses with its port, and for --allowed-host; not for the unspecified
// address nor any other name. Its URL for local clients (VIGIL_URL of
// `vigil up`'s agents) is a loopback one.
func TestEveryInterfaceListenAnswersForItsOwnNamesOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const token = "s3cret-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token), 0o600))
	d, err := daemon.New(ctx, daemon.Config{
		DB: t.TempDir() + "/v.db", Addr: "0.0.0.0:0", TokenFile: tokenFile, AllowedHosts: []string{"vigil.internal"},
		InsecureListen: true, // plain HTTP: this test is about Host
	})
	require.NoError(t, err)
	d.Start(ctx)
	t.Cleanup(func() { require.NoError(t, d.Stop()) })
	_, port, err := net.SplitHostPort(d.Addr())
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:"+port, d.URL())

	hostname, err := os.Hostname()
	require.NoError(t, err)
	want := map[string]int{
		"127.0.0.1:" + port:                      http.StatusOK,
		"localhost:" + port:                      http.StatusOK,
		net.JoinHostPort(hostname, port):         http.StatusOK,
		"vigil.internal":                         http.StatusOK,
		"0.0.0.0:" + port:                        http.StatusMisdirectedRequest,
		"[::]:" + port:                           http.StatusMisdirectedRequest,
		"attacker.example:" + port:               http.StatusMisdirectedRequest,
		net.JoinHostPort(hostname, "1"):          http.StatusMisdirectedRequest,
		net.JoinHostPort(hostname+".evil", port): http.StatusMisdirectedRequest,
	}
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		want[net.JoinHostPort(a.(*net.IPNet).IP.String(), port)] = http.StatusOK
	}
	for host, status := range want {
		req, err := http.NewRequestWithContext(ctx, "GET", d.URL()+"/v1/agents", nil)
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, status, resp.StatusCode, "Host %s", host)
	}
}
