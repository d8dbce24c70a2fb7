package httpapi_test

import (
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/dashboard"
	"github.com/vigil-fleet/vigil/internal/testserver"
)

// The page and its assets are served with a CSP that forbids anything from
// elsewhere, and without the token; the data behind them needs it.
func TestDashboardIsServedOfflineAndPublic(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token-0123456789\n"), 0o600))
	b := setup(t, testserver.WithTokenFile(tokenFile))

	for path, wantType := range map[string]string{
		"/": "text/html", "/assets/app.js": "javascript", "/assets/style.css": "text/css",
	} {
		req, err := http.NewRequest("GET", b.srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, resp.Header.Get("Content-Type"), wantType, path)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", path)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "connect-src 'self'", path)
	}
	require.Equal(t, http.StatusNotFound, b.do("GET", "/assets/nope.js", "").status)
	require.Equal(t, http.StatusUnauthorized, b.do("GET", "/v1/timeline", "").status, "the data needs the token")
	require.Equal(t, http.StatusUnauthorized, b.do("GET", "/nope", "").status, "only / and /assets/ are public")
	require.Equal(t, http.StatusOK, b.do("GET", "/v1/timeline", "", "Authorization", "Bearer s3cret-token-0123456789").status)
}

// No asset names another host: the dashboard runs offline (issue #7).
func TestDashboardAssetsLoadNothingFromElsewhere(t *testing.T) {
	t.Parallel()
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	err := fs.WalkDir(os.DirFS("../dashboard/assets"), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(filepath.Join("../dashboard/assets", path))
		require.NoError(t, err)
		for _, m := range external.FindAllString(string(data), -1) {
			require.Equal(t, "http://www.w3.org", m, "%s names another host: %s", path, m) // the SVG namespace is a name, not a fetch
		}
		return nil
	})
	require.NoError(t, err)
}

func TestTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.registerAgent("crawler")
	b.registerAgent("idle-one")
	start := b.clock.Now()
	in := b.register("crawler", 10)
	b.clock.Advance(time.Minute)
	require.Equal(t, http.StatusOK, b.do("POST", "/v1/processes/"+in.ID+"/exit", "", "X-Vigil-Instance-Token", in.Token).status)
	r := b.do("POST", "/v1/events", `{"agent":"crawler","kind":"exit","exit_code":2}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	b.clock.Advance(time.Minute)
	b.register("crawler", 600) // alive to the end: its window is 30 min
	r = b.do("POST", "/v1/agents/crawler/planned-stop", `{"reason":"deploy","ttl_s":600}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	b.clock.Advance(time.Minute)
	r = b.do("POST", "/v1/events", `{"agent":"crawler","kind":"exit","signal":"SIGTERM"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	stoppedAt := b.clock.Now().Add(30 * time.Second)
	b.clock.Advance(30 * time.Second)
	require.Equal(t, http.StatusOK, b.do("POST", "/v1/agents/idle-one/mark-stopped", "").status)
	b.clock.Advance(30 * time.Second)

	b.clock.Advance(1500 * time.Microsecond)

	r = b.do("GET", "/v1/timeline?window_s=3600", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var tl dashboard.Timeline
	r.decode(t, &tl)
	now := b.clock.Now().Truncate(time.Millisecond)
	require.True(t, tl.To.Equal(now), "to is the server's now, at the stores' millisecond precision")
	require.True(t, tl.From.Equal(now.Add(-time.Hour)))
	require.Len(t, tl.Agents, 2)
	crawler := tl.Agents[0]
	require.Equal(t, "crawler", crawler.Agent)
	require.True(t, crawler.RegisteredAt.Equal(start), "registered_at is the registry record's created_at")
	require.Len(t, crawler.Up, 2, "two lifetimes with a gap: %+v", crawler.Up)
	require.True(t, crawler.Up[0].From.Equal(start) && crawler.Up[0].To.Equal(start.Add(time.Minute)))
	require.True(t, crawler.Up[1].From.Equal(start.Add(2*time.Minute)) && crawler.Up[1].To.Equal(now))
	require.Len(t, crawler.Marks, 2)
	require.False(t, crawler.Marks[0].Suppressed)
	require.True(t, crawler.Marks[1].Suppressed, "the exit under the planned stop is marked suppressed")
	require.Len(t, crawler.PlannedStops, 1)
	require.True(t, crawler.PlannedStops[0].To.Equal(now), "clipped to the window's end")
	idle := tl.Agents[1]
	require.Equal(t, "idle-one", idle.Agent)
	require.Empty(t, idle.Up)
	require.NotNil(t, idle.Up, "encoded as [] not null")
	require.Len(t, idle.DeclaredStopped, 1, "declared stopped on purpose: drawn apart from down time")
	require.True(t, idle.DeclaredStopped[0].From.Equal(stoppedAt) && idle.DeclaredStopped[0].To.Equal(now))
	require.Empty(t, crawler.DeclaredStopped, "an active agent has none")

	for _, q := range []string{"window_s=0", "window_s=-1", "window_s=abc", "window_s=259201"} {
		r := b.do("GET", "/v1/timeline?"+q, "")
		require.Equal(t, http.StatusBadRequest, r.status, q)
		code, msg := r.errorCode(t)
		require.Equal(t, "invalid", code, q)
		require.True(t, strings.Contains(msg, "window_s"), "%s: %s", q, msg)
	}
}
