package vigilclient

// Timing tests of the agent runtime's loops under testing/synctest: the
// bubble's fake clock makes every instant exact. The server here is an
// in-memory http.RoundTripper scripted per test, because a bubble must not
// use the network; the same behaviours run against a real server in
// agent_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// call is one request the fake server saw.
type call struct {
	at   time.Duration // since the bubble started
	path string
	end  time.Duration
}

// fakeAPI is a scripted server. handle answers one request with a status
// and JSON body; it may block on ctx.
type fakeAPI struct {
	start  time.Time
	handle func(ctx context.Context, path string, n int) (int, string)

	mu    sync.Mutex
	calls []call
	count map[string]int
}

func newFakeAPI(handle func(ctx context.Context, path string, n int) (int, string)) *fakeAPI {
	return &fakeAPI{start: time.Now(), handle: handle, count: map[string]int{}}
}

func (f *fakeAPI) RoundTrip(r *http.Request) (*http.Response, error) {
	path := r.URL.Path
	f.mu.Lock()
	f.count[path]++
	n := f.count[path]
	idx := len(f.calls)
	f.calls = append(f.calls, call{at: time.Since(f.start), path: path})
	f.mu.Unlock()

	status, body := f.handle(r.Context(), path, n)

	f.mu.Lock()
	f.calls[idx].end = time.Since(f.start)
	f.mu.Unlock()
	if status == 0 {
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader(body)), Header: http.Header{}, Request: r}, nil
}

// callsTo returns the calls whose path ends with suffix.
func (f *fakeAPI) callsTo(suffix string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if strings.HasSuffix(c.path, suffix) {
			out = append(out, c)
		}
	}
	return out
}

func registration(n int) (int, string) {
	return 201, fmt.Sprintf(`{"instance_id":"inst-%d","instance_token":"tok-%d","status":"alive"}`, n, n)
}

// taskJSON is a claimed task whose lease window is window, stamped with a
// server clock far from the bubble's: only the difference may count.
func taskJSON(epoch int64, window time.Duration) string {
	hb := time.Date(2031, 5, 1, 0, 0, 0, 0, time.UTC)
	return fmt.Sprintf(`{"task_id":7,"task_type":"work","status":"running","lease_epoch":%d,"last_heartbeat_at":%q,"lease_expires_at":%q,"payload":{}}`,
		epoch, hb.Format(time.RFC3339Nano), hb.Add(window).Format(time.RFC3339Nano))
}

const staleEpoch = `{"error":{"code":"stale_epoch","message":"task 7: stale lease epoch"}}`

// timedLog records each message with the bubble time it was logged at.
type timedLog struct {
	start time.Time
	mu    sync.Mutex
	msgs  []string
	at    map[string]time.Duration // first time each message was logged
}

func newTimedLog() *timedLog { return &timedLog{start: time.Now(), at: map[string]time.Duration{}} }

func (l *timedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *timedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *timedLog) WithGroup(string) slog.Handler            { return l }
func (l *timedLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	if _, ok := l.at[r.Message]; !ok {
		l.at[r.Message] = time.Since(l.start)
	}
	return nil
}

func (l *timedLog) when(msg string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.at[msg]
	return d, ok
}

func newTestAgent(t *testing.T, api *fakeAPI, logs *timedLog, s Settings, handlers map[string]Handler) *Agent {
	c, err := New([]string{"http://vigil.test"}, WithHTTPClient(&http.Client{Transport: api}))
	require.NoError(t, err)
	return &Agent{Kind: "k", Client: c, Settings: s, Handlers: handlers, Logger: slog.New(logs), Hostname: "h", PID: 1}
}

// startAgent runs a in the bubble and returns a stop function that cancels
// it and waits for Run.
func startAgent(t *testing.T, a *Agent) (stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

func TestSyncLivenessTicksAreIndependent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			switch {
			case path == "/v1/processes":
				return registration(n)
			case strings.HasSuffix(path, "/heartbeat") && n == 1:
				<-ctx.Done() // the first heartbeat hangs
				return 0, ""
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		a := newTestAgent(t, api, logs, Settings{LivenessInterval: 10 * time.Second}, nil)
		stop := startAgent(t, a)

		time.Sleep(35 * time.Second)
		synctest.Wait()
		beats := api.callsTo("/heartbeat")
		require.Len(t, beats, 3)
		require.Equal(t, []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second},
			[]time.Duration{beats[0].at, beats[1].at, beats[2].at}, "one tick every interval, hung call or not")
		require.Equal(t, 18*time.Second, beats[0].end, "the hung call is abandoned after 4/5 of the interval")
		_, fenced := logs.when("fenced: stopped claiming and cancelled the running handler; will re-register when the server answers")
		require.False(t, fenced, "one failed heartbeat is not a fence")

		require.NoError(t, stop())
		require.Len(t, api.callsTo("/exit"), 1)
	})
}

