package vigilclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// outcomeFault sits between an agent and a real server and spoils its
// complete calls (single and batch): the first refuse of them are not
// forwarded, answered alternately by a connection error and by 503
// unavailable (a store outage); then, while dropAnswers is set, each is
// forwarded and applied by the server but its answer is replaced by an
// error, as when a connection breaks after the write.
type outcomeFault struct {
	next        http.RoundTripper
	refuse      int64
	dropAnswers int64

	seen, forwarded atomic.Int64
}

var errCut = errors.New("connection reset by peer (test fault)")

func (f *outcomeFault) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/complete") {
		return f.next.RoundTrip(r)
	}
	n := f.seen.Add(1)
	if n <= f.refuse {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		if n%2 == 1 {
			return nil, errCut
		}
		return &http.Response{
			StatusCode: http.StatusServiceUnavailable, Request: r,
			Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"2"}},
			Body:   io.NopCloser(strings.NewReader(`{"error":{"code":"unavailable","message":"the store is unavailable; retry later"}}`)),
		}, nil
	}
	f.forwarded.Add(1)
	resp, err := f.next.RoundTrip(r)
	if err == nil && n <= f.refuse+f.dropAnswers {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errCut // the server applied it; the answer is lost
	}
	return resp, err
}

// faultyAgent runs one handler returning {"n": task id} through fault,
// with a lease window (60s) far longer than any fault.
func faultyAgent(t *testing.T, b *testBundle, fault *outcomeFault, concurrency int) (*vigilclient.Agent, *vigiltype.Task) {
	t.Helper()
	fault.next = &http.Transport{}
	t.Cleanup(fault.next.(*http.Transport).CloseIdleConnections)
	client, err := vigilclient.New([]string{b.srv.URL}, vigilclient.WithHTTPClient(&http.Client{Transport: fault, Timeout: 10 * time.Second}))
	require.NoError(t, err)
	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work", LeaseTimeout: time.Minute})
	a := b.agent("faulty", map[string]vigilclient.Handler{
		"work": func(_ context.Context, task *vigilclient.Task) (any, error) {
			return map[string]int64{"n": task.TaskID}, nil
		},
	}, vigilclient.Settings{LivenessInterval: time.Second, HeartbeatInterval: time.Second, PollInterval: 50 * time.Millisecond})
	a.Client = client
	a.Concurrency = concurrency
	return a, task
}

// requireNoLeaseLost checks that the agent never took its lease for lost,
// nor gave up on its result.
func requireNoLeaseLost(t *testing.T, b *testBundle) {
	t.Helper()
	dump := b.logs.dump()
	for _, bad := range []string{"lease lost", "gave up", `"complete failed"`} {
		require.NotContains(t, dump, bad)
	}
}

// Issue #12 case 1 (the SDK half): a complete that cannot reach the server
// for longer than the old fixed budget (5 tries, ~4s) is kept and sent
// again while the lease may be valid; it is stored exactly once.
func TestAgentKeepsResultThroughOutage(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 2} { // single complete, and the batch completer
		t.Run(map[int]string{1: "single", 2: "batch"}[concurrency], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fault := &outcomeFault{refuse: 5} // the old runtime gave up after 5 tries (~4s)
			a, task := faultyAgent(t, b, fault, concurrency)
			start(t, a)

			waitFor(t, "the task to be completed", func() bool {
				return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted
			})
			done := b.task(t, task.TaskID)
			require.JSONEq(t, `{"n":`+id(task.TaskID)+`}`, string(done.Result))
			require.Equal(t, a.InstanceID(), *done.CompletedBy)
			require.EqualValues(t, 6, fault.seen.Load())
			require.EqualValues(t, 1, fault.forwarded.Load(), "stored by exactly one request")
			b.logs.wait(t, "completed", "attempts", "6")
			requireNoLeaseLost(t, b)
		})
	}
}

