package vigilclient_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vigil-fleet/vigil/internal/testserver"
	"github.com/vigil-fleet/vigil/vigilclient"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitTimeout guards every wait: conditions are expected far sooner.
const waitTimeout = 15 * time.Second

// testBundle is a real server and a client for it.
type testBundle struct {
	srv    *testserver.Server
	client *vigilclient.Client
	logs   *logSink
}

func setup(t *testing.T, opts ...testserver.Option) *testBundle {
	t.Helper()
	srv := testserver.Start(t, opts...)
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	client, err := vigilclient.New([]string{srv.URL}, vigilclient.WithHTTPClient(hc))
	require.NoError(t, err)
	logs := &logSink{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("agent logs:\n" + logs.dump())
		}
	})
	return &testBundle{srv: srv, client: client, logs: logs}
}

// waitFor checks cond every 10ms until it holds, failing the test after
// waitTimeout. It waits on a condition; it does not let time pass for it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// recv receives from ch or fails the test after waitTimeout.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// running is an Agent.Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // Run's result, set before done is closed
}

// wait waits for Run to return and gives its result.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	recv(t, "Agent.Run to return", r.done)
	return r.err
}

// stop cancels the agent's context and waits for Run to return.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	return r.wait(t)
}

// start runs a in the background until it has registered; the test's
// cleanup stops it.
func start(t *testing.T, a *vigilclient.Agent) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(waitTimeout):
			t.Error("Agent.Run did not return after cancel")
		}
	})
	waitFor(t, "the agent to register", func() bool { return a.InstanceID() != "" })
	return r
}

// logSink is a slog.Handler that keeps every record for assertions.
type logSink struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (s *logSink) logger() *slog.Logger { return slog.New(&sinkHandler{sink: s}) }

// has reports whether a record with msg and every given attr was logged.
func (s *logSink) has(msg string, attrs ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if r.msg != msg {
			continue
		}
		ok := true
		for i := 0; i+1 < len(attrs); i += 2 {
			if r.attrs[attrs[i]] != attrs[i+1] {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func (s *logSink) wait(t *testing.T, msg string, attrs ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("log %q %v", msg, attrs), func() bool { return s.has(msg, attrs...) })
}

func (s *logSink) dump() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, r := range s.records {
		keys := make([]string, 0, len(r.attrs))
		for k := range r.attrs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		fmt.Fprintf(&b, "%s %q", r.level, r.msg)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, r.attrs[k])
		}
		b.WriteString("\n")
	}
	return b.String()
}

type sinkHandler struct {
	sink  *logSink
	attrs []slog.Attr
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.Resolve().String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.sink.mu.Lock()
	h.sink.records = append(h.sink.records, rec)
	h.sink.mu.Unlock()
	return nil
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sinkHandler{sink: h.sink, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h *sinkHandler) WithGroup(string) slog.Handler { return h }