func TestSyncFenceThenReregister(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		down := false
		registered := 0 // successful registrations: inst-1, inst-2, …
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			mu.Lock()
			isDown := down
			if path == "/v1/processes" && (n == 1 || !isDown) {
				registered++
			}
			regN := registered
			mu.Unlock()
			switch {
			case path == "/v1/processes" && n == 1:
				return registration(regN)
			case isDown:
				return 503, `{"error":{"code":"internal","message":"partitioned"}}`
			case path == "/v1/processes":
				return registration(regN)
			case path == "/v1/tasks/claim" && n == 1:
				return 200, taskJSON(1, 5*time.Minute)
			case path == "/v1/tasks/claim":
				return 204, ""
			case strings.HasSuffix(path, "/tasks/7/heartbeat"):
				return 200, taskJSON(1, 5*time.Minute)
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		type cancelled struct {
			at    time.Duration
			cause error
		}
		got := make(chan cancelled, 1)
		start := time.Now()
		a := newTestAgent(t, api, logs, Settings{LivenessInterval: 10 * time.Second, HeartbeatInterval: 5 * time.Second, PollInterval: time.Second},
			map[string]Handler{"work": func(ctx context.Context, _ *Task) (any, error) {
				<-ctx.Done()
				got <- cancelled{time.Since(start), context.Cause(ctx)}
				return nil, context.Cause(ctx)
			}})
		stop := startAgent(t, a)
		synctest.Wait()
		require.Equal(t, "inst-1", a.InstanceID())

		time.Sleep(5 * time.Second)
		mu.Lock()
		down = true // from 5s on, nothing gets through
		mu.Unlock()

		c := <-got
		require.ErrorIs(t, c.cause, ErrFenced)
		require.Equal(t, 30*time.Second, c.at, "fenced exactly 3 × liveness interval after the registration was sent")

		time.Sleep(44*time.Second - time.Since(start))
		synctest.Wait()
		require.Equal(t, "inst-1", a.InstanceID(), "still fenced while the server is unreachable")
		// One re-registration attempt per tick once fenced: at 40s, and at
		// 30s too when that tick came after the fence timer.
		regs := api.callsTo("/v1/processes")
		require.Contains(t, []int{2, 3}, len(regs))
		require.Equal(t, 40*time.Second, regs[len(regs)-1].at)
		mu.Lock()
		down = false
		mu.Unlock()

		time.Sleep(51*time.Second - time.Since(start))
		synctest.Wait()
		require.Equal(t, "inst-2", a.InstanceID(), "re-registered at the 50s tick")
		exits := api.callsTo("/v1/processes/inst-1/exit")
		require.Len(t, exits, 1, "the fenced instance is marked exited")
		at, ok := logs.when("re-registered after fence; resuming")
		require.True(t, ok)
		require.Equal(t, 50*time.Second, at)

		// Claims resume under the new instance.
		nClaims := len(api.callsTo("/v1/tasks/claim"))
		time.Sleep(3 * time.Second)
		synctest.Wait()
		require.Greater(t, len(api.callsTo("/v1/tasks/claim")), nClaims)

		require.NoError(t, stop())
		require.Len(t, api.callsTo("/v1/processes/inst-2/exit"), 1)
	})
}

func TestSyncLeaseDeadlineCancelsTheHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			switch {
			case path == "/v1/processes":
				return registration(n)
			case path == "/v1/tasks/claim" && n == 1:
				return 200, taskJSON(1, time.Minute)
			case path == "/v1/tasks/claim":
				return 204, ""
			case strings.HasSuffix(path, "/tasks/7/complete"):
				return 409, staleEpoch
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		start := time.Now()
		var at time.Duration
		var cause error
		a := newTestAgent(t, api, logs, Settings{HeartbeatInterval: 100 * time.Second},
			map[string]Handler{"work": func(ctx context.Context, _ *Task) (any, error) {
				<-ctx.Done()
				at, cause = time.Since(start), context.Cause(ctx)
				return "late", nil
			}})
		stop := startAgent(t, a)

		time.Sleep(2 * time.Minute)
		synctest.Wait()
		require.ErrorIs(t, cause, ErrLeaseLost)
		require.Contains(t, cause.Error(), "no renewal accepted within the lease window of 1m0s")
		require.Equal(t, time.Minute, at, "the window from the server's answer, on the local clock")
		require.Len(t, api.callsTo("/tasks/7/heartbeat"), 0)
		require.Len(t, api.callsTo("/tasks/7/complete"), 1, "the outcome is still sent")
		refused, ok := logs.when("complete refused: lease lost (stale epoch)")
		require.True(t, ok)
		require.Equal(t, time.Minute, refused, "and not retried")
		require.NoError(t, stop())
	})
}

func TestSyncLeaseRenewalAndStaleEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			switch {
			case path == "/v1/processes":
				return registration(n)
			case path == "/v1/tasks/claim" && n == 1:
				return 200, taskJSON(3, time.Minute)
			case path == "/v1/tasks/claim":
				return 204, ""
			case strings.HasSuffix(path, "/tasks/7/heartbeat") && n <= 5:
				return 200, taskJSON(3, time.Minute) // renewed: the deadline moves on
			case strings.HasSuffix(path, "/tasks/7/heartbeat"), strings.HasSuffix(path, "/tasks/7/fail"):
				return 409, staleEpoch // reclaimed meanwhile
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		start := time.Now()
		var at time.Duration
		var cause error
		a := newTestAgent(t, api, logs, Settings{HeartbeatInterval: 20 * time.Second},
			map[string]Handler{"work": func(ctx context.Context, _ *Task) (any, error) {
				<-ctx.Done()
				at, cause = time.Since(start), context.Cause(ctx)
				return nil, errors.New("stopped")
			}})
		stop := startAgent(t, a)

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		require.ErrorIs(t, cause, ErrLeaseLost)
		require.Contains(t, cause.Error(), "stale epoch")
		require.Equal(t, 120*time.Second, at, "five renewals (20s…100s) kept it; the sixth was refused")
		require.Len(t, api.callsTo("/tasks/7/heartbeat"), 6, "no heartbeat after the lease is lost")
		_, ok := logs.when("fail refused: lease lost (stale epoch)")
		require.True(t, ok)
		require.NoError(t, stop())
	})
}

func TestSyncDrainAbandonsAHandlerThatIgnoresCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			switch {
			case path == "/v1/processes":
				return registration(n)
			case path == "/v1/tasks/claim" && n == 1:
				return 200, taskJSON(1, 5*time.Minute)
			case path == "/v1/tasks/claim":
				return 204, ""
			case strings.HasSuffix(path, "/tasks/7/heartbeat"):
				return 200, taskJSON(1, 5*time.Minute)
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		stubborn := make(chan struct{})
		handlerDone := make(chan struct{})
		defer func() { close(stubborn); <-handlerDone }() // let the abandoned handler end
		a := newTestAgent(t, api, logs, Settings{LivenessInterval: 10 * time.Second}, map[string]Handler{"work": func(ctx context.Context, _ *Task) (any, error) {
			defer close(handlerDone)
			<-stubborn // ignores ctx
			return nil, nil
		}})
		a.DrainGrace = 30 * time.Second
		stop := startAgent(t, a)

		time.Sleep(10 * time.Second)
		require.NoError(t, stop())
		// Stopped at 10s: 30s of grace, 5s more for the cancelled handler,
		// then release and exit.
		release := api.callsTo("/tasks/7/release")
		require.Len(t, release, 1)
		require.Equal(t, 45*time.Second, release[0].at)
		exit := api.callsTo("/exit")
		require.Len(t, exit, 1)
		require.Equal(t, 45*time.Second, exit[0].at)
		require.Len(t, api.callsTo("/tasks/7/complete"), 0)
		// Liveness and lease heartbeats went on while draining.
		require.Len(t, api.callsTo("/processes/inst-1/heartbeat"), 4, "at 10s…40s")
		require.Len(t, api.callsTo("/tasks/7/heartbeat"), 0, "the first lease heartbeat (60s) was not due")
		_, ok := logs.when("handler ignored cancellation; abandoning it")
		require.True(t, ok)

	})
}

// A handler cancelled because the agent can no longer vouch for its lease
// (the local deadline passed, e.g. after a freeze) may take a while to
// return; meanwhile the runtime keeps asking the server, which answers with
// its verdict: 409, the task was handed on.
func TestSyncLeaseKeepsAskingAfterTheLocalDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := newFakeAPI(func(ctx context.Context, path string, n int) (int, string) {
			switch {
			case path == "/v1/processes":
				return registration(n)
			case path == "/v1/tasks/claim" && n == 1:
				return 200, taskJSON(1, time.Minute)
			case path == "/v1/tasks/claim":
				return 204, ""
			case strings.HasSuffix(path, "/tasks/7/heartbeat") && n <= 3:
				<-ctx.Done() // the server does not answer in time
				return 0, ""
			case strings.HasSuffix(path, "/tasks/7/heartbeat"), strings.HasSuffix(path, "/tasks/7/complete"):
				return 409, staleEpoch
			default:
				return 200, `{}`
			}
		})
		logs := newTimedLog()
		start := time.Now()
		var at time.Duration
		var cause error
		a := newTestAgent(t, api, logs, Settings{HeartbeatInterval: 20 * time.Second},
			map[string]Handler{"work": func(ctx context.Context, _ *Task) (any, error) {
				<-ctx.Done()
				at, cause = time.Since(start), context.Cause(ctx)
				time.Sleep(30 * time.Second) // finishing up, ignoring the cancel
				return "late", nil
			}})
		stop := startAgent(t, a)

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		require.ErrorIs(t, cause, ErrLeaseLost)
		require.Contains(t, cause.Error(), "no renewal accepted")
		require.Equal(t, time.Minute, at)
		refused, ok := logs.when("lease heartbeat refused: stale epoch (the task was reclaimed or finished)")
		require.True(t, ok, "the runtime stopped asking the server after its local deadline")
		require.Equal(t, 80*time.Second, refused, "the first heartbeat after the deadline gets the verdict")
		require.Len(t, api.callsTo("/tasks/7/heartbeat"), 4, "no heartbeat after the verdict")
		completeRefused, ok := logs.when("complete refused: lease lost (stale epoch)")
		require.True(t, ok)
		require.Equal(t, 90*time.Second, completeRefused)
		require.NoError(t, stop())
	})
}