// Issue #12 case 6: a complete the server applied but whose answer was
// lost is sent again and answered 200 (complete is idempotent for the
// holder), not 409 stale_epoch with "lease lost".
func TestAgentRetriedCompleteWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 2} {
		t.Run(map[int]string{1: "single", 2: "batch"}[concurrency], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fault := &outcomeFault{dropAnswers: 1}
			a, task := faultyAgent(t, b, fault, concurrency)
			start(t, a)

			b.logs.wait(t, "completed", "attempts", "2")
			require.EqualValues(t, 2, fault.forwarded.Load())
			done := b.task(t, task.TaskID)
			require.Equal(t, vigiltype.TaskCompleted, done.Status)
			require.JSONEq(t, `{"n":`+id(task.TaskID)+`}`, string(done.Result))
			requireNoLeaseLost(t, b)
		})
	}
}

// fenceFault drops the answers of the first instance's liveness heartbeats
// (the server records them; the agent does not learn it, so it fences
// itself and re-registers) and, while holdCompletes is set, refuses every
// complete with a connection error.
type fenceFault struct {
	next          http.RoundTripper
	firstInstance atomic.Value // string
	holdCompletes atomic.Bool
}

func (f *fenceFault) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/complete") && f.holdCompletes.Load() {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, errCut
	}
	resp, err := f.next.RoundTrip(r)
	if first, _ := f.firstInstance.Load().(string); err == nil && first != "" &&
		r.URL.Path == "/v1/processes/"+first+"/heartbeat" {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil, errCut
	}
	return resp, err
}

// A fenced agent still delivers the result of a lease the server has not
// moved on: re-registering does not mark the old instance exited (which
// would let the reclaimer take the task at once) until that result is sent.
func TestFencedAgentDeliversResultBeforeMarkingItsInstanceExited(t *testing.T) {
	t.Parallel()
	b := setup(t, testserver.WithSweepInterval(time.Hour)) // the test runs reclaim passes itself
	fault := &fenceFault{next: &http.Transport{}}
	t.Cleanup(fault.next.(*http.Transport).CloseIdleConnections)
	fault.holdCompletes.Store(true)
	client, err := vigilclient.New([]string{b.srv.URL}, vigilclient.WithHTTPClient(&http.Client{Transport: fault, Timeout: 10 * time.Second}))
	require.NoError(t, err)

	task := b.enqueue(t, vigilclient.EnqueueParams{TaskType: "work", LeaseTimeout: time.Minute})
	started := make(chan struct{})
	a := b.agent("fenced", map[string]vigilclient.Handler{
		"work": func(ctx context.Context, task *vigilclient.Task) (any, error) {
			close(started)
			<-ctx.Done() // fenced; the result is still worth sending
			return map[string]string{"by": task.InstanceID}, nil
		},
	}, vigilclient.Settings{LivenessInterval: 200 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	a.Client = client
	start(t, a)
	first := a.InstanceID()
	recv(t, "the handler to start", started)
	fault.firstInstance.Store(first)

	// The agent resumes under a new instance only after re-registering
	// has dealt with the old one. The server still sees the old one alive
	// (its heartbeats landed) and not exited, so a reclaim pass leaves its
	// task alone.
	waitFor(t, "the agent to re-register", func() bool { return a.InstanceID() != first })
	require.Nil(t, b.process(t, first).ExitedAt, "the fenced instance was marked exited while its result was on its way")
	require.True(t, b.logs.has("fenced instance still holds leases; it is marked exited once their outcomes are sent"))
	n, err := b.srv.Lease.Reclaim(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)

	fault.holdCompletes.Store(false)
	waitFor(t, "the task to be completed", func() bool {
		return b.task(t, task.TaskID).Status == vigiltype.TaskCompleted
	})
	done := b.task(t, task.TaskID)
	require.Equal(t, first, *done.CompletedBy)
	require.Zero(t, done.Reclaims)
	waitFor(t, "the old instance to be marked exited", func() bool { return b.process(t, first).ExitedAt != nil })
}
